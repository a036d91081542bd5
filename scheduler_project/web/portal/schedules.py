"""Schedule pages: list, detail (versions, next occurrences, recent runs) and the actions pause,
resume, trigger now and backfill, each calling `runs.schedule_changes`."""


from django.contrib import messages
from django.http import HttpResponseNotAllowed
from django.shortcuts import redirect
from django.urls import reverse
from django.utils.html import format_html
from django.views.decorators.http import require_POST

from runs import schedule_changes
from runs.models import Run
from scheduler_project.web.access import actor_for, can, get_scoped, is_operator, portal_view, require, scope, visible_tenants
from scheduler_project.errors import ServiceError
from schedules import timeexpr
from schedules.occurrences import upcoming
from schedules.models import Schedule, ScheduleStatus
from schedules.services import rule_for
from scheduler_project.web.pagination import SCHEDULE_PAGES
from scheduler_project.web.portal.common import (WHEN_RANGE_TEXT, call_service, keyset_page, parse_uuid, parse_when,
                                                 render_view, service_message)

STATUS_FILTERS = {
    "active": {"status": ScheduleStatus.ACTIVE, "enabled": True},
    "paused": {"status": ScheduleStatus.ACTIVE, "enabled": False},
    "completed": {"status": ScheduleStatus.COMPLETED},
    "archived": {"status": ScheduleStatus.ARCHIVED},
}
PREVIEW_COUNT = 10


def _schedules(request):
    return scope(Schedule.objects.select_related("tenant", "current"), request.user)


@portal_view
def schedule_list(request):
    qs = _schedules(request)
    q = request.GET.get("q", "").strip()
    if q:
        as_id = parse_uuid(q)
        qs = qs.filter(id=as_id) if as_id else qs.filter(name__icontains=q)
    status = request.GET.get("status", "")
    if status in STATUS_FILTERS:
        qs = qs.filter(**STATUS_FILTERS[status])
    tenant = parse_uuid(request.GET.get("tenant"))
    if tenant:
        qs = qs.filter(tenant_id=tenant)
    page = keyset_page(SCHEDULE_PAGES, qs, request.GET.get("after"))
    return render_view(request, "schedules/list.html", {
        "page": page, "q": q, "status": status, "tenant": str(tenant or ""),
        "statuses": list(STATUS_FILTERS), "tenants": visible_tenants(request.user),
    }, partial="results")


def next_occurrences(schedule: Schedule, count: int = PREVIEW_COUNT) -> list:
    """The rule's next instants from the next one still to be made, with DST notes; dropped
    instants (a skipped local time under the `skip` policy) are listed and marked. None for a
    paused, completed or archived schedule."""
    if not schedule.current:
        return []
    try:
        return upcoming(schedule, rule_for(schedule.current, schedule.anchor_at), count)
    except timeexpr.ExpressionError:
        return []


def _detail_context(request, schedule):
    return {
        "schedule": schedule,
        "version": schedule.current,
        "versions": schedule.versions.order_by("-version"),
        "occurrences": next_occurrences(schedule),
        # run_schedule_time_idx: the newest runs of one schedule are an index range.
        "recent_runs": Run.objects.filter(schedule_id=schedule.id).order_by("-scheduled_time", "-id")[:20],
        "is_operator": is_operator(request.user),
        "can_operate": can(request.user, "operate_schedules", schedule.tenant_id),
    }


@portal_view
def schedule_detail(request, pk):
    schedule = get_scoped(_schedules(request), request.user, id=pk)
    return render_view(request, "schedules/detail.html", _detail_context(request, schedule), partial="actions")


def _action(service, success):
    @portal_view
    @require_POST
    def view(request, pk):
        schedule = get_scoped(_schedules(request), request.user, id=pk)
        require(request.user, "operate_schedules", schedule.tenant_id)
        ok, result = call_service(request, service, schedule, by=actor_for(request))
        if ok:
            messages.success(request, success(result))
        schedule = Schedule.objects.select_related("tenant", "current").get(id=schedule.id)
        if request.htmx:
            return render_view(request, "schedules/detail.html", _detail_context(request, schedule), partial="actions")
        return redirect("schedules-detail", pk=schedule.id)

    return view


schedule_pause = _action(schedule_changes.pause_schedule,
                         lambda s: "Paused. Runs that had not started were canceled; nothing new will be made.")
schedule_resume = _action(schedule_changes.resume_schedule,
                          lambda s: "Resumed. The paused interval is not replayed (use a backfill for that).")
schedule_trigger = _action(
    schedule_changes.trigger_schedule,
    lambda run: format_html('Triggered: run <a href="{}">{}</a> is ready now.', reverse("runs-detail", args=[run.id]), run.id),
)


@portal_view
def schedule_backfill(request, pk):
    """Three steps, so nothing is created by accident: the form (GET), the plan with its count
    (POST without confirm), and the backfill itself (POST with confirm)."""
    schedule = get_scoped(_schedules(request), request.user, id=pk)
    require(request.user, "operate_schedules", schedule.tenant_id)
    raw_start = request.POST.get("start") or request.GET.get("start")
    raw_end = request.POST.get("end") or request.GET.get("end")
    start, end = parse_when(raw_start), parse_when(raw_end)
    ctx = {"schedule": schedule, "start": start, "end": end, "plan": None}
    if request.method == "GET":
        return render_view(request, "schedules/backfill.html", ctx, partial="plan")
    if request.method != "POST":
        return HttpResponseNotAllowed(["GET", "POST"])
    if (raw_start and not start) or (raw_end and not end):
        messages.error(request, f"Give the start and the end as UTC date-times {WHEN_RANGE_TEXT}.")
        return render_view(request, "schedules/backfill.html", ctx, partial="plan", status=400)
    if not start or not end:
        messages.error(request, "Give both a start and an end (UTC).")
        return render_view(request, "schedules/backfill.html", ctx, partial="plan", status=400)
    if request.POST.get("confirm") != "yes":
        try:
            todo, total = schedule_changes.plan_backfill(schedule, start, end)
        except (ServiceError, timeexpr.ExpressionError) as e:
            messages.error(request, service_message(e) if isinstance(e, ServiceError) else str(e))
            return render_view(request, "schedules/backfill.html", ctx, partial="plan", status=400)
        ctx["plan"] = {"create": len(todo), "total": total, "existing": total - len(todo), "sample": todo[:10]}
        return render_view(request, "schedules/backfill.html", ctx, partial="plan")
    ok, made = call_service(request, schedule_changes.backfill_schedule, schedule, start=start, end=end,
                            by=actor_for(request))
    if ok:
        messages.success(request, f"Backfill made {made} run(s), ready now.")
        return redirect("schedules-detail", pk=schedule.id)
    return render_view(request, "schedules/backfill.html", ctx, partial="plan", status=400)
