"""The run queue: every batched transition of the dispatch loops lives here, in one module.

- `materialise_due`   scanner: due schedules -> occurrence + run + outbox, next_run_at advanced
- `claim`             worker: ready runs -> leased, generation + 1, attempt opened
- `heartbeat`         worker: extend leases still owned; report the ones lost
- `complete`          worker: apply results, fenced by generation, in one transaction per batch
- `release_unstarted` worker shutdown: give claimed-but-not-started runs back without using an attempt
- `expire_leases`     reconciler: expired lease -> attempt unknown -> ready with backoff, or dead

Single-run manual transitions (retry, cancel) are in `runs.services`.
"""

import itertools
import random
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from django.conf import settings
from django.db import connection, transaction
from django.db.models import (
    Case,
    Count,
    Min,
    CharField,
    DateTimeField,
    F,
    IntegerField,
    Q,
    TextField,
    Value,
    When,
    Window,
)
from django.db.models.functions import Mod, RowNumber

from runs import pgqueue
from runs.models import (
    TERMINAL_STATES,
    Attempt,
    AttemptOutcome,
    Occurrence,
    OutboxEvent,
    Reason,
    Run,
    RunKind,
    RunState,
)
from schedules import timeexpr
from schedules.models import Schedule, ScheduleStatus, ScheduleVersion, TargetPrefix, Tenant
from schedules.services import rule_for
from schedules.targets import target_host
from scheduler_project.dbclock import db_now
from scheduler_project.notify import RUNS_CHANNEL, notify

# A buffered run (overlap buffer_one) waits with this eligibility until the run before it ends.
BUFFERED_UNTIL = datetime(2999, 1, 1, tzinfo=timezone.utc)
# One pass never makes more than this many occurrences for one schedule (a long outage of an
# every-minute schedule is worked off over several passes instead of one huge transaction).
MAX_OCCURRENCES_PER_PASS = 10_000
ONE_US = timedelta(microseconds=1)


def backoff_seconds(attempt: int, base: float, cap: float) -> float:
    """Full jitter: uniform in [0, min(cap, base * 2**(attempt-1))]."""
    return random.uniform(0, min(cap, base * 2 ** (max(1, attempt) - 1)))


@dataclass(slots=True)
class Event:
    """An outbox event to write with `write_events` (a plain object: the hot paths make thousands
    a second, and a model instance costs several times more to build)."""

    run_id: object
    tenant_id: object
    kind: str
    payload: dict

    def model(self) -> OutboxEvent:
        return OutboxEvent(run_id=self.run_id, tenant_id=self.tenant_id, kind=self.kind, payload=self.payload)


def event(run_id, tenant_id, kind: str, **payload) -> Event:
    return Event(run_id, tenant_id, kind, {"runId": str(run_id), **payload})


def _iso(dt):
    return dt.astimezone(timezone.utc).isoformat().replace("+00:00", "Z") if dt else None


# --------------------------------------------------------------------------------------------
# scanner


@dataclass
class Planned:
    occ: timeexpr.Occurrence
    state: str  # ready | skipped
    reason: str = ""
    eligible_at: datetime | None = None


@dataclass
class ScanResult:
    locked: int = 0  # schedules the pass locked, including ones inside the horizon left for later
    schedules: int = 0  # schedules it materialised
    runs: int = 0
    skipped: int = 0
    errors: list = field(default_factory=list)


def _active_runs(schedule_ids) -> dict:
    """For overlap policies: per schedule, whether an earlier run is still leased or waiting to
    retry, and whether one is already buffered."""
    out = {}
    rows = Run.objects.filter(schedule_id__in=schedule_ids).filter(
        Q(state=RunState.LEASED) | Q(state=RunState.READY, generation__gt=0) | Q(state=RunState.READY, reason=Reason.BUFFERED)
    ).values_list("schedule_id", "state", "reason")
    for sid, state, reason in rows:
        busy, buffered = out.get(sid, (False, False))
        if reason == Reason.BUFFERED:
            buffered = True
        else:
            busy = True
        out[sid] = (busy, buffered)
    return out


