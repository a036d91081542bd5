"""The run queue: the batched transitions of the dispatch loops, one entry point each.

- `materialise_due`   scanner: due schedules -> occurrence + run + outbox, next_run_at advanced
- `claim`             worker: ready runs -> leased, generation + 1, attempt opened
- `heartbeat`         worker: extend leases still owned; report the ones lost
- `complete`          worker: apply results, fenced by generation, in one transaction per batch
- `release_unstarted` worker shutdown: give claimed-but-not-started runs back without using an attempt
- `expire_leases`     reconciler: expired lease -> attempt unknown -> ready with backoff, or dead
- `skip_unclaimed_misfires`  reconciler: misfire policy for runs no worker claimed in time

Each opens its transaction, reads through the store, asks `runs.decisions` what to do, and has the
store apply it (`runs.store`: one class per database engine, chosen once). Every change a person
or client asks for (retry, cancel, pause, edit, ...) is in `runs.actions`.
"""

import itertools
import random
import time
from datetime import datetime, timedelta, timezone

from django.conf import settings
from django.db import transaction

from runs import decisions
from runs.decisions import (  # noqa: F401  (the queue's vocabulary, re-exported for its callers)
    BUFFERED_UNTIL,
    MAX_OCCURRENCES_PER_PASS,
    Claimed,
    Event,
    Result,
    ScanResult,
    VersionPolicy,
    backoff_seconds,
    build_run,
    event,
    next_state_after_failure,
    plan_schedule,
    retry_delay,
)
from runs.models import TERMINAL_STATES, EventKind, Reason, RunKind, RunState
from runs.store import store
from scheduler_project.foundation.dbclock import db_now
from scheduler_project.foundation.notify import RUNS_CHANNEL, notify
from schedules import timeexpr
from schedules.models import OverlapPolicy, ScheduleStatus
from schedules.occurrences import ONE_US  # noqa: F401


def write_events(events, now) -> None:
    """Every outbox event is written here, in the caller's transaction."""
    store().event_insert_many(events, now=now)


# --------------------------------------------------------------------------------------------
# scanner


def insert_runs(triples, now=None) -> list:
    """Insert occurrences, then runs and events for the occurrences that were new; returns the runs
    made. An occurrence that already exists (made by a backfill, or by a pass that crashed after
    committing) is left alone: the unique constraint decides, so there is never a second run."""
    if not triples:
        return []
    stamp = datetime.now(timezone.utc)
    made = store().run_insert_many(triples, stamp=stamp, now=now or stamp)
    kept = [t for t in triples if str(t[1].id) in made]
    for o, r, _ in kept:
        # As a save would have left them: saved, with the timestamps stored (a store that saves
        # through the ORM has set them; one that inserts by statement stored the stamp).
        o.created_at = o.created_at or stamp
        r.created_at = r.created_at or stamp
        o._state.adding = r._state.adding = False
        o._state.db = r._state.db = "default"
    _notify_if_due(kept)
    return [t[1] for t in kept]


def _notify_if_due(kept) -> None:
    """Wake idle workers when a run made here is eligible within a second."""
    soon = datetime.now(timezone.utc) + timedelta(seconds=1)
    if any(r.state == RunState.READY and r.next_eligible_at and r.next_eligible_at <= soon for _, r, _ in kept):
        notify(RUNS_CHANNEL)


def due_schedules(now, *, shards: int | None = None, shard=None, horizon=timedelta(0)):
    return store().schedule_due_query(now, shards=shards, shard=shard, horizon=horizon)


def seconds_until_next_due(*, horizon=timedelta(0)) -> float | None:
    """Seconds until the scanner has something to materialise (None when nothing is scheduled):
    the first schedule becoming due, or the first beyond the horizon entering it. Schedules
    already inside the horizon were materialised by the pass that just ran, except those that
    are not `allow`, which wait until they are due. Two probes of schedule_due_idx."""
    now = db_now()
    first = store().schedule_first_due()
    if first is None:
        return None
    soonest = (first - now).total_seconds()
    if horizon:
        beyond = store().schedule_first_due(after=now + horizon)
        if beyond is not None:
            soonest = min(soonest, (beyond - horizon - now).total_seconds())
    return soonest


# Positions in due order at which the look-ahead checks whether the scanner would fall behind,
# besides the last schedule in its window.
LOOKAHEAD_PROBES = (500, 2_000, 8_000, 32_000, 128_000)
# The window is counted up to this many schedules (one index-only range scan, bounded).
LOOKAHEAD_COUNT_CAP = 256_000


