"""What each run transition does, decided once for both database engines.

Everything here is pure: given what was read (a schedule and its version, a claimed run, a call's
result), it decides the next state, the backoff, which occurrences run or are skipped and why, and
the outbox event to write. `runs.queue` and `runs.actions` call these and
hand the outcome to the storage seam (`runs.store`), whose engine modules only apply it.

The fencing rule, stated once: a result, heartbeat or release applies to a run only while the run
is still `leased` at the generation the worker was given. Every statement that applies one says so
in its own WHERE (id, generation, state), so a fenced-off worker's write changes nothing; a late
result is kept on its attempt as evidence.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from runs.models import TERMINAL_STATES, AttemptOutcome, EventKind, Occurrence, Reason, Run, RunState
from schedules import timeexpr
from schedules.models import MisfirePolicy, OverlapPolicy, Schedule, ScheduleVersion
from schedules.occurrences import ONE_US, walk
from schedules.services import MAX_POLICY_SECONDS, rule_for
from schedules.spread import eligible_at
from schedules.targets import target_host

# A buffered run (overlap buffer_one) waits with this eligibility until the run before it ends.
BUFFERED_UNTIL = datetime(2999, 1, 1, tzinfo=timezone.utc)
# One pass never makes more than this many occurrences for one schedule (a long outage of an
# every-minute schedule is worked off over several passes instead of one huge transaction).
MAX_OCCURRENCES_PER_PASS = 10_000
# Retry-After from a target is honoured up to this long.
MAX_RETRY_AFTER_SECONDS = 3600.0
# The error class of an attempt the reconciler ended because its lease expired (outcome unknown).
LEASE_EXPIRED = "LeaseExpired"


def iso(dt: datetime | None) -> str | None:
    """UTC ISO 8601 with `Z`, as every event payload and header carries times."""
    return dt.astimezone(timezone.utc).isoformat().replace("+00:00", "Z") if dt else None


# --- events -----------------------------------------------------------------------------------


@dataclass(slots=True)
class Event:
    """An outbox event to write (a plain object: the hot paths make thousands a second, and a
    model instance costs several times more to build)."""

    run_id: object
    tenant_id: object
    kind: str
    payload: dict


def event(run_id, tenant_id, kind: EventKind, **payload) -> Event:
    return Event(run_id, tenant_id, str(kind), {"runId": str(run_id), **payload})


_CREATED = {RunState.READY: EventKind.CREATED, RunState.SKIPPED: EventKind.SKIPPED,
            RunState.CANCELED: EventKind.CANCELED}
_COMPLETED = {RunState.SUCCEEDED: EventKind.SUCCEEDED, RunState.READY: EventKind.RETRY_SCHEDULED,
              RunState.DEAD: EventKind.DEAD}


def created_kind(state: str) -> EventKind:
    """The event of a run made in `state` (ready, or already skipped/canceled)."""
    return _CREATED[state]


def completion_kind(state: str) -> EventKind:
    """The event of an attempt's result that moved its run to `state`."""
    return _COMPLETED[state]


# The evidence of an attempt's result, as its completion event and a late result carry it: the
# payload key, the Result attribute, and whether an empty string is written as null. Python
# (Result.evidence) and the PostgreSQL store's statements (built from this table) write it alike.
EVIDENCE = (
    ("outcome", "outcome", False),
    ("httpStatus", "http_status", False),
    ("errorClass", "error_class", True),
    ("error", "error", True),
    ("latencyMs", "latency_ms", False),
)


# --- retries ----------------------------------------------------------------------------------


def backoff_seconds(attempt: int, base: float, cap: float) -> float:
    """Full jitter: uniform in [0, min(cap, base * 2**(attempt-1))]. Never beyond the longest
    policy a schedule may set, whatever a stored version says: a version saved before that bound
    existed (a backoff of 1e308 s) made the next eligible time overflow in the database, and with
    it every result of the worker's batch, for every tenant."""
    exponent = min(max(1, attempt) - 1, 64)  # 2**64 times any allowed base is past the bound
    return random.uniform(0, min(cap, base * 2.0 ** exponent, MAX_POLICY_SECONDS))


def retry_delay(attempts_used, max_attempts, retryable, base, cap, retry_after=None) -> float | None:
    """Seconds until a failed or unknown attempt's run is retried, or None when it is dead."""
    if not retryable or attempts_used >= max_attempts:
        return None
    delay = backoff_seconds(attempts_used, base, cap)
    if retry_after:
        delay = max(delay, min(retry_after, MAX_RETRY_AFTER_SECONDS))
    return delay


