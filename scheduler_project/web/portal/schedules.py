"""Schedule pages: list (with each schedule's recent outcomes), detail (versions, next occurrences,
recent runs, outcome history) and the actions pause, resume, trigger now and backfill, each calling
`runs.actions`. Creating and editing are in schedule_form.py."""


from django.contrib import messages
from django.http import HttpResponseNotAllowed
from django.shortcuts import redirect
from django.urls import reverse
from django.utils.html import format_html
from django.views.decorators.http import require_POST
from django_htmx.http import HttpResponseStopPolling

from dispatch.models import CostDimension, ScheduleActivity
from runs import actions
from runs.models import TERMINAL_STATES, Run
from scheduler_project.foundation.errors import ServiceError
from scheduler_project.web.access import (
    actor_for,
    can,
    get_scoped,
    is_operator,
    operable_tenant_ids,
    portal_view,
    require,
    scope,
    visible_tenants,
)
from scheduler_project.web.pagination import SCHEDULE_PAGES
from scheduler_project.web.portal.common import (
    WHEN_RANGE_TEXT,
    Confirm,
    FilterProblems,
    call_service,
    confirm_response,
    confirmed,
    keyset_page,
    parse_uuid,
    parse_when,
    render_view,
    service_message,
)
from scheduler_project.web.portal.display import headers_shown, plural, schedule_figures
from scheduler_project.web.portal.incidents import cost_windows
from schedules import timeexpr
from schedules.models import Schedule, ScheduleStatus
from schedules.occurrences import upcoming
from schedules.services import rule_for

STATUS_FILTERS = {
    "active": {"status": ScheduleStatus.ACTIVE, "enabled": True},
    "paused": {"status": ScheduleStatus.ACTIVE, "enabled": False},
    "completed": {"status": ScheduleStatus.COMPLETED},
    "archived": {"status": ScheduleStatus.ARCHIVED},
}
PREVIEW_COUNT = 10
RECENT_RUNS = 20


def _schedules(request):
    return scope(Schedule.objects.select_related("tenant", "current"), request.user)


def figures_for(schedules) -> dict:
    """{schedule id: ScheduleFigures} from the summary rows. Cost: primary-key lookups of the
    schedules shown."""
    rows = ScheduleActivity.objects.in_bulk([s.id for s in schedules])
    return {sid: schedule_figures(row) for sid, row in rows.items()}


@portal_view
def schedule_list(request):
    qs = _schedules(request)
    q = request.GET.get("q", "").strip()
    if q:
        as_id = parse_uuid(q)
        qs = qs.filter(id=as_id) if as_id else qs.filter(name__icontains=q)
    problems = FilterProblems()
    status = problems.choice(request.GET, "status", "Status", list(STATUS_FILTERS))
    if status:
        qs = qs.filter(**STATUS_FILTERS[status])
    tenant = problems.uuid(request.GET, "tenant", "Tenant")
    if tenant:
        qs = qs.filter(tenant_id=tenant)
    page = keyset_page(SCHEDULE_PAGES, qs.none() if problems else qs, request.GET.get("after"))
    figures = figures_for(page.rows)
    for s in page.rows:
        s.figures = figures.get(s.id)
    return render_view(request, "schedules/list.html", {
        "page": page, "q": q, "status": status, "tenant": str(tenant or ""), "filter_errors": problems,
        "statuses": list(STATUS_FILTERS), "tenants": visible_tenants(request.user),
        "can_create": operable_tenant_ids(request.user, "operate_schedules") != [],
    }, partial="results", status=400 if problems else 200)


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


def _recent_runs(schedule):
    # run_schedule_time_idx: the newest runs of one schedule are an index range.
    return list(Run.objects.filter(schedule_id=schedule.id).order_by("-scheduled_time", "-id")[:RECENT_RUNS])


def _detail_context(request, schedule, **extra):
    recent = _recent_runs(schedule)
    can_operate = can(request.user, "operate_schedules", schedule.tenant_id)
    return {
        "schedule": schedule,
        "version": schedule.current,
        "versions": schedule.versions.order_by("-version"),
        "occurrences": next_occurrences(schedule),
        "recent_runs": recent,
        "runs_live": any(r.state not in TERMINAL_STATES for r in recent),
        "figures": figures_for([schedule]).get(schedule.id),
        "headers": headers_shown(schedule.current.target_headers if schedule.current else {}, can_operate),
        "is_operator": is_operator(request.user),
        "can_operate": can_operate,
        **extra,
    }


@portal_view
def schedule_detail(request, pk):
    schedule = get_scoped(_schedules(request), request.user, id=pk)
    # The retry cost on the page itself only: the polled runs panel and the actions' fragments
    # never show it.
    cost = cost_windows(schedule.tenant_id, CostDimension.SCHEDULE, str(schedule.id))
    return render_view(request, "schedules/detail.html", _detail_context(request, schedule, retry_cost=cost),
                       partial="actions")


