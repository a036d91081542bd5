"""Run pages: the list (filtered, keyset-paginated, never counted) and the detail with its
attempt timeline and evidence; retry and cancel call `runs.actions`."""

from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_POST
from django_htmx.http import HttpResponseStopPolling

from runs import actions
from runs.models import TERMINAL_STATES, Run, RunState, with_history
from scheduler_project.foundation.errors import ValidationFailed
from scheduler_project.web.access import (
    actor_for,
    can,
    get_scoped,
    is_operator,
    portal_view,
    require,
    scope,
    visible_tenant_ids,
    visible_tenants,
)
from scheduler_project.web.pagination import RUN_PAGES, Page
from scheduler_project.web.portal import common
from scheduler_project.web.portal.common import (
    Confirm,
    FilterProblems,
    call_service,
    confirm_response,
    confirmed,
    keyset_page,
    parse_uuid,
    parse_when,
    render_view,
)
from scheduler_project.web.portal.display import headers_shown
from schedules.models import Schedule

# With more tenants than this in view, the per-tenant merge below stops paying for itself.
MERGE_MAX_TENANTS = 100


def _runs(request):
    return scope(Run.objects.all(), request.user)


def run_filters(params, qs):
    """The filters shared by the runs list and the dead-letter queue, read from `params` (a query
    string, or a bulk form that repeats one); returns (qs, values)."""
    values = {}
    state = params.get("state", "")
    if state in RunState.values:
        qs = qs.filter(state=state)
        values["state"] = state
    tenant = parse_uuid(params.get("tenant"))
    if tenant:
        qs = qs.filter(tenant_id=tenant)
        values["tenant"] = str(tenant)
    schedule = parse_uuid(params.get("schedule"))
    if schedule:
        qs = qs.filter(schedule_id=schedule)
        values["schedule"] = str(schedule)
    start, end = parse_when(params.get("from")), parse_when(params.get("to"))
    if start:
        qs = qs.filter(scheduled_time__gte=start)
        values["from"] = params["from"]
    if end:
        qs = qs.filter(scheduled_time__lt=end)
        values["to"] = params["to"]
    return qs, values


def filter_problems(params) -> FilterProblems:
    """The values of run_filters' parameters it cannot apply (run_filters leaves them out)."""
    problems = FilterProblems()
    problems.choice(params, "state", "State", RunState.values)
    problems.uuid(params, "tenant", "Tenant")
    problems.uuid(params, "schedule", "Schedule")
    problems.when(params, "from", "Scheduled from")
    problems.when(params, "to", "Scheduled to")
    return problems


def runs_page(qs, raw_cursor, tenant_ids, *, size: int | None = None) -> Page:
    """Newest first by (scheduled_time, id), keyset-paginated.

    The runs indexes lead with tenant or schedule. Filtered to one of them, the page is one range
    of that index. Across tenants, a plain ORDER BY ... LIMIT would sort the whole table, so each
    tenant's part is read from `run_tenant_time_idx` and the parts merged (Keyset.merged_page)."""
    size = size or common.PAGE_SIZE
    if tenant_ids is not None and len(tenant_ids) == 1:
        # One tenant in view (the only tenant there is, or a tenant user's one): the same rows,
        # read as one range of run_tenant_time_idx instead of a sort of every partition's runs
        # (bench/history.py: 45 ms on an empty history, 2.4 s over 700,000 runs).
        qs = qs.filter(tenant_id=tenant_ids[0])
    elif tenant_ids is not None and 1 < len(tenant_ids) <= MERGE_MAX_TENANTS:
        def load(pks):
            return qs.model.objects.select_related("tenant", "schedule", "version").in_bulk(pks)

        parts = [qs.filter(tenant_id=t) for t in tenant_ids]
        try:
            return RUN_PAGES.merged_page(parts, cursor=raw_cursor or None, limit=size, load=load)
        except ValidationFailed:
            return RUN_PAGES.merged_page(parts, limit=size, load=load)
    return keyset_page(RUN_PAGES, qs.select_related("tenant", "schedule", "version"), raw_cursor, size=size)


