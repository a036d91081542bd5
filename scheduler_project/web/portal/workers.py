"""The workers page: which workers are alive, what each is calling right now, and why due runs
wait (no live worker, a tenant's in-flight cap, a target's concurrency budget, or only that the
workers have not got to them yet).

Every read is bounded by the live work, not the history:
- workers: `dispatch_workerstat`, one row per worker process seen in the last day (a small table;
  its rows are written every few seconds by each worker);
- in-flight calls: `run_leased_idx` (leased runs only), grouped by lease owner; the calls shown
  per worker are the longest-running few;
- the backlog: `run_ready_idx` up to now (ready runs already due), grouped by tenant and target
  host, the same grouping the claim uses for its caps.
Tenant users see their tenants' calls and backlog; the workers are shared, so they see those too
(their names and counts, not other tenants' work).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from django.db.models import Count, Min
from django_htmx.http import HttpResponseStopPolling

from dispatch.models import WorkerStat
from runs.models import Run, RunState
from runs.queue import idle_holding
from scheduler_project.foundation.dbclock import db_now
from scheduler_project.web.access import is_operator, portal_view, visible_tenant_ids
from scheduler_project.web.portal.common import render_view
from schedules.models import TargetPrefix, Tenant
from schedules.targets import target_host

# A worker writes its row every 5 s (dispatch.worker); one silent for longer than this is gone.
LIVE = timedelta(seconds=30)
SHOWN = timedelta(days=1)
MAX_WORKERS = 200
CALLS_SHOWN = 200
CALLS_PER_WORKER = 5
BACKLOG_GROUPS = 50


@dataclass
class WorkerRow:
    stat: WorkerStat
    live: bool
    in_flight: int = 0
    oldest_lease: object = None
    calls: list = field(default_factory=list)

    @property
    def more(self) -> int:
        return max(0, self.in_flight - len(self.calls))


@dataclass
class Waiting:
    tenant_id: object
    tenant: str
    host: str
    due: int
    oldest: object
    in_flight_tenant: int
    tenant_cap: int | None
    in_flight_host: int
    host_cap: int | None
    reasons: list = field(default_factory=list)


def _scoped(qs, tenant_ids):
    return qs if tenant_ids is None else qs.filter(tenant_id__in=tenant_ids)


def workers_context(tenant_ids, now):
    stats = list(WorkerStat.objects.filter(seen_at__gte=now - SHOWN).order_by("-seen_at")[:MAX_WORKERS])
    rows = {s.worker_id: WorkerRow(s, now - s.seen_at <= LIVE) for s in stats}
    leased = _scoped(Run.objects.filter(state=RunState.LEASED), tenant_ids)
    per_owner = leased.values_list("lease_owner").annotate(n=Count("id"), oldest=Min("first_started_at")).order_by()
    orphans = []
    for owner, n, oldest in per_owner:
        row = rows.get(owner)
        if row is None:
            orphans.append((owner, n))
            continue
        row.in_flight, row.oldest_lease = n, oldest
    calls = (leased.select_related("schedule", "tenant")
             .only("id", "lease_owner", "lease_until", "generation", "target_host", "scheduled_time",
                   "first_started_at", "schedule__name", "tenant__slug")
             .order_by("lease_until")[:CALLS_SHOWN])
    for run in calls:
        row = rows.get(run.lease_owner)
        if row is not None and len(row.calls) < CALLS_PER_WORKER:
            row.calls.append(run)
    live = [r for r in rows.values() if r.live]
    gone = [r for r in rows.values() if not r.live]
    return {"live": sorted(live, key=lambda r: r.stat.worker_id), "gone": gone, "orphans": orphans,
            "backlog": backlog(tenant_ids, now, any_live=bool(live), live_workers=[r.stat.worker_id for r in live]),
            "shares": idle_holding()}


def backlog(tenant_ids, now, *, any_live: bool, live_workers=()) -> list[Waiting]:
    """Due runs that no worker has claimed yet, per tenant and target host, with the reasons the
    claim would pass them over (docs/dispatch.md: caps and shares are checked at claim time). The
    default shares are per worker; a worker's slots are taken to be the configured size."""
    due = (_scoped(Run.objects.filter(state=RunState.READY, next_eligible_at__lte=now), tenant_ids)
           .values_list("tenant_id", "target_host").annotate(n=Count("id"), oldest=Min("next_eligible_at"))
           .order_by("-n")[:BACKLOG_GROUPS])
    due = list(due)
    if not due:
        return []
    tenant_set = {t for t, *_ in due}
    leased = Run.objects.filter(state=RunState.LEASED, tenant_id__in=tenant_set)
    per_tenant = dict(leased.values_list("tenant_id").annotate(n=Count("id")).order_by())
    per_host: dict = {}
    # Per live worker, what each tenant and each of its targets holds there (the default shares).
    on_worker: dict = {}
    live = set(live_workers)
    for owner, t, h, n in leased.values_list("lease_owner", "tenant_id", "target_host").annotate(n=Count("id")).order_by():
        per_host[(t, h)] = per_host.get((t, h), 0) + n
        if owner in live:
            w = on_worker.setdefault(owner, {})
            w[t] = w.get(t, 0) + n
            w[(t, h)] = w.get((t, h), 0) + n
    shares = idle_holding()
    tenants = {t.id: t for t in Tenant.objects.filter(id__in=tenant_set).only("id", "slug", "max_in_flight")}
    host_caps: dict = {}
    for tid, prefix, cap in TargetPrefix.objects.filter(tenant_id__in=tenant_set, max_concurrency__isnull=False) \
            .values_list("tenant_id", "prefix", "max_concurrency"):
        key = (tid, target_host(prefix))
        host_caps[key] = min(cap, host_caps.get(key, cap))
    out = []
    for tid, host, n, oldest in due:
        t = tenants.get(tid)
        w = Waiting(tid, t.slug if t else str(tid), host, n, oldest, per_tenant.get(tid, 0),
                    t.max_in_flight if t else None, per_host.get((tid, host), 0), host_caps.get((tid, host)))
        if not any_live:
            w.reasons.append("no live worker: start one (manage.py work) or check why they stopped")
        if w.tenant_cap is not None and w.in_flight_tenant >= w.tenant_cap:
            w.reasons.append(f"the tenant's cap: {w.in_flight_tenant} of {w.tenant_cap} runs in flight")
        if w.host_cap is not None and w.in_flight_host >= w.host_cap:
            w.reasons.append(f"the target's budget: {w.in_flight_host} of {w.host_cap} calls to {host} in flight")
        if live and w.tenant_cap is None:
            if all(on_worker.get(o, {}).get(tid, 0) >= shares.tenant_cap for o in live):
                w.reasons.append(f"the tenant's default share: it holds {shares.tenant_cap} of every live worker's "
                                 f"{shares.slots} slots ({shares.tenant_share:.0%}); an operator raises it with "
                                 "the tenant's Max runs in flight")
            elif w.host_cap is None and all(on_worker.get(o, {}).get((tid, host), 0) >= shares.host_cap for o in live):
                w.reasons.append(f"the target's default share: {shares.host_cap} of every live worker's "
                                 f"{shares.slots} slots hold calls to {host} ({shares.target_share:.0%})")
        if not w.reasons:
            waited = (now - oldest).total_seconds() if oldest else 0
            w.reasons.append("waiting for a worker's next claim" if waited < 5 else
                             "the workers are busy: every claim is full, or they are slower than runs fall due")
        out.append(w)
    return out


@portal_view
def workers(request):
    now = db_now()
    tenant_ids = visible_tenant_ids(request.user)
    ctx = {"now": now, "is_operator": is_operator(request.user), "live_seconds": int(LIVE.total_seconds()),
           **workers_context(tenant_ids, now)}
    idle = not ctx["live"] and not ctx["backlog"] and not ctx["orphans"]
    # A poll of a page with nothing to watch (no live worker, nothing due) stops (286).
    status = HttpResponseStopPolling.status_code if request.htmx and idle else 200
    ctx["polling"] = not idle
    return render_view(request, "dispatch/workers.html", ctx, partial="panel", status=status)