def plan_schedule(schedule: Schedule, version: ScheduleVersion, now: datetime, horizon: timedelta, active) -> tuple:
    """Decide what each due occurrence of one schedule becomes.

    Returns (planned, next_run_at, completed). Steps, in this order because each depends on the
    one before:

    1. Collect the occurrences from next_run_at up to now (plus the horizon for schedules that
       allow overlap), stopping at endAt or when the rule has no more (completed).
    2. Split off the missed ones (older than the misfire grace) and keep the latest 0 / 1 /
       catchupLimit of them by policy. A pass cut short by MAX_OCCURRENCES_PER_PASS looks ahead
       so that what it keeps is the latest of the whole outage, not of its own chunk.
    3. Occurrences dropped by the DST policy become skipped runs (reason dst).
    4. The overlap policy decides among what is left to run; a run made earlier in this pass
       counts as running for the ones after it, so a catch-up never overlaps itself.

    Occurrences that are due but not missed (within the grace) always run, whatever the misfire
    policy: run_once after an outage gives the latest missed occurrence plus any on-time one.
    """
    rule = rule_for(version, schedule.anchor_at)
    # Overlap needs to see the earlier run's state when the occurrence is due, so only schedules
    # that allow overlap are materialised ahead of time.
    limit = now + (horizon if version.overlap_policy == "allow" else timedelta(0))
    grace_cut = now - timedelta(seconds=version.misfire_grace_seconds)
    due, next_at, completed, truncated = [], None, False, False
    occurrences = rule.iter_after(schedule.next_run_at - ONE_US)
    for occ in occurrences:
        if version.end_at and occ.at >= version.end_at:
            completed = True
            break
        if occ.at > limit:
            next_at = occ.at
            break
        due.append(occ)
        if len(due) >= MAX_OCCURRENCES_PER_PASS:
            next_at, truncated = occ.at + ONE_US, True
            break
    else:
        completed = True  # the rule has no more occurrences (a fired at(), an exhausted RRULE)

    missed = [o for o in due if o.at < grace_cut and not o.dropped]
    keep_missed = {
        "skip": 0,
        "run_once": 1,
        "catch_up": version.catchup_limit,
    }[version.misfire_policy]
    if truncated and keep_missed and missed and missed[-1] is due[-1]:
        # The outage goes on past this chunk; the next pass will keep the latest of what is left,
        # so this one keeps only what that remainder cannot supply. At most keep_missed steps.
        later = 0
        for occ in occurrences:
            if later >= keep_missed or occ.at >= grace_cut or (version.end_at and occ.at >= version.end_at):
                break
            later += 0 if occ.dropped else 1
        keep_missed -= later
    # max(0, ...): a limit larger than the outage must keep them all, not wrap to a negative index.
    run_missed = set(id(o) for o in missed[max(0, len(missed) - keep_missed) :]) if keep_missed > 0 else set()

    busy, buffered = active.get(schedule.id, (False, False))
    planned = []
    for occ in due:
        if occ.dropped:
            planned.append(Planned(occ, RunState.SKIPPED, Reason.DST))
            continue
        if occ.at < grace_cut and id(occ) not in run_missed:
            planned.append(Planned(occ, RunState.SKIPPED, Reason.MISFIRE))
            continue
        if version.overlap_policy != "allow" and busy:
            if version.overlap_policy == "buffer_one" and not buffered:
                buffered = True
                planned.append(Planned(occ, RunState.READY, Reason.BUFFERED, BUFFERED_UNTIL))
            else:
                planned.append(Planned(occ, RunState.SKIPPED, Reason.OVERLAP))
            continue
        planned.append(Planned(occ, RunState.READY, "", occ.at))
        if version.overlap_policy != "allow":
            busy = True  # a later occurrence of this pass overlaps the one just made
    return planned, next_at, completed


def build_run(schedule, version, occ: timeexpr.Occurrence, *, state, reason, eligible_at, kind, now):
    """Unsaved occurrence + run + its outbox event for one occurrence."""
    o = Occurrence(
        schedule_id=schedule.id,
        schedule_version=version.version,
        version=version,
        scheduled_time=occ.at,
        local_wall_time=occ.wall,
        local_time=occ.local.isoformat(),
        time_zone=version.time_zone,
        tzdata_version=timeexpr.tzdata_version(),
        note=(occ.note or "")[:200],
        kind=kind,
    )
    terminal = state in TERMINAL_STATES
    r = Run(
        occurrence=o,
        tenant_id=schedule.tenant_id,
        schedule_id=schedule.id,
        schedule_version=version.version,
        version=version,
        scheduled_time=occ.at,
        kind=kind,
        state=state,
        reason=reason,
        max_attempts=version.max_attempts,
        target_host=target_host(version.target_url),
        next_eligible_at=None if terminal else eligible_at,
        finished_at=now if terminal else None,
    )
    ev = event(
        r.id,
        schedule.tenant_id,
        f"run.{'created' if state == RunState.READY else state}",
        scheduleId=str(schedule.id),
        scheduleVersion=version.version,
        scheduledTime=_iso(occ.at),
        state=state,
        reason=reason or None,
    )
    return o, r, ev


def insert_runs(triples, now=None) -> list[Run]:
    """Insert occurrences, then runs and events for the occurrences that were new. An occurrence
    that already exists (made by a backfill, or by a pass that crashed after committing) is left
    alone: the unique constraint decides, so there is never a second run for it."""
    if not triples:
        return []
    if _pg():
        stamp = datetime.now(timezone.utc)
        made = pgqueue.insert_runs(triples, stamp=stamp, now=now or stamp)
        kept = [t for t in triples if str(t[1].id) in made]
        for o, r, _ in kept:
            # As bulk_create would have left them: saved, with their timestamps.
            o.created_at = r.created_at = r.updated_at = stamp
            o._state.adding = r._state.adding = False
            o._state.db = r._state.db = "default"
        _notify_if_due(kept)
        return [t[1] for t in kept]
    Occurrence.objects.bulk_create([t[0] for t in triples], batch_size=1000, ignore_conflicts=True)
    inserted = set(
        Occurrence.objects.filter(id__in=[t[0].id for t in triples]).values_list("id", flat=True)
    )
    kept = [t for t in triples if t[0].id in inserted]
    for _, r, _ in kept:
        r.occurrence_id = r.occurrence.id
    Run.objects.bulk_create([t[1] for t in kept], batch_size=1000)
    write_events([t[2] for t in kept], now or datetime.now(timezone.utc))
    _notify_if_due(kept)
    return [t[1] for t in kept]