def _tenant_ids_for_merge(request, values):
    if "tenant" in values or "schedule" in values:
        return None
    ids = visible_tenant_ids(request.user)
    if ids is None:
        ids = list(visible_tenants(request.user).values_list("id", flat=True)[: MERGE_MAX_TENANTS + 1])
    return ids


@portal_view
def run_list(request):
    qs, values = run_filters(request.GET, _runs(request))
    problems = filter_problems(request.GET)
    page = Page([], None) if problems else runs_page(qs, request.GET.get("after"), _tenant_ids_for_merge(request, values))
    schedule = None
    if "schedule" in values:
        schedule = scope(Schedule.objects.all(), request.user).filter(id=values["schedule"]).first()
    return render_view(request, "runs/list.html", {
        "page": page, "f": values, "states": RunState.values, "tenants": visible_tenants(request.user),
        "schedule": schedule, "filter_errors": problems,
    }, partial="results", status=400 if problems else 200)


def _detail_context(request, run, **extra):
    can_operate = can(request.user, "operate_runs", run.tenant_id)
    return {
        "run": run,
        "attempts": run.attempt_list[::-1],
        "live": run.state not in TERMINAL_STATES,
        "can_retry": run.state in actions.RETRYABLE_FROM and can_operate,
        "can_cancel": run.state in actions.CANCELABLE_FROM and can_operate,
        "is_operator": is_operator(request.user),
        "start_lag": (run.first_started_at - run.scheduled_time).total_seconds() if run.first_started_at else None,
        "headers": headers_shown(run.version.target_headers, can(request.user, "operate_schedules", run.tenant_id)),
        **extra,
    }


def _load(request, pk):
    return with_history([get_scoped(Run.objects.select_related("tenant", "schedule", "version"), request.user, id=pk)])[0]


@portal_view
def run_detail(request, pk):
    run = _load(request, pk)
    ctx = _detail_context(request, run)
    if request.htmx and not ctx["live"]:
        # The run has ended: the poller gets its last update and stops (status 286).
        return render_view(request, "runs/detail.html", ctx, partial="live",
                           status=HttpResponseStopPolling.status_code)
    return render_view(request, "runs/detail.html", ctx, partial="live")


def _cancel_confirm(run) -> Confirm:
    return Confirm(
        title="Cancel this run?",
        text=("It will not be attempted again. A worker holding it abandons the call at its next heartbeat; the "
              "target may already have acted." if run.state == RunState.LEASED else
              "It will not be attempted (again); nothing is called."),
        action=reverse("runs-cancel", args=[run.id]), yes="Yes, cancel the run",
        back=reverse("runs-detail", args=[run.id]), danger=True, target="run-live")


def _run_action(service, success, *, confirm=None):
    @portal_view
    @require_POST
    def view(request, pk):
        run = _load(request, pk)
        require(request.user, "operate_runs", run.tenant_id)
        # A run the service would refuse (already ended) gets its message at once, not a question.
        if confirm and not confirmed(request) and run.state in actions.CANCELABLE_FROM:
            return confirm_response(request, confirm(run), template="runs/detail.html", partial="live",
                                    context=_detail_context(request, run, live=False))
        call_service(request, service, run, by=actor_for(request), success=success)
        if request.htmx:
            return render_view(request, "runs/detail.html", _detail_context(request, _load(request, pk)), partial="live")
        return redirect("runs-detail", pk=run.id)

    return view


run_retry = _run_action(actions.retry_run, "Retried: the run is ready now and keeps its id (idempotency key).")
run_cancel = _run_action(actions.cancel_run, "Canceled. A worker holding it abandons the call at its next heartbeat.",
                         confirm=_cancel_confirm)