def next_state_after_failure(attempts_used, max_attempts, retryable, base, cap, now, retry_after=None):
    """(state, next_eligible_at) for a failed or unknown attempt under the retry policy."""
    delay = retry_delay(attempts_used, max_attempts, retryable, base, cap, retry_after)
    if delay is None:
        return RunState.DEAD, None
    return RunState.READY, now + timedelta(seconds=delay)


LEASE_EXPIRED_ERROR = "the lease expired before a result was recorded; the target may or may not have acted"


def lease_expired_message(owner: str) -> str:
    return f"lease expired while {owner} held it: outcome unknown"


# --- what a worker was given and what it reports -------------------------------------------------


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
    # (url, method, headers JSON, timeout seconds, payload JSON text) of the version: every claim
    # returns them, so the worker needs no second query.
    target: tuple | None = None
    # (backoff base, backoff max, overlap policy) of the version, likewise; complete() reads the
    # version for them when a Claimed was made without (tests).
    policy: tuple | None = None
    # The run and schedule ids and the scheduled time as the call's headers carry them (the
    # PostgreSQL claim formats them as text in the statement: formatting a UUID or a time in
    # Python costs more than the rest of building the headers).
    run_key: str = ""
    schedule_key: str = ""
    scheduled_iso: str = ""
    # host:port of the run's target, what the default per-target share is counted by.
    target_host: str = ""

    @property
    def run_text(self) -> str:
        return self.run_key or str(self.run_id)

    @property
    def schedule_text(self) -> str:
        return self.schedule_key or str(self.schedule_id)

    @property
    def scheduled_text(self) -> str:
        return self.scheduled_iso or iso(self.scheduled_time)


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
        """The attempt's evidence as its completion event (and a late result) carries it (EVIDENCE)."""
        out = {}
        for key, attr, empty_is_null in EVIDENCE:
            value = getattr(self, attr)
            out[key] = (value or None) if empty_is_null else value
        return out

    @property
    def last_error(self) -> str:
        """What the run's `last_error` becomes: only a failure has one."""
        if self.outcome == AttemptOutcome.SUCCEEDED:
            return ""
        return self.error or (f"HTTP {self.http_status}" if self.http_status else "")


@dataclass(frozen=True)
class VersionPolicy:
    backoff_base: float
    backoff_max: float
    overlap: str


@dataclass(slots=True)
class Decided:
    """A result with the transition it makes if its generation still holds the lease."""

    result: Result
    state: str
    delay: float | None  # seconds until the retry (state ready), else None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


def decide(result: Result, policy: VersionPolicy) -> Decided:
    """The next state of a run from its attempt's result, under the retry policy. Decided from what
    the claim returned (attempts used, retry budget): while the generation holds the lease nobody
    else can change those, and where it no longer holds, the write is fenced off."""
    c = result.claimed
    if result.outcome == AttemptOutcome.SUCCEEDED:
        return Decided(result, RunState.SUCCEEDED, None)
    delay = retry_delay(c.attempts_used, c.max_attempts, result.retryable, policy.backoff_base,
                        policy.backoff_max, result.retry_after)
    return Decided(result, RunState.DEAD if delay is None else RunState.READY, delay)


# --- the scanner -------------------------------------------------------------------------------


@dataclass
class Planned:
    occ: timeexpr.Occurrence
    state: str  # ready | skipped
    reason: str = ""
    eligible_at: datetime | None = None


KEEP_MISSED = {MisfirePolicy.SKIP: 0, MisfirePolicy.RUN_ONCE: 1}


def keep_missed(version: ScheduleVersion) -> int:
    """How many of a schedule's missed occurrences still run: the latest 0, 1 or catchupLimit."""
    return KEEP_MISSED.get(version.misfire_policy, version.catchup_limit)