def _notify_if_due(kept) -> None:
    """Wake idle workers when a run made here is eligible within a second."""
    soon = datetime.now(timezone.utc) + timedelta(seconds=1)
    if any(r.state == RunState.READY and r.next_eligible_at and r.next_eligible_at <= soon for _, r, _ in kept):
        notify(RUNS_CHANNEL)


def due_schedules(now, *, shards: int | None = None, shard=None, horizon=timedelta(0)):
    """Schedules with an occurrence due within the horizon, in the given shard(s) of `shards`,
    oldest first. One range scan on schedule_due_idx: cost follows what is due. (Only `allow`
    schedules are materialised ahead; the caller passes over the others until they are due.
    Filtering them here made the query an OR joined to the versions: 677 ms per batch of 500 at
    1,000,000 schedules, against well under a millisecond for the plain range.)"""
    qs = Schedule.objects.filter(next_run_at__lte=now + horizon, enabled=True, status=ScheduleStatus.ACTIVE)
    if shards:
        wanted = [shard] if isinstance(shard, int) else list(shard)
        qs = qs.annotate(_shard=Mod(F("shard"), shards)).filter(_shard__in=wanted)
    return qs.order_by("next_run_at")


def seconds_until_next_due(*, horizon=timedelta(0)) -> float | None:
    """Seconds until the scanner has something to materialise (None when nothing is scheduled):
    the first schedule becoming due, or the first beyond the horizon entering it. Schedules
    already inside the horizon were materialised by the pass that just ran, except those that
    are not `allow`, which wait until they are due. Cost: two probes of schedule_due_idx."""
    now = db_now()
    live = Schedule.objects.filter(enabled=True, status=ScheduleStatus.ACTIVE, next_run_at__isnull=False)
    first = live.order_by("next_run_at").values_list("next_run_at", flat=True).first()
    if first is None:
        return None
    soonest = (first - now).total_seconds()
    if horizon:
        beyond = (live.filter(next_run_at__gt=now + horizon).order_by("next_run_at")
                  .values_list("next_run_at", flat=True).first())
        if beyond is not None:
            soonest = min(soonest, (beyond - horizon - now).total_seconds())
    return soonest


# Positions in due order at which the look-ahead checks whether the scanner would fall behind.
# A burst past the last one is still caught: the look-ahead reaches the last probe's instant,
# and the next probe looks on from there.
LOOKAHEAD_PROBES = (500, 2_000, 8_000, 32_000, 128_000)


def lookahead_seconds(*, base: float, limit: float, rate: float, shards: int | None = None, shard=None) -> float:
    """How far ahead the scanner must materialise now so that a burst is ready before its
    instant; 0 when the base horizon is enough.

    The k-th schedule due beyond the base horizon, due t_k seconds from now, can only be made in
    time if the k before it can be made first: k / rate <= t_k - base. Checked at a few positions
    k, each one probe of schedule_due_idx that reads k entries (none past `limit` seconds ahead;
    it stops at the first position that is not there). Measured on the 1,000,000-schedule
    database of bench/scanner.py: 1.5-3 ms with 10,000 in the window, ~20 ms with all of them.
    The answer is the furthest t_k that fails it. Only `allow` schedules are made ahead
    (plan_schedule), so others counted here only make the look-ahead start sooner."""
    now = db_now()
    upcoming = (
        due_schedules(now, shards=shards, shard=shard, horizon=timedelta(seconds=limit))
        .filter(next_run_at__gt=now + timedelta(seconds=base))
        .values_list("next_run_at", flat=True)
    )
    ahead = 0.0
    for k in LOOKAHEAD_PROBES:
        at = upcoming[k - 1:k].first()
        if at is None:
            break
        left = (at - now).total_seconds()
        if k / rate > left - base:
            ahead = left
    return ahead