def lookahead_seconds(*, base: float, limit: float, rate: float, shards: int | None = None, shard=None) -> float:
    """How far ahead the scanner must materialise now so that a burst is ready before its
    instant: the whole window (`limit`) as soon as any part of it could not be made in time at
    `rate`, else 0 (the base horizon is enough).

    The k-th schedule due beyond the base horizon, due t_k seconds from now, can only be made in
    time if the k before it can be made first: k / rate <= t_k - base. Checked at a few positions
    k (each one probe of schedule_due_idx that reads k entries) and for the last schedule in the
    window (a bounded count). Once one fails, the whole window is made, not just up to that
    instant: a burst is then made as soon as it is seen, while its workers are still idle,
    instead of racing the instant with whatever CPU a burst leaves the scanner. Only `allow`
    schedules are made ahead (decisions.made_ahead), so others counted here only make the
    look-ahead start sooner."""
    now = db_now()
    beyond, until = now + timedelta(seconds=base), now + timedelta(seconds=limit)

    def behind(k: int, at) -> bool:
        return k / rate > (at - now).total_seconds() - base

    for k in LOOKAHEAD_PROBES:
        at = store().schedule_nth_due(now, k, beyond=beyond, until=until, shards=shards, shard=shard)
        if at is None:
            break
        if behind(k, at):
            return limit
    count, last = store().schedule_count_due(now, beyond=beyond, until=until, cap=LOOKAHEAD_COUNT_CAP, shards=shards,
                                             shard=shard)
    return limit if count and behind(count, last) else 0.0


# A schedule whose step failed unexpectedly is looked at again after this long, with the error on
# the schedule (its lastError) meanwhile.
SCAN_ERROR_RETRY = timedelta(minutes=5)
# A rule the time engine cannot evaluate within its work budget (or at all) is parked this long:
# evaluating it again costs that budget each time, and it takes the scanner's batch from others.
SCAN_PARK = timedelta(hours=1)


# A scanner whose oldest due schedule is this far past its instant is behind (in step, the oldest
# due is inside the horizon, ahead of now).
BEHIND = timedelta(seconds=1)