def made_ahead(version: ScheduleVersion) -> bool:
    """Only schedules that allow overlap are materialised ahead of their instant: the overlap
    policy needs the earlier run's state when the occurrence is due."""
    return version.overlap_policy == OverlapPolicy.ALLOW


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
    `active` maps schedule id -> (busy, buffered) for schedules that do not allow overlap.
    """
    rule = rule_for(version, schedule.anchor_at)
    limit = now + (horizon if made_ahead(version) else timedelta(0))
    grace_cut = now - timedelta(seconds=version.misfire_grace_seconds)
    span = walk(rule, version, after=schedule.next_run_at - ONE_US, until=limit, inclusive=True,
                limit=MAX_OCCURRENCES_PER_PASS)
    due = span.occurrences
    next_at = span.resume_at

    # Spread (schedules.spread): each occurrence keeps its nominal instant and becomes eligible
    # `offset` later; whether it was missed is judged from that eligible time, as the
    # reconciler's misfire pass judges an unclaimed run from its next_eligible_at.
    offset = version.spread_offset_seconds
    if offset:
        grace_cut -= timedelta(seconds=offset)
    missed = [o for o in due if o.at < grace_cut and not o.dropped]
    keep = keep_missed(version)
    if span.truncated and keep and missed and missed[-1] is due[-1]:
        # The outage goes on past this chunk; the next pass will keep the latest of what is left,
        # so this one keeps only what that remainder cannot supply. At most `keep` steps.
        later = walk(rule, version, after=due[-1].at, until=grace_cut, inclusive=False, limit=keep,
                     count_dropped=False)
        keep -= len([o for o in later.occurrences if not o.dropped])
    # max(0, ...): a limit larger than the outage must keep them all, not wrap to a negative index.
    run_missed = set(id(o) for o in missed[max(0, len(missed) - keep):]) if keep > 0 else set()

    busy, buffered = active.get(schedule.id, (False, False))
    planned = []
    for occ in due:
        if occ.dropped:
            planned.append(Planned(occ, RunState.SKIPPED, Reason.DST))
            continue
        if occ.at < grace_cut and id(occ) not in run_missed:
            planned.append(Planned(occ, RunState.SKIPPED, Reason.MISFIRE))
            continue
        if not made_ahead(version) and busy:
            if version.overlap_policy == OverlapPolicy.BUFFER_ONE and not buffered:
                buffered = True
                planned.append(Planned(occ, RunState.READY, Reason.BUFFERED, BUFFERED_UNTIL))
            else:
                planned.append(Planned(occ, RunState.SKIPPED, Reason.OVERLAP))
            continue
        planned.append(Planned(occ, RunState.READY, "", eligible_at(occ.at, offset)))
        if not made_ahead(version):
            busy = True  # a later occurrence of this pass overlaps the one just made
    return planned, next_at, span.completed


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
        created_kind(state),
        scheduleId=str(schedule.id),
        scheduleVersion=version.version,
        scheduledTime=iso(occ.at),
        state=state,
        reason=reason or None,
    )
    return o, r, ev


def manual_occurrence(version: ScheduleVersion, now: datetime) -> timeexpr.Occurrence:
    """The occurrence of a trigger-now: its identity is the trigger's instant."""
    zone = timeexpr.validate_time_zone(version.time_zone)
    local = now.astimezone(zone)
    return timeexpr.Occurrence(at=now, local=local, wall=local.replace(tzinfo=None).isoformat(timespec="seconds"),
                               note="manual trigger")


# --- claiming ----------------------------------------------------------------------------------


@dataclass
class Holding:
    """The calls one worker has in flight, by tenant and by target ((tenant, host:port) pairs:
    a target is counted per tenant, as explicit budgets are), its slots, and the default shares
    (fractions of those slots) one tenant's calls and one tenant's calls to one host may hold:
    what a claim's default caps are counted against (`share_cap`)."""

    slots: int
    tenant_share: float
    target_share: float
    tenants: dict = field(default_factory=dict)
    hosts: dict = field(default_factory=dict)

    @property
    def tenant_cap(self) -> int:
        return share_cap(self.tenant_share, self.slots)

    @property
    def host_cap(self) -> int:
        return share_cap(self.target_share, self.slots)

    def tenant_room(self, tenant) -> int:
        return self.tenant_cap - self.tenants.get(tenant, 0)

    def host_room(self, key) -> int:
        """Room for a (tenant, host) pair."""
        return self.host_cap - self.hosts.get(key, 0)

    def at_a_cap(self) -> bool:
        """Whether some tenant or target host already holds its whole share of these slots."""
        t, h = self.tenant_cap, self.host_cap
        return any(n >= t for n in self.tenants.values()) or any(n >= h for n in self.hosts.values())


def full_targets(held: dict, cap: int, *, budgets: dict | None = None) -> dict:
    """tenant -> hosts its calls may not be given more of: (tenant, host) pairs holding `cap`
    (the default target share), or, for pairs with an explicit budget (`budgets`: pair -> room
    left), none left of it."""
    out: dict = {}
    budgets = budgets or {}
    for (tenant, host), n in held.items():
        if (tenant, host) not in budgets and n >= cap:
            out.setdefault(tenant, []).append(host)
    for (tenant, host), room in budgets.items():
        if room <= 0:
            out.setdefault(tenant, []).append(host)
    return out


def share_cap(share: float, slots: int) -> int:
    """Slots of a worker that one tenant (or one tenant's target host) may hold by default: its
    share of them, rounded down so that the rest stays free for the others, and at least one."""
    return max(1, min(slots, int(share * slots)))


