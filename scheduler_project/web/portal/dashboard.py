"""The operator dashboard: the figures from `runs.stats`, refreshed by a poller that checks a
cheap fingerprint first and backs off while nothing changes."""

from django.shortcuts import render
from django_htmx.http import HttpResponseStopPolling

from runs import stats
from scheduler_project.web.access import is_operator, portal_view, visible_tenant_ids

# Seconds between checks: fast while things move, slower each time nothing did.
INTERVALS = (5, 10, 20, 30, 60)
# After this many unchanged checks in a row (about half an hour at the slowest step) the page
# stops polling and offers a button; a forgotten tab should not query the database all night.
STOP_AFTER_IDLE = 35


def _interval(idle: int) -> int:
    return INTERVALS[min(idle, len(INTERVALS) - 1)]


@portal_view
def dashboard(request):
    tenant_ids = visible_tenant_ids(request.user)
    fp = stats.fingerprint(tenant_ids=tenant_ids)
    is_poll = request.htmx and "fp" in request.GET
    ctx = {"fp": fp, "is_operator": is_operator(request.user), "idle": 0, "interval": INTERVALS[0]}
    if is_poll:
        try:
            idle = int(request.GET.get("idle", "0"))
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
        ctx["d"] = stats.dashboard(tenant_ids=tenant_ids)
        ctx["oob"] = True
        return render(request, "runs/dashboard.html#update", ctx)
    ctx["d"] = stats.dashboard(tenant_ids=tenant_ids)
    return render(request, "runs/dashboard.html", ctx)