def _lock_due(now, *, batch: int, shards, shard, horizon) -> list:
    """The pass's schedules, locked: the oldest `batch` due. Behind, half of them are the oldest
    due and half the oldest due after those: otherwise a burst at one instant (a hundred thousand
    schedules at midnight, made late) holds back every schedule due after it, of every tenant,
    until the whole burst is made, and steady traffic that was on time becomes minutes late.
    Halved, the instants after the burst's are made at up to half the scanner's pace (more than
    they need while it keeps up with them; a pass with little of them left is short, so the
    burst gets the rest), and the burst goes on at the other half."""
    where = {"shards": shards, "shard": shard, "horizon": horizon}
    oldest = store().schedule_oldest_due(now, **where)
    if oldest is None or oldest >= now - BEHIND or batch < 2:
        return store().schedule_lock_due(now, batch=batch, **where)
    held = store().schedule_lock_due(now, batch=batch // 2, **where)
    if len(held) < batch // 2:
        return held  # no more is due (or free to take)
    held += store().schedule_lock_due(now, batch=batch - len(held), after=max(s.next_run_at for s in held), **where)
    if len(held) < batch:  # little is due after them: the rest of the batch goes on with the oldest
        held += store().schedule_lock_due(now, batch=batch - len(held), exclude={s.id for s in held}, **where)
    return held


def materialise_due(*, batch: int, shards=None, shard=None, horizon=timedelta(0)) -> ScanResult:
    """One scanner step: lock up to `batch` due schedules (skipping ones another scanner holds),
    turn their due occurrences into runs and advance next_run_at, all in one short transaction.

    The schedule row lock serialises everyone who inserts occurrences for a schedule (scanner,
    trigger, backfill, edits), and the occurrence unique constraint is the final guard: a
    duplicate aborts the transaction instead of making a second run. While partition DDL waits
    for the scanner's gate the pass makes nothing (result.stepped_aside)."""
    result = ScanResult()
    with transaction.atomic():
        now, admitted = store().schedule_scan_begin()
        if not admitted:
            result.stepped_aside = True
            return result
        schedules = _lock_due(now, batch=batch, shards=shards, shard=shard, horizon=horizon)
        result.locked = len(schedules)
        # Not due yet and not made ahead: their overlap policy is decided when they are due.
        schedules = [s for s in schedules if s.next_run_at <= now or decisions.made_ahead(s.current)]
        if not schedules:
            return result
        active = store().run_active_per_schedule([s.id for s in schedules if not decisions.made_ahead(s.current)])
        triples, changed = [], []
        for s in schedules:
            version = s.current
            try:
                planned, next_at, completed = plan_schedule(s, version, now, horizon, active)
            except timeexpr.ExpressionError as exc:
                # Parked with the reason on the schedule: the occurrences it misses meanwhile are
                # recorded under its misfire policy when it is looked at again.
                s.last_error = (f"parked until {(now + SCAN_PARK).isoformat(timespec='seconds')}: {exc}")[:2000]
                s.next_run_at = now + SCAN_PARK
                changed.append(s)
                result.errors.append((s.id, s.last_error))
                continue
            except Exception as exc:  # one bad row must not stop the scanner for everyone
                s.last_error = f"{type(exc).__name__}: {exc}"[:2000]
                s.next_run_at = now + SCAN_ERROR_RETRY
                changed.append(s)
                result.errors.append((s.id, s.last_error))
                continue
            for p in planned:
                triples.append(build_run(s, version, p.occ, state=p.state, reason=p.reason,
                                         eligible_at=p.eligible_at, kind=RunKind.SCHEDULED, now=now))
            s.next_run_at = next_at
            if completed:
                s.status, s.completed_at, s.next_run_at = ScheduleStatus.COMPLETED, now, None
            s.last_error = ""
            changed.append(s)
        for r in insert_runs(triples, now):
            if r.state == RunState.SKIPPED:
                result.skipped += 1
            else:
                result.runs += 1
        store().schedule_advance_many(changed, now=now)
        result.schedules = len(schedules)
    return result


# --------------------------------------------------------------------------------------------
# worker


class ClaimLimits:
    """Per-tenant in-flight caps and per-target (tenant, host) budgets, re-read every few seconds
    (an operator's change applies within that time)."""

    TTL = 5.0

    def __init__(self):
        self.loaded_at = -1e9
        self.tenant_caps: dict = {}
        self.host_caps: dict = {}

    def get(self):
        if time.monotonic() - self.loaded_at > self.TTL:
            self.tenant_caps, self.host_caps = store().tenant_claim_caps()
            self.loaded_at = time.monotonic()
        return self.tenant_caps, self.host_caps


_limits = ClaimLimits()
# Each process starts its rotation somewhere else, so a fleet's workers do not all begin their
# claims at the same tenant.
_rotation = itertools.count(random.randrange(1 << 16))


def idle_holding(slots: int | None = None) -> decisions.Holding:
    """A worker of `slots` slots (the configured size by default) holding nothing, under the
    configured default shares."""
    return decisions.Holding(slots or settings.SCHEDULER_WORKER_CONCURRENCY, settings.SCHEDULER_TENANT_SHARE,
                             settings.SCHEDULER_TARGET_SHARE)


def claim(worker_id: str, limit: int, *, lease_seconds: int | None = None,
          holding: decisions.Holding | None = None) -> list[Claimed]:
    """Lease up to `limit` ready, due runs in one short transaction: lock candidates with SKIP
    LOCKED (tenants in rotation, each with a share of the batch, within caps and budgets), bump
    the generation, set the lease from the database clock, open the attempt, write the event.

    Fair by default: `holding` is what the claiming worker has in flight, and no tenant, and no
    tenant's target host, is given more than its share of that worker's slots (SCHEDULER_TENANT_SHARE,
    SCHEDULER_TARGET_SHARE) unless an operator set an explicit cap, which then applies instead:
    a tenant's max_in_flight (counted across the fleet) replaces both shares for its calls, a
    target prefix's max_concurrency the target share for that tenant's calls to its host."""
    lease = timedelta(seconds=lease_seconds or settings.SCHEDULER_LEASE_SECONDS)
    holding = holding or idle_holding()
    with transaction.atomic():
        tenant_caps, host_caps = _limits.get()
        if not tenant_caps and not host_caps:
            return store().run_claim_due(worker=worker_id, limit=limit, lease_seconds=lease.total_seconds(),
                                         shift=next(_rotation), holding=holding)
        now = db_now()
        tenants = [t for t in store().run_due_tenants(now, max_tenants=10_000)
                   if t in tenant_caps or holding.tenant_room(t) > 0]
        tenants = decisions.rotate(tenants, next(_rotation))[:limit]
        if not tenants:
            return []
        # Explicit budgets are read across the fleet for the tenants with due runs before the
        # candidates, so that a full target's backlog is left out of the read.
        capped = [t for t in tenants if t in tenant_caps]
        budgeted = {k for k in host_caps if k[0] in set(tenants)}
        # A cap counts across the fleet: two workers that both read the same count before either
        # committed would both fill the room. Each claim holds its capped tenants and budgeted
        # hosts until it commits (never waiting: one another claim holds is given nothing here,
        # that claim serves it), so the counts below include every lease but this claim's own.
        if capped or budgeted:
            free = store().run_cap_locks(capped, budgeted)
            capped_out = [t for t in capped if t not in free]
            budgeted_out = {k for k in budgeted if k not in free}
        else:
            capped_out, budgeted_out = [], set()
        leased = store().run_leased_per_tenant(capped) if capped else {}
        leased.update({t: tenant_caps[t] for t in capped_out})
        leased_hosts = store().run_leased_per_host(budgeted) if budgeted else {}
        leased_hosts.update({k: host_caps[k] for k in budgeted_out})
        budget_room = {k: host_caps[k] - leased_hosts.get(k, 0) for k in budgeted}
        # An exempt tenant (explicit cap) is held to no default target share.
        held = {k: n for k, n in holding.hosts.items() if k[0] not in tenant_caps}
        # An explicit cap replaces the default share: counted across the fleet, as set. Known
        # before the read, so a tenant at its cap is left out of it and the others share its part.
        room = {t: holding.tenant_room(t) for t in tenants if t not in tenant_caps}
        room.update({t: tenant_caps[t] - leased.get(t, 0) for t in capped})
        tenants = [t for t in tenants if room[t] > 0]
        if not tenants:
            return []
        candidates = store().run_due_candidates(
            tenants, now, per_tenant=decisions.fair_share(limit, len(tenants)), room=room,
            without=decisions.full_targets(held, holding.host_cap, budgets=budget_room))
        ids = decisions.pick(
            candidates, limit,
            tenant_room=room,
            host_room=budget_room,
            target_room={k: holding.host_room(k) for k in holding.hosts},
            target_cap=holding.host_cap,
            exempt=tenant_caps.keys(),
        )
        return store().run_claim(ids, worker=worker_id, now=now, until=now + lease)


def seconds_until_next_ready(within: float) -> float | None:
    """Seconds until the earliest ready run becomes eligible, if that is within `within` seconds
    (None otherwise): the first entry of run_ready_idx, in the partitions that can hold it."""
    now = db_now()
    first = store().run_earliest_ready(until=now + timedelta(seconds=within))
    return None if first is None else (first - now).total_seconds()


def heartbeat(worker_id: str, keys: list[tuple], *, lease_seconds: int | None = None) -> set:
    """Extend the leases this worker still owns; returns the (run id, generation) pairs it has
    lost (canceled, expired and re-leased), whose calls the worker should abandon."""
    if not keys:
        return set()
    lease = lease_seconds or settings.SCHEDULER_LEASE_SECONDS
    with transaction.atomic():
        owned = store().run_extend_leases(keys, worker=worker_id, lease_seconds=float(lease))
    return set(keys) - owned


_policies: dict = {}


def version_policies(version_ids) -> dict:
    """Retry and overlap policy per schedule version. Versions never change, so each is read
    once per process."""
    if len(_policies) > 100_000:
        _policies.clear()
    missing = [v for v in version_ids if v not in _policies]
    if missing:
        _policies.update(store().version_policies_by_id(missing))
    return {v: _policies[v] for v in version_ids}


def complete(results: list[Result]) -> tuple[int, int]:
    """Apply a batch of results in one transaction. A result is applied only where the run is
    still leased at that generation; any other result is kept on its attempt as late evidence
    and changes nothing else. Returns (applied, fenced)."""
    if not results:
        return 0, 0
    policies = {}
    for r in results:
        c = r.claimed
        if c.policy and c.version_id not in policies:
            policies[c.version_id] = VersionPolicy(*c.policy)
    missing = {r.claimed.version_id for r in results} - policies.keys()
    if missing:
        policies.update(version_policies(missing))
    decided = [decisions.decide(r, policies[r.claimed.version_id]) for r in results]
    with transaction.atomic():
        applied, now = store().run_complete(decided)
        ended = {
            d.result.claimed.schedule_id
            for d in decided
            if d.terminal
            and policies[d.result.claimed.version_id].overlap == OverlapPolicy.BUFFER_ONE
            and (d.result.claimed.run_text, d.result.claimed.generation) in applied
        }
        if ended:
            store().run_release_buffered(ended, now=now)  # a run may be buffered behind one that just ended
    return len(applied), len(results) - len(applied)


def release_buffered(schedule_ids, now) -> int:
    """Overlap buffer_one: a schedule's earlier run ended, so its buffered run may start now."""
    return store().run_release_buffered(schedule_ids, now=now)


def release_unstarted(claims: list[Claimed]) -> int:
    """Shutdown: runs claimed but not yet called go straight back to ready. The attempt row stays
    (generations have no gaps) as `abandoned`, and does not count against the retry budget."""
    if not claims:
        return 0
    with transaction.atomic():
        return len(store().run_release_unstarted(claims, now=db_now()))


# --------------------------------------------------------------------------------------------
# reconciler


def expire_leases(*, batch: int = 500) -> int:
    """Leases past their end (database clock): the attempt's outcome is unknown (the target may
    or may not have acted), the run goes back to ready under the retry policy, or to dead."""
    with transaction.atomic():
        now = db_now()
        runs = store().run_lock_expired_leases(now, batch=batch)
        if not runs:
            return 0
        updates, events, ended = [], [], set()
        for r in runs:
            v = r.version
            state, eligible = next_state_after_failure(r.attempts_used, r.max_attempts, True,
                                                       v.backoff_base_seconds, v.backoff_max_seconds, now)
            updates.append((r.id, state, eligible, decisions.lease_expired_message(r.lease_owner)))
            if state in TERMINAL_STATES and v.overlap_policy == OverlapPolicy.BUFFER_ONE:
                ended.add(r.schedule_id)
            events.append(event(r.id, r.tenant_id, EventKind.LEASE_EXPIRED, generation=r.generation,
                                state=state, nextEligibleAt=decisions.iso(eligible)))
        store().attempt_mark_open_unknown(runs, now=now, error=decisions.LEASE_EXPIRED_ERROR)
        store().run_apply_updates(updates, now=now)
        write_events(events, now)
        if ended:
            store().run_release_buffered(ended, now=now)
    return len(runs)


# A misfire pass skips at most this many batches (each its own transaction) before it lets the
# reconciler loop run its other steps; it reports more work, so the loop comes straight back.
MISFIRE_BATCHES_PER_PASS = 20


def skip_unclaimed_misfires(*, batch: int = 1000, max_batches: int = MISFIRE_BATCHES_PER_PASS) -> int:
    """Misfire for occurrences that were materialised but never claimed within their grace (all
    workers down, a long backlog): the schedule's misfire policy decides which still run, the
    rest become `skipped` with reason misfire. Returns how many were skipped.

    Steps:
    1. Release buffered runs whose earlier run ended without releasing them (an operator cancel,
       a misfire skip, or a scanner that buffered a run while the earlier one was completing):
       nothing else would ever wake them.
    2. If the oldest unclaimed run is still within the smallest grace of any version, no run can
       have been missed: stop (two index probes, however long the backlog; a burst being worked
       off within its grace costs nothing here).
    3. Pick, over the whole missed set, the runs each schedule's policy does not keep
       (store.run_missed_beyond_policy). This reads the missed backlog once per pass, so one pass
       skips up to `max_batches` batches of what it found.
    4. Lock each batch of picked runs (SKIP LOCKED, re-checking they are still unclaimed) and skip
       them, one transaction per batch. Between 3 and 4 the set can only gain newer runs or lose
       ones a worker claimed; either way a picked run is still not among the latest to keep, or
       has been claimed and is left.
    """
    with transaction.atomic():
        now = db_now()
        buffered = store().run_buffered_schedules(now=now)
        if buffered:
            store().run_release_buffered(buffered, now=now)
    oldest = store().run_oldest_unclaimed(now)
    if oldest is None:
        return 0
    if oldest >= now - timedelta(seconds=store().version_least_misfire_grace()):
        return 0
    picked = store().run_missed_beyond_policy(now, limit=batch * max_batches)
    skipped = 0
    for i in range(0, len(picked), batch):
        with transaction.atomic():
            skipped += store().run_skip_unclaimed(picked[i:i + batch], now=db_now(), reason=Reason.MISFIRE)
    return skipped