@portal_view
def schedule_runs(request, pk):
    """The "Recent runs" panel alone: polled while one of its runs is still ready or leased, and
    told to stop (286) once none is."""
    schedule = get_scoped(_schedules(request), request.user, id=pk)
    ctx = _detail_context(request, schedule)
    status = 200 if ctx["runs_live"] or not request.htmx else HttpResponseStopPolling.status_code
    return render_view(request, "schedules/detail.html", ctx, partial="recent_runs", status=status)


def _confirm_text(kind: str, schedule: Schedule) -> Confirm | None:
    name = schedule.name or "this schedule"
    if kind == "pause":
        return Confirm(
            title=f"Pause {name}?",
            text="Nothing new is made while it is paused, and its runs that have not started yet are canceled. "
                 "Runs already in flight finish. Resuming does not replay the paused interval.",
            action=reverse("schedules-pause", args=[schedule.id]), yes="Yes, pause it",
            back=reverse("schedules-detail", args=[schedule.id]), danger=True, target="schedule-actions")
    if kind == "trigger":
        return Confirm(
            title=f"Trigger {name} now?",
            text=f"One run is made, ready now: {schedule.current.target_method} {schedule.current.target_url} "
                 "is called once more, outside the schedule.",
            action=reverse("schedules-trigger", args=[schedule.id]), yes="Yes, trigger a run now",
            back=reverse("schedules-detail", args=[schedule.id]), target="schedule-actions")
    if kind == "archive":
        return Confirm(
            title=f"Archive {name}?",
            text="It makes no new runs from now on, and its runs that have not started yet are canceled. Runs "
                 "already in flight finish. Its history (versions, runs, audit) is kept. An archived schedule "
                 "cannot be resumed or edited: create a new one to start again.",
            action=reverse("schedules-archive", args=[schedule.id]), yes="Yes, archive it",
            back=reverse("schedules-detail", args=[schedule.id]), danger=True, target="schedule-actions")
    return None


def _action(service, success, *, confirm: str | None = None):
    @portal_view
    @require_POST
    def view(request, pk):
        schedule = get_scoped(_schedules(request), request.user, id=pk)
        require(request.user, "operate_schedules", schedule.tenant_id)
        # An archived schedule is refused by the service at once: nothing to confirm.
        if confirm and not confirmed(request) and schedule.status != ScheduleStatus.ARCHIVED:
            return confirm_response(request, _confirm_text(confirm, schedule), template="schedules/detail.html",
                                    partial="actions", context=_detail_context(request, schedule))
        ok, result = call_service(request, service, schedule, by=actor_for(request))
        if ok:
            messages.success(request, success(result))
        schedule = Schedule.objects.select_related("tenant", "current").get(id=schedule.id)
        if request.htmx:
            # The recent runs and next occurrences change too: sent along, out of band.
            return render_view(request, "schedules/detail.html", _detail_context(request, schedule, oob=True),
                               partial="action_result")
        return redirect("schedules-detail", pk=schedule.id)

    return view


schedule_pause = _action(actions.pause_schedule,
                         lambda s: "Paused. Runs that had not started were canceled; nothing new will be made.",
                         confirm="pause")
schedule_resume = _action(actions.resume_schedule,
                          lambda s: "Resumed. The paused interval is not replayed (use a backfill for that).")
schedule_archive = _action(
    actions.archive_schedule,
    lambda s: "Archived. Runs that had not started were canceled; nothing new will be made. The history is kept.",
    confirm="archive",
)
schedule_trigger = _action(
    actions.trigger_schedule,
    lambda run: format_html('Triggered: run <a href="{}">{}</a> is ready now.', reverse("runs-detail", args=[run.id]), run.id),
    confirm="trigger",
)


@portal_view
def schedule_backfill(request, pk):
    """Three steps, so nothing is created by accident: the form (GET), the plan with its count
    (POST without confirm), and the backfill itself (POST with confirm). A refused step answers
    400 with the plan panel and its message, which htmx swaps in too (base.html's htmx-config)."""
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
            todo, total = actions.plan_backfill(schedule, start, end)
        except (ServiceError, timeexpr.ExpressionError) as e:
            messages.error(request, service_message(e) if isinstance(e, ServiceError) else str(e))
            return render_view(request, "schedules/backfill.html", ctx, partial="plan", status=400)
        ctx["plan"] = {"create": len(todo), "total": total, "existing": total - len(todo), "sample": todo[:10]}
        return render_view(request, "schedules/backfill.html", ctx, partial="plan")
    ok, made = call_service(request, actions.backfill_schedule, schedule, start=start, end=end,
                            by=actor_for(request))
    if ok:
        messages.success(request, f"Backfill made {plural(made, 'run')}, ready now.")
        return redirect("schedules-detail", pk=schedule.id)
    return render_view(request, "schedules/backfill.html", ctx, partial="plan", status=400)
