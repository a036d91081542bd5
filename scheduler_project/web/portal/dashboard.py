"""The operator dashboard: the figures from `runs.stats`, and the charts (charts.py), failing
targets and unknown outcomes (dispatch.activity_figures) from the pre-aggregated activity rows,
refreshed by a poller that checks a cheap fingerprint first and backs off while nothing changes."""

from django.shortcuts import render
from django_htmx.http import HttpResponseStopPolling

from dispatch.activity import counted_up_to
from dispatch.activity_figures import attempt_figures, failing_targets
from runs import retention, stats
from runs.models import RetentionPolicy
from scheduler_project.foundation.dbreplication import replication_status
from scheduler_project.web.access import is_operator, portal_view, visible_tenant_ids
from scheduler_project.web.portal import charts
from scheduler_project.web.portal.display import TimePrefs

# Seconds between checks: fast while things move, slower each time nothing did.
INTERVALS = (5, 10, 20, 30, 60)
# After this many unchanged checks in a row (about half an hour at the slowest step) the page
# stops polling and offers a button; a forgotten tab should not query the database all night.
STOP_AFTER_IDLE = 35


def _interval(idle: int) -> int:
    return INTERVALS[min(idle, len(INTERVALS) - 1)]


# Tenants with their own retention listed on an operator's dashboard (the rest keep the defaults).
RETENTION_OWN_SHOWN = 50


def _retention(tenant_ids, operator: bool):
    """What is kept and when the next removal is due (templates/runs/_retention.html), for the
    viewer's tenants: an operator sees the defaults, the tenants with their own policy and the
    storage figures; a tenant user the policy of their own tenants. Computed on page load only,
    not on each poll (runs.retention.status: a few catalog queries whatever the history's size)."""
    if operator:
        tenant_ids = list(RetentionPolicy.objects.order_by("tenant_id")
                          .values_list("tenant_id", flat=True)[:RETENTION_OWN_SHOWN])
    return retention.status(tenant_ids=tenant_ids)


def fingerprint(tenant_ids, live=None) -> str:
    """What a poll compares: runs.stats' fingerprint, and the activity loop's progress, which the
    charts, failing targets and unknown outcomes follow (they trail the attempts)."""
    return stats.fingerprint(tenant_ids=tenant_ids, live=live, also=counted_up_to())


def _figures(ctx, tenant_ids, request, live):
    d = stats.dashboard(tenant_ids=tenant_ids, live=live)
    s = charts.series(tenant_ids, d.now, ctx["range"])
    tz = TimePrefs.of(request).zone_for(None)
    ctx.update(d=d, failing=failing_targets(tenant_ids=tenant_ids, now=d.now),
               attempts=attempt_figures(tenant_ids=tenant_ids, now=d.now), series=s, outcome_chart=charts.outcome_chart(s, tz), lag_chart=charts.lag_chart(s, tz))


@portal_view
def dashboard(request):
    tenant_ids = visible_tenant_ids(request.user)
    # Counted once: the fingerprint and the figures both need them (the dead count follows the
    # size of the dead-letter queue).
    live = stats.live_counts(tenant_ids=tenant_ids)
    fp = fingerprint(tenant_ids, live)
    is_poll = request.htmx and "fp" in request.GET
    chart_range = request.GET.get("range") if request.GET.get("range") in charts.RANGES else charts.DEFAULT_RANGE
    ctx = {"fp": fp, "is_operator": is_operator(request.user), "idle": 0, "interval": INTERVALS[0],
           "range": chart_range, "ranges": list(charts.RANGES)}
    if is_poll:
        try:
            # The poller sends back what it was given; anything else (negative, huge) is clamped.
            idle = min(max(int(request.GET.get("idle", "0")), 0), STOP_AFTER_IDLE)
        except ValueError:
            idle = 0
        if request.GET["fp"] == fp:
            idle += 1
            ctx.update(idle=idle, interval=_interval(idle))
            if idle >= STOP_AFTER_IDLE:
                return render(request, "runs/dashboard.html#poller", {**ctx, "stopped": True},
                              status=HttpResponseStopPolling.status_code)
            # Nothing moved: only the poller is replaced (with a longer interval); the figures
            # are not recomputed.
            return render(request, "runs/dashboard.html#poller", ctx)
        _figures(ctx, tenant_ids, request, live)
        ctx["oob"] = True
        return render(request, "runs/dashboard.html#update", ctx)
    _figures(ctx, tenant_ids, request, live)
    if request.htmx and "range" in request.GET:
        # The range switch: the figures and a poller that keeps the new range.
        ctx["oob"] = True
        return render(request, "runs/dashboard.html#update", ctx)
    ctx["retention"] = _retention(tenant_ids, ctx["is_operator"])
    if ctx["is_operator"]:
        # On page load only: whether a failover now could lose the last commits.
        ctx["replication"] = replication_status()
    return render(request, "runs/dashboard.html", ctx)