def materialise_due(*, batch: int, shards=None, shard=None, horizon=timedelta(0)) -> ScanResult:
    """One scanner step: lock up to `batch` due schedules (skipping ones another scanner holds),
    turn their due occurrences into runs and advance next_run_at, all in one short transaction.

    The schedule row lock serialises everyone who inserts occurrences for a schedule (scanner,
    trigger, backfill), and the occurrence unique constraint is the final guard: a duplicate
    aborts the transaction instead of making a second run."""
    result = ScanResult()
    with transaction.atomic():
        now = db_now()
        schedules = list(
            due_schedules(now, shards=shards, shard=shard, horizon=horizon)
            .select_for_update(skip_locked=True, of=("self",))
            .select_related("current")[:batch]
        )
        result.locked = len(schedules)
        # Not due yet and not `allow`: their overlap policy is decided when they are due.
        schedules = [s for s in schedules if s.next_run_at <= now or s.current.overlap_policy == "allow"]
        if not schedules:
            return result
        overlap_ids = [s.id for s in schedules if s.current.overlap_policy != "allow"]
        active = _active_runs(overlap_ids) if overlap_ids else {}
        triples, changed = [], []
        for s in schedules:
            version = s.current
            try:
                planned, next_at, completed = plan_schedule(s, version, now, horizon, active)
            except Exception as exc:  # one bad rule must not stop the scanner for everyone
                s.last_error = f"{type(exc).__name__}: {exc}"[:2000]
                s.next_run_at = now + timedelta(minutes=5)
                changed.append(s)
                result.errors.append((s.id, s.last_error))
                continue
            for p in planned:
                triples.append(
                    build_run(s, version, p.occ, state=p.state, reason=p.reason, eligible_at=p.eligible_at,
                              kind=RunKind.SCHEDULED, now=now)
                )
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
        if _pg():
            pgqueue.advance_schedules(changed, now=now)
        else:
            Schedule.objects.bulk_update(changed, ["next_run_at", "status", "completed_at", "last_error"], batch_size=1000)
        result.schedules = len(schedules)
    return result


# --------------------------------------------------------------------------------------------
# worker


@dataclass
class Claimed:
    """Everything a worker needs to call one run's target, taken at claim time."""

    run_id: object
    generation: int
    attempt_id: int
    attempts_used: int
    max_attempts: int
    tenant_id: object
    schedule_id: object
    schedule_version: int
    scheduled_time: datetime
    version_id: int
    # (url, method, headers JSON, timeout seconds, payload JSON text) of the version, when the
    # claim statement returned them (PostgreSQL), so the worker needs no second query.
    target: tuple | None = None
    # (backoff base, backoff max, overlap policy) of the version, likewise; complete() reads the
    # version for them otherwise.
    policy: tuple | None = None
    # The run and schedule ids and the scheduled time as the call's headers carry them, when
    # the claim statement returned them as text (formatting a UUID or a time in Python costs
    # more than the rest of building the headers).
    run_key: str = ""
    schedule_key: str = ""
    scheduled_iso: str = ""

    @property
    def run_text(self) -> str:
        return self.run_key or str(self.run_id)

    @property
    def schedule_text(self) -> str:
        return self.schedule_key or str(self.schedule_id)

    @property
    def scheduled_text(self) -> str:
        return self.scheduled_iso or _iso(self.scheduled_time)


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
            self.tenant_caps = dict(
                Tenant.objects.filter(max_in_flight__isnull=False).values_list("id", "max_in_flight")
            )
            host_caps = {}
            for tenant_id, prefix, cap in TargetPrefix.objects.filter(max_concurrency__isnull=False).values_list(
                "tenant_id", "prefix", "max_concurrency"
            ):
                key = (tenant_id, target_host(prefix))
                host_caps[key] = min(cap, host_caps.get(key, cap))
            self.host_caps = host_caps
            self.loaded_at = time.monotonic()
        return self.tenant_caps, self.host_caps


_limits = ClaimLimits()
# Each process starts its rotation somewhere else, so a fleet's workers do not all begin their
# claims at the same tenant.
_rotation = itertools.count(random.randrange(1 << 16))