# Where this choice is made: here, for the portable store and for PostgreSQL when an explicit cap
# or budget is in play (runs.queue.claim reads the fleet's counts first); and, with no explicit cap
# in play, in SQL on PostgreSQL (RunClaimDue in runs/store/postgres.py), because there it is one
# statement: the tenants, their locked candidates, the pick and the lease in one round trip, the
# rows locked for one statement and a commit; made here it would be four round trips with the rows
# locked between them. The statement makes the same choice, but for these differences:
# - its rotation by `shift` starts at the tenant `rotate` would put first at -(shift + 1), and is
#   counted over every tenant with due runs where `rotate` counts those with room (a difference of
#   numbering: every tenant is first in turn either way);
# - it reads at most a tenant's room of its rows (`fair_share` reads the share, and `pick` stops
#   at the room), and numbers a tenant's turns over the rows it read, where `pick` numbers only
#   those it takes. So when the default target share binds among those rows (a tenant's oldest
#   due runs mostly to one host holding most of its share), the statement leaves over that
#   tenant's runs to other hosts beyond the rows it read, which `pick` would take, and, when the
#   limit cuts, may serve another tenant's next run first. Those runs wait for the next claim.
# tests/core/test_claim_sql_and_python_pick_agree.py checks both choose the same runs otherwise.
def pick(candidates, limit: int, *, tenant_room: dict, host_room: dict, target_room: dict | None = None,
         target_cap: int | None = None, exempt: frozenset | set = frozenset()) -> list:
    """Round-robin across tenants (in the order the candidates come) up to `limit`, within each
    tenant's room (`tenant_room`; a tenant not in it has no limit), each explicit (tenant, host)
    budget's room (`host_room`), and, for a call no explicit budget covers by a tenant not in
    `exempt` (those with an explicit cap of their own), its (tenant, host) room under the default
    target share (`target_room`, `target_cap` for a pair not in it; no limit when `target_cap` is
    None). Candidates are (run id, tenant id, target host) rows, each
    tenant's oldest first. Runs not picked stay ready: nothing claimed waits inside a worker."""
    by_tenant: dict = {}
    for row in candidates:
        by_tenant.setdefault(row[1], []).append(row)
    room_tenant, room_host = dict(tenant_room), dict(host_room)
    room_target = dict(target_room or {})
    picked = []
    queues = [iter(v) for v in by_tenant.values()]
    while queues and len(picked) < limit:
        still = []
        for q in queues:
            for row in q:
                tenant, host = row[1], (row[1], row[2])
                if room_tenant.get(tenant, 1) <= 0:
                    break  # this tenant is at its cap: drop its queue
                if host in room_host:
                    if room_host[host] <= 0:
                        continue  # this target is at its budget: try the tenant's next run
                elif target_cap is not None and tenant not in exempt and room_target.get(host, target_cap) <= 0:
                    continue  # this tenant's calls to this host hold their share of the slots
                picked.append(row[0])
                if tenant in room_tenant:
                    room_tenant[tenant] -= 1
                if host in room_host:
                    room_host[host] -= 1
                if target_cap is not None:
                    room_target[host] = room_target.get(host, target_cap) - 1
                still.append(q)
                break
            if len(picked) >= limit:
                break
        queues = still
    return picked


def fair_share(limit: int, tenants: int) -> int:
    """Runs read per tenant for one claim: twice a fair share each, so capacity one tenant cannot
    use (caps, budgets, too few runs) goes to the others in the same transaction."""
    return 2 * -(-limit // max(1, tenants))


def candidate_limits(tenants: list, per_tenant: int, room: dict | None = None) -> list[int]:
    """Runs read per tenant for one claim, in the order of `tenants`: its share, or its room
    (runs it may still be given) where that is less. A capped tenant at its cap reads none: its
    backlog, however deep, is not locked by every claim only to be left."""
    room = room or {}
    return [max(0, min(per_tenant, room.get(t, per_tenant))) for t in tenants]


def rotate(tenants: list, shift: int) -> list:
    """Tenants in a rotating order, so that no tenant is always served first."""
    if not tenants:
        return tenants
    shift %= len(tenants)
    return tenants[shift:] + tenants[:shift]


@dataclass
class ScanResult:
    locked: int = 0  # schedules the pass locked, including ones inside the horizon left for later
    stepped_aside: bool = False  # partition DDL was waiting (runs.partitions, "The scanner's gate"): nothing done
    schedules: int = 0  # schedules it materialised
    runs: int = 0
    skipped: int = 0
    errors: list = field(default_factory=list)