def _candidates(now, limit: int) -> list[tuple]:
    """(run id, tenant id, target host) of due ready runs, locked, several per tenant, tenants
    in a rotating order so that no tenant is always served first."""
    if connection.vendor != "postgresql":
        # The embedded database has one writer at a time (IMMEDIATE transactions): no row locks,
        # and no fleet to be fair across; oldest first is enough.
        return list(
            Run.objects.filter(state=RunState.READY, next_eligible_at__lte=now)
            .order_by("next_eligible_at")
            .values_list("id", "tenant_id", "target_host")[: limit * 2]
        )
    with connection.cursor() as cur:
        cur.execute(pgqueue.DUE_TENANTS_SQL, {"now": now, "max_tenants": 10_000})
        tenants = [row[0] for row in cur.fetchall()]
        if not tenants:
            return []
        shift = next(_rotation) % len(tenants)
        tenants = (tenants[shift:] + tenants[:shift])[:limit]
        # Twice a fair share each, so capacity one tenant cannot use (caps, budgets, too few
        # runs) goes to the others in the same transaction.
        per_tenant = 2 * -(-limit // len(tenants))
        cur.execute(pgqueue.CANDIDATES_SQL, {"tenants": tenants, "now": now, "per_tenant": per_tenant})
        return cur.fetchall()


def seconds_until_next_ready() -> float | None:
    """Seconds until the earliest ready run becomes eligible (None when there is none).
    Cost: the first entry of run_ready_idx."""
    now = db_now()
    first = (
        Run.objects.filter(state=RunState.READY).order_by("next_eligible_at").values_list("next_eligible_at", flat=True).first()
    )
    return None if first is None else (first - now).total_seconds()


def _pick(candidates, limit: int) -> list:
    """Round-robin across tenants up to `limit`, within each tenant's in-flight cap and each
    (tenant, host) budget. Runs not picked stay ready: nothing claimed waits inside a worker."""
    tenant_caps, host_caps = _limits.get()
    by_tenant: dict = {}
    for row in candidates:
        by_tenant.setdefault(row[1], []).append(row)
    room_tenant, room_host = {}, {}
    capped = [t for t in by_tenant if t in tenant_caps]
    budgeted = {k for k in host_caps if k[0] in by_tenant}
    if capped:
        leased = dict(
            Run.objects.filter(state=RunState.LEASED, tenant_id__in=capped)
            .values_list("tenant_id").annotate(n=Count("id")).values_list("tenant_id", "n")
        )
        room_tenant = {t: tenant_caps[t] - leased.get(t, 0) for t in capped}
    if budgeted:
        rows = (
            Run.objects.filter(state=RunState.LEASED, tenant_id__in={k[0] for k in budgeted},
                               target_host__in={k[1] for k in budgeted})
            .values_list("tenant_id", "target_host").annotate(n=Count("id"))
        )
        leased_hosts = {(t, h): n for t, h, n in rows}
        room_host = {k: host_caps[k] - leased_hosts.get(k, 0) for k in budgeted}
    picked = []
    queues = [iter(v) for v in by_tenant.values()]
    while queues and len(picked) < limit:
        still = []
        for q in queues:
            for row in q:
                tenant, host = row[1], (row[1], row[2])
                if room_tenant.get(tenant, 1) <= 0:
                    break  # this tenant is at its cap: drop its queue
                if room_host.get(host, 1) <= 0:
                    continue  # this target is at its budget: try the tenant's next run
                picked.append(row[0])
                if tenant in room_tenant:
                    room_tenant[tenant] -= 1
                if host in room_host:
                    room_host[host] -= 1
                still.append(q)
                break
            if len(picked) >= limit:
                break
        queues = still
    return picked


def claim(worker_id: str, limit: int, *, lease_seconds: int | None = None) -> list[Claimed]:
    """Lease up to `limit` ready, due runs in one short transaction: lock candidates with SKIP
    LOCKED (tenants in rotation, each with a share of the batch, within caps and budgets), bump
    the generation, set the lease from the database clock, open the attempt, write the event."""
    lease = timedelta(seconds=lease_seconds or settings.SCHEDULER_LEASE_SECONDS)
    with transaction.atomic():
        if _pg() and not any(_limits.get()):
            # No tenant has a cap or a target budget: the same choice, made in one statement.
            rows = pgqueue.claim_due(worker=worker_id, limit=limit, lease_seconds=lease.total_seconds(),
                                     shift=next(_rotation))
            return [Claimed(*r) for r in rows]
        now = db_now()
        ids = _pick(_candidates(now, limit), limit)
        if not ids:
            return []
        if _pg():
            rows = pgqueue.claim(ids, worker=worker_id, now=now, until=now + lease)
            return [Claimed(*r) for r in rows]
        return _claim_orm(ids, worker_id, now, lease)


def _claim_orm(ids, worker_id, now, lease) -> list[Claimed]:
    """The claim's writes through the ORM (the embedded database); pgqueue.CLAIM_SQL on PostgreSQL."""
    Run.objects.filter(id__in=ids).update(
        state=RunState.LEASED,
        generation=F("generation") + 1,
        attempts_used=F("attempts_used") + 1,
        lease_until=now + lease,
        lease_owner=worker_id,
        reason="",
        next_eligible_at=None,
        first_started_at=Case(
            When(first_started_at__isnull=True, then=Value(now)), default=F("first_started_at"), output_field=DateTimeField()
        ),
    )
    rows = list(
        Run.objects.filter(id__in=ids).values_list(
            "id", "generation", "attempts_used", "max_attempts", "tenant_id", "schedule_id",
            "schedule_version", "scheduled_time", "version_id",
        )
    )
    attempts = Attempt.objects.bulk_create(
        [Attempt(run_id=r[0], generation=r[1], worker_id=worker_id, started_at=now) for r in rows]
    )
    write_events([event(r[0], r[4], "run.leased", generation=r[1], workerId=worker_id, state="leased") for r in rows], now)
    return [Claimed(r[0], r[1], a.id, r[2], r[3], r[4], r[5], r[6], r[7], r[8]) for r, a in zip(rows, attempts)]


def _pg() -> bool:
    return connection.vendor == "postgresql"


def write_events(events, now) -> None:
    """Every outbox event is written here, in the caller's transaction."""
    if _pg():
        pgqueue.insert_events(events, now=now)
    else:
        # As the PostgreSQL statements do (pgqueue._published_at): a tenant without a webhook has
        # nobody to deliver to, so its events are written published.
        silent = {str(t) for t in Tenant.objects.filter(id__in={e.tenant_id for e in events}, notification_url="")
                  .values_list("id", flat=True)}
        models = [e.model() for e in events]
        for m in models:
            if str(m.tenant_id) in silent:
                m.published_at = now
        OutboxEvent.objects.bulk_create(models)


def _owned(keys, worker_id=None):
    """Filter for runs still leased at the given (run id, generation) pairs."""
    cond = Q()
    for run_id, gen in keys:
        cond |= Q(id=run_id, generation=gen)
    qs = Run.objects.filter(cond, state=RunState.LEASED)
    if worker_id:
        qs = qs.filter(lease_owner=worker_id)
    return qs


def heartbeat(worker_id: str, keys: list[tuple], *, lease_seconds: int | None = None) -> set:
    """Extend the leases this worker still owns; returns the (run id, generation) pairs it has
    lost (canceled, expired and re-leased), whose calls the worker should abandon."""
    if not keys:
        return set()
    lease = timedelta(seconds=lease_seconds or settings.SCHEDULER_LEASE_SECONDS)
    with transaction.atomic():
        if _pg():
            owned = pgqueue.extend_leases(keys, worker=worker_id, lease_seconds=lease.total_seconds())
        else:
            now = db_now()
            owned = set(_owned(keys, worker_id).select_for_update().values_list("id", "generation"))
            if owned:
                _owned(owned, worker_id).update(lease_until=now + lease)
    return set(keys) - owned


@dataclass
class Result:
    """What one attempt's call produced, as the worker reports it."""

    claimed: Claimed
    outcome: str  # succeeded | failed | unknown (no answer after the request went out)
    retryable: bool = False
    http_status: int | None = None
    error_class: str = ""
    error: str = ""
    response_excerpt: str = ""
    latency_ms: int | None = None
    remote_address: str = ""
    retry_after: float | None = None

    def evidence(self) -> dict:
        return {
            "outcome": self.outcome,
            "httpStatus": self.http_status,
            "errorClass": self.error_class or None,
            "error": self.error or None,
            "latencyMs": self.latency_ms,
        }


def retry_delay(attempts_used, max_attempts, retryable, base, cap, retry_after=None) -> float | None:
    """Seconds until a failed or unknown attempt's run is retried, or None when it is dead."""
    if not retryable or attempts_used >= max_attempts:
        return None
    delay = backoff_seconds(attempts_used, base, cap)
    if retry_after:
        delay = max(delay, min(retry_after, 3600.0))
    return delay


def next_state_after_failure(attempts_used, max_attempts, retryable, base, cap, now, retry_after=None):
    """(state, next_eligible_at) for a failed or unknown attempt under the retry policy."""
    delay = retry_delay(attempts_used, max_attempts, retryable, base, cap, retry_after)
    if delay is None:
        return RunState.DEAD, None
    return RunState.READY, now + timedelta(seconds=delay)


def complete(results: list[Result]) -> tuple[int, int]:
    """Apply a batch of results in one transaction. A result is applied only where the run is
    still leased at that generation; any other result is kept on its attempt as late evidence
    and changes nothing else. Returns (applied, fenced).

    The next state is decided from what the claim returned (attempts used, retry budget): while
    the generation holds the lease nobody else can change those, and where it no longer holds,
    the decision is discarded by the fenced write."""
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
    decided = []
    for r in results:
        c = r.claimed
        if r.outcome == AttemptOutcome.SUCCEEDED:
            decided.append((r, RunState.SUCCEEDED, None))
            continue
        p = policies[c.version_id]
        delay = retry_delay(c.attempts_used, c.max_attempts, r.retryable, p.backoff_base, p.backoff_max, r.retry_after)
        decided.append((r, RunState.DEAD if delay is None else RunState.READY, delay))
    with transaction.atomic():
        if _pg():
            applied, now = pgqueue.complete(decided)  # (run id text, generation) pairs
        else:
            owned, now = _complete_orm(decided)
            applied = {(str(run_id), gen) for run_id, gen in owned}
        ended = {
            r.claimed.schedule_id
            for r, state, _ in decided
            if state in TERMINAL_STATES
            and policies[r.claimed.version_id].overlap == "buffer_one"
            and (r.claimed.run_text, r.claimed.generation) in applied
        }
        if ended:
            release_buffered(ended, now)  # a run may be buffered behind one that just ended
    return len(applied), len(results) - len(applied)


def _complete_orm(decided) -> tuple[set, datetime]:
    """complete()'s writes through the ORM (the embedded database); pgqueue.COMPLETE_SQL on PostgreSQL."""
    now = db_now()
    keys = [(r.claimed.run_id, r.claimed.generation) for r, _, _ in decided]
    owned = set(_owned(keys).select_for_update().values_list("id", "generation"))
    finished, late, run_updates, events = [], [], [], []
    for r, state, delay in decided:
        c = r.claimed
        if (c.run_id, c.generation) not in owned:
            late.append((c.attempt_id, {**r.evidence(), "receivedAt": _iso(now)}))
            continue
        eligible = now + timedelta(seconds=delay) if state == RunState.READY else None
        finished.append((c.attempt_id, r.outcome, r.http_status, r.error_class[:100], r.error[:2000],
                         r.response_excerpt, r.latency_ms, r.remote_address or ""))
        run_updates.append((c.run_id, state, eligible, r.error or (f"HTTP {r.http_status}" if r.http_status else "")))
        events.append(
            event(c.run_id, c.tenant_id, f"run.{'retry_scheduled' if state == RunState.READY else state}",
                  generation=c.generation, state=state, nextEligibleAt=_iso(eligible), **r.evidence())
        )
    _finish_attempts_orm(finished, late, now)
    _apply_run_updates(run_updates, now)
    write_events(events, now)
    return owned, now


@dataclass(frozen=True)
class VersionPolicy:
    backoff_base: float
    backoff_max: float
    overlap: str


_policies: dict = {}


def version_policies(version_ids) -> dict:
    """Retry and overlap policy per schedule version. Versions never change, so each is read
    once per process."""
    if len(_policies) > 100_000:
        _policies.clear()
    missing = [v for v in version_ids if v not in _policies]
    if missing:
        for vid, base, cap, overlap in ScheduleVersion.objects.filter(id__in=missing).values_list(
            "id", "backoff_base_seconds", "backoff_max_seconds", "overlap_policy"
        ):
            _policies[vid] = VersionPolicy(base, cap, overlap)
    return {v: _policies[v] for v in version_ids}


def _finish_attempts_orm(finished, late, now) -> None:
    """complete()'s attempt writes through the ORM (the embedded database)."""
    attempts = {a.id: a for a in Attempt.objects.filter(id__in=[f[0] for f in finished] + [x[0] for x in late])}
    for aid, outcome, status, error_class, error, excerpt, latency, remote in finished:
        a = attempts[aid]
        a.outcome, a.finished_at, a.http_status, a.error_class = outcome, now, status, error_class
        a.error, a.response_excerpt, a.latency_ms, a.remote_address = error, excerpt, latency, remote
    for aid, result in late:
        attempts[aid].late_result = result
    Attempt.objects.bulk_update(
        list(attempts.values()),
        ["outcome", "finished_at", "http_status", "error_class", "error", "response_excerpt", "latency_ms",
         "remote_address", "late_result"],
    )


def _apply_run_updates(updates, now) -> None:
    """One UPDATE for a batch of (run id, new state, next_eligible_at, error) decisions made while
    the rows are locked."""
    if not updates:
        return
    ids = [u[0] for u in updates]
    state_case = Case(*[When(id=u[0], then=Value(u[1])) for u in updates], output_field=CharField())
    eligible_case = Case(
        *[When(id=u[0], then=Value(u[2])) for u in updates if u[2]], default=Value(None), output_field=DateTimeField()
    )
    error_case = Case(*[When(id=u[0], then=Value(u[3])) for u in updates], default=F("last_error"), output_field=TextField())
    terminal = [u[0] for u in updates if u[1] in TERMINAL_STATES]
    Run.objects.filter(id__in=ids).update(
        state=state_case,
        next_eligible_at=eligible_case,
        lease_until=None,
        lease_owner="",
        last_error=error_case,
        finished_at=Case(When(id__in=terminal, then=Value(now)), default=Value(None), output_field=DateTimeField())
        if terminal
        else None,
    )


def release_buffered(schedule_ids, now) -> int:
    """Overlap buffer_one: a schedule's earlier run ended, so its buffered run may start now.

    A schedule is still busy while any other run of it is leased or ready (about to start, or
    waiting to retry); its buffered run then waits on. Rows another transaction holds are left
    for the next call (the reconciler sweeps every pass), so this never waits on a lock. The
    released run's eligibility is now, which is also where its misfire grace starts."""
    schedule_ids = set(schedule_ids)
    busy = set(
        Run.objects.filter(schedule_id__in=schedule_ids, state__in=[RunState.LEASED, RunState.READY])
        .exclude(reason=Reason.BUFFERED)
        .values_list("schedule_id", flat=True)
    )
    free = schedule_ids - busy
    if not free:
        return 0
    rows = list(
        Run.objects.filter(schedule_id__in=free, state=RunState.READY, reason=Reason.BUFFERED)
        .select_for_update(skip_locked=True)
        .values_list("id", "tenant_id")
    )
    if not rows:
        return 0
    Run.objects.filter(id__in=[r[0] for r in rows]).update(next_eligible_at=now, reason="")
    write_events([event(rid, tid, "run.unbuffered", state="ready", nextEligibleAt=_iso(now)) for rid, tid in rows], now)
    return len(rows)


def release_unstarted(claims: list[Claimed]) -> int:
    """Shutdown: runs claimed but not yet called go straight back to ready. The attempt row stays
    (generations have no gaps) as `abandoned`, and does not count against the retry budget."""
    if not claims:
        return 0
    with transaction.atomic():
        now = db_now()
        keys = [(c.run_id, c.generation) for c in claims]
        owned = set(_owned(keys).select_for_update().values_list("id", "generation"))
        if not owned:
            return 0
        _owned(owned).update(
            state=RunState.READY, lease_until=None, lease_owner="", next_eligible_at=now,
            attempts_used=F("attempts_used") - 1,
        )
        mine = [c for c in claims if (c.run_id, c.generation) in owned]
        Attempt.objects.filter(id__in=[c.attempt_id for c in mine]).update(
            outcome=AttemptOutcome.ABANDONED, finished_at=now, error="given back unstarted at worker shutdown"
        )
        write_events([event(c.run_id, c.tenant_id, "run.released", generation=c.generation, state="ready") for c in mine], now)
    return len(mine)


# --------------------------------------------------------------------------------------------
# reconciler


def expire_leases(*, batch: int = 500) -> int:
    """Leases past their end (database clock): the attempt's outcome is unknown (the target may
    or may not have acted), the run goes back to ready under the retry policy, or to dead."""
    with transaction.atomic():
        now = db_now()
        runs = list(
            Run.objects.filter(state=RunState.LEASED, lease_until__lt=now)
            .select_for_update(skip_locked=True)
            .select_related("version")
            .only("id", "tenant_id", "schedule_id", "generation", "attempts_used", "max_attempts",
                  "version__backoff_base_seconds", "version__backoff_max_seconds", "lease_owner")[:batch]
        )
        if not runs:
            return 0
        updates, events, ended = [], [], set()
        for r in runs:
            state, eligible = next_state_after_failure(
                r.attempts_used, r.max_attempts, True, r.version.backoff_base_seconds, r.version.backoff_max_seconds, now
            )
            msg = f"lease expired while {r.lease_owner} held it: outcome unknown"
            updates.append((r.id, state, eligible, msg))
            if state in TERMINAL_STATES:
                ended.add(r.schedule_id)
            events.append(event(r.id, r.tenant_id, "run.lease_expired", generation=r.generation, state=state,
                                nextEligibleAt=_iso(eligible)))
        cond = Q()
        for r in runs:
            cond |= Q(run_id=r.id, generation=r.generation)
        Attempt.objects.filter(cond, outcome__isnull=True).update(
            outcome=AttemptOutcome.UNKNOWN, finished_at=now, error_class="LeaseExpired",
            error="the lease expired before a result was recorded; the target may or may not have acted",
        )
        _apply_run_updates(updates, now)
        write_events(events, now)
        if ended:
            release_buffered(ended, now)
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
    3. Rank each schedule's missed runs (ready, never attempted, eligible longer ago than the
       grace) newest first, and pick those ranked past what the policy keeps (0, 1 or
       catchupLimit). Ranking over the whole missed set, not over a locked batch, means a pass
       never skips a run that should be kept and always makes progress however many are kept.
       PostgreSQL refuses FOR UPDATE beside a window function, hence the separate lock step.
       The ranking reads the missed backlog once per pass, so one pass skips up to
       `max_batches` batches of what it found.
    4. Lock each batch of picked runs (SKIP LOCKED, re-checking they are still unclaimed) and skip
       them, one transaction per batch. Between 3 and 4 the set can only gain newer runs or lose
       ones a worker claimed; either way a picked run is still not among the latest to keep, or
       has been claimed and is left.
    """
    with transaction.atomic():
        now = db_now()
        # Buffered runs wait at BUFFERED_UNTIL, the far end of run_ready_idx: this reads them
        # only, not every ready run of a backlog.
        buffered = set(
            Run.objects.filter(state=RunState.READY, next_eligible_at=BUFFERED_UNTIL, reason=Reason.BUFFERED)
            .values_list("schedule_id", flat=True)
        )
        if buffered:
            release_buffered(buffered, now)
    unclaimed = Run.objects.filter(
        state=RunState.READY, generation=0, kind=RunKind.SCHEDULED, reason="", next_eligible_at__lt=now
    )
    oldest = unclaimed.order_by("next_eligible_at").values_list("next_eligible_at", flat=True).first()
    if oldest is None:
        return 0
    least_grace = ScheduleVersion.objects.aggregate(g=Min("misfire_grace_seconds"))["g"] or 0
    if oldest >= now - timedelta(seconds=least_grace):
        return 0
    # "Eligible longer ago than its version's grace", as one range per distinct grace value
    # (there are few), because interval arithmetic on a column is not portable to SQLite.
    graces = set(unclaimed.values_list("version__misfire_grace_seconds", flat=True).distinct()[:1000])
    missed = Q()
    for g in graces:
        missed |= Q(version__misfire_grace_seconds=g, next_eligible_at__lt=now - timedelta(seconds=g))
    picked = list(
        unclaimed.filter(missed)
        .annotate(
            newer=Window(RowNumber(), partition_by=[F("schedule_id")], order_by=[F("scheduled_time").desc(), F("id").desc()]),
            keep=Case(
                When(version__misfire_policy="skip", then=Value(0)),
                When(version__misfire_policy="run_once", then=Value(1)),
                default=F("version__catchup_limit"),
                output_field=IntegerField(),
            ),
        )
        .filter(newer__gt=F("keep"))
        .order_by("next_eligible_at")
        .values_list("id", flat=True)[: batch * max_batches]
    )
    skipped = 0
    for i in range(0, len(picked), batch):
        with transaction.atomic():
            doomed = list(
                Run.objects.filter(id__in=picked[i : i + batch], state=RunState.READY, generation=0, reason="")
                .select_for_update(skip_locked=True)
                .values_list("id", "tenant_id")
            )
            if not doomed:
                continue
            now = db_now()
            Run.objects.filter(id__in=[r[0] for r in doomed]).update(
                state=RunState.SKIPPED, reason=Reason.MISFIRE, next_eligible_at=None, finished_at=now
            )
            write_events([event(rid, tid, "run.skipped", state="skipped", reason="misfire") for rid, tid in doomed], now)
            skipped += len(doomed)
    return skipped
