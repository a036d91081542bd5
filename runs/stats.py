"""The operator figures: one module that the portal dashboard and the metrics endpoint both read.

Plain query functions returning dataclasses and dicts: no HTML, no request. Every function takes
`tenant_ids` (None = all tenants) so a tenant user's dashboard is the same code, scoped.

They must stay cheap on a runs table of hundreds of millions of rows, so each one keeps to:
- the partial queue indexes (`run_ready_idx`, `run_leased_idx`, `run_dead_idx`), whose size is
  the live work and the dead-letter queue, not the history;
- `run_tenant_time_idx` over a bounded scheduled_time window, with an explicit tenant list so the
  planner can descend the index once per tenant;
- a bounded tail of the attempts table by primary key (`recent_attempt_floor`): attempt ids grow
  with time, so "the attempts with the newest N ids" is a primary-key range of at most N rows
  whatever the table's size (the start lags read it).
The cost of each query is noted next to it. Figures summed from the activity loop's rows (failing
targets, unknown outcomes, lease expirations) are in dispatch.activity_figures.

Percentiles are computed in Python over the bounded sample so the module works on the embedded
SQLite database as well as PostgreSQL.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta

from django.db import DatabaseError
from django.db.models import (
    BooleanField,
    Case,
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    IntegerField,
    Max,
    Min,
    Q,
    When,
)
from django.db.models.functions import Mod

from runs.models import Attempt, OutboxEvent, RecentStateCount, Run, RunKind, RunState, attempts_with_their_runs
from runs.store import store
from scheduler_project.foundation.dbclock import db_now
from schedules.models import Tenant

log = logging.getLogger("scheduler.stats")

# How many of the newest attempts the windowed attempt figures look at, at most.
ATTEMPT_SAMPLE = 50_000
LAG_WINDOW = timedelta(minutes=15)
LAG_NOW_WINDOW = timedelta(minutes=1)
RECENT = timedelta(hours=1)
# The last hour's runs by state are counted again on every view while counting them is cheap; once
# a count takes longer than this, it is kept and served for up to RECENT_COUNT_MAX_AGE.
RECENT_COUNT_SLOW_SECONDS = 0.05
RECENT_COUNT_MAX_AGE = timedelta(seconds=30)


def _tenant_list(tenant_ids):
    # An explicit tenant list lets PostgreSQL use (tenant, time) indexes as one range per tenant.
    # Cost: the tenants table is small (one row per customer).
    return list(tenant_ids) if tenant_ids is not None else list(Tenant.objects.values_list("id", flat=True))


def _runs(tenant_ids):
    qs = Run.objects.all()
    return qs if tenant_ids is None else qs.filter(tenant_id__in=list(tenant_ids))


def recent_attempt_floor(limit: int = ATTEMPT_SAMPLE) -> int:
    """The lowest of the newest `limit` attempt ids handed out (0 when fewer were): the tail is
    the attempts from there on, at most `limit` of them (fewer where an id was never used, by a
    claim rolled back). Cost: the newest entry of each attempts partition's primary key; counting
    `limit` entries back instead read them all, across every partition."""
    newest = Attempt.objects.aggregate(m=Max("id"))["m"] or 0
    return max(0, newest - limit + 1)


def _recent_attempts(tenant_ids, floor: int, *, with_runs: bool = False):
    """The attempts tail from `floor`, of `tenant_ids` (None: all); joined to their runs (for run__
    fields) when `with_runs` or a tenant filter needs them."""
    qs = Attempt.objects.filter(id__gte=floor)
    if with_runs or tenant_ids is not None:
        qs = attempts_with_their_runs(qs)
    return qs if tenant_ids is None else qs.filter(run__tenant_id__in=list(tenant_ids))


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


@dataclass
class Lag:
    now_seconds: float | None  # median lag of first attempts started in the last minute
    p50_seconds: float | None
    p99_seconds: float | None
    sample: int  # starts read
    window_seconds: int
    stride: int = 1  # 1 in `stride` of the window's starts was read (1: all of them)

    @property
    def starts(self) -> int:
        """The window's starts: exact when all were read, an estimate otherwise."""
        return self.sample * self.stride


@dataclass
class LagSample:
    lags: list  # seconds, sorted: first starts in the last LAG_WINDOW
    recent: list  # seconds, sorted: those in the last LAG_NOW_WINDOW
    stride: int  # every stride-th attempt (by id) was read; 1: all


# At most about this many starts are read for the lag percentiles; a busier window is read one
# attempt in every `stride` (by id: an even spread over the window), which leaves the
# percentiles' estimate well within what an operator can tell apart, at a bounded cost.
LAG_SAMPLE = 5_000


def _lag_rows(tenant_ids, floor: int, now: datetime, stride: int) -> list:
    qs = (
        _recent_attempts(tenant_ids, floor, with_runs=True)
        .filter(generation=1, started_at__gte=now - LAG_WINDOW)
        .exclude(run__kind=RunKind.BACKFILL)
        .order_by()  # sorted by the caller; the model's ordering would sort by the runs' columns
    )
    if stride > 1:
        qs = qs.annotate(pick=Mod("id", stride)).filter(pick=0)
    # The lag and "in the last minute" worked out by the database: a duration and a boolean are
    # read many times faster than two timestamps (Django's time-zone-aware loader).
    return list(qs.annotate(
        lag=ExpressionWrapper(F("started_at") - F("scheduled_time"), output_field=DurationField()),
        last_minute=ExpressionWrapper(Q(started_at__gte=now - LAG_NOW_WINDOW), output_field=BooleanField()),
        # Lag counts from when the run became eligible: a spread run's offset is not lag.
        spread=SPREAD_OFFSET,
    ).values_list("lag", "last_minute", "spread"))


# An attempt's run's spread offset in seconds (schedules.spread): only scheduled runs are spread.
SPREAD_OFFSET = Case(When(run__kind=RunKind.SCHEDULED, then=F("run__version__spread_offset_seconds")), default=0,
                     output_field=IntegerField())


def lag_samples(*, tenant_ids=None, now: datetime | None = None, floor: int | None = None) -> LagSample:
    """Scheduled-to-start lags (seconds, sorted) of first attempts started in the last 15
    minutes, and of those in the last minute; about LAG_SAMPLE of them at most, evenly spread.
    Backfills are left out: their scheduled times are in the past on purpose.
    Cost: the bounded attempts tail read once, at most about LAG_SAMPLE of its attempts joined
    to their runs by primary key; when the window held few of the tail's attempts (a quiet
    quarter hour, or a tenant's view of one other tenants made busy), a second read at the
    stride that share needs."""
    now = now or db_now()
    floor = recent_attempt_floor() if floor is None else floor
    # The stride from the tail's span of ids (two index probes), assuming the window is busy;
    # counting the window's starts first would read the tail twice when it is.
    span = Attempt.objects.filter(id__gte=floor).aggregate(lo=Min("id"), hi=Max("id"))
    stride = max(1, math.ceil((span["hi"] - span["lo"] + 1) / LAG_SAMPLE)) if span["hi"] else 1
    rows = _lag_rows(tenant_ids, floor, now, stride)
    if stride > 1 and len(rows) < LAG_SAMPLE // 4:
        # The window held a small share of the tail (or the viewer's tenants did): read it at
        # the stride that share needs (all of it, often) rather than keep a thin sample.
        stride = max(1, (len(rows) * stride) // LAG_SAMPLE)
        rows = _lag_rows(tenant_ids, floor, now, stride)
    lags, recent = [], []
    for delta, last_minute, spread in rows:
        lag = max(0.0, delta.total_seconds() - spread)
        lags.append(lag)
        if last_minute:
            recent.append(lag)
    lags.sort()
    recent.sort()
    return LagSample(lags, recent, stride)


def scheduled_to_start_lag(*, tenant_ids=None, now: datetime | None = None, floor: int | None = None) -> Lag:
    """Lag from scheduled time to first start: now (median over the last minute) and p50/p99
    over the last 15 minutes."""
    s = lag_samples(tenant_ids=tenant_ids, now=now, floor=floor)
    return Lag(
        now_seconds=percentile(s.recent, 0.5),
        p50_seconds=percentile(s.lags, 0.5),
        p99_seconds=percentile(s.lags, 0.99),
        sample=len(s.lags),
        window_seconds=int(LAG_WINDOW.total_seconds()),
        stride=s.stride,
    )


@dataclass
class Overdue:
    count: int
    oldest_run_id: str | None = None
    oldest_schedule_id: str | None = None
    oldest_schedule_name: str = ""
    oldest_tenant: str = ""
    oldest_eligible_at: datetime | None = None
    oldest_scheduled_time: datetime | None = None
    age_seconds: float | None = None


def overdue(*, tenant_ids=None, now: datetime | None = None) -> Overdue:
    """Ready runs whose eligibility time has passed but no worker has claimed: the backlog.
    Cost: `run_ready_idx` range up to now (the due backlog); the oldest is its first entry."""
    now = now or db_now()
    due = _runs(tenant_ids).filter(state=RunState.READY, next_eligible_at__lte=now)
    count = due.count()
    if not count:
        return Overdue(count=0)
    oldest = (
        due.order_by("next_eligible_at")
        .select_related("schedule", "tenant")
        .only("id", "schedule__id", "schedule__name", "tenant__slug", "next_eligible_at", "scheduled_time")
        .first()
    )
    if oldest is None:  # claimed between the two queries
        return Overdue(count=0)
    return Overdue(
        count=count,
        oldest_run_id=str(oldest.id),
        oldest_schedule_id=str(oldest.schedule_id),
        oldest_schedule_name=oldest.schedule.name,
        oldest_tenant=oldest.tenant.slug,
        oldest_eligible_at=oldest.next_eligible_at,
        oldest_scheduled_time=oldest.scheduled_time,
        age_seconds=max(0.0, (now - oldest.next_eligible_at).total_seconds()),
    )


@dataclass
class StateCounts:
    live: dict  # ready/leased/dead: exact totals
    recent: dict  # every state, runs scheduled in the last hour
    recent_window_seconds: int
    recent_as_of: datetime | None = None  # when `recent` was counted, if not now (a kept count)


LIVE_STATES = (RunState.READY, RunState.LEASED, RunState.DEAD)


def live_counts(*, tenant_ids=None) -> dict:
    """Exact totals of the states that are work (ready, leased) or need a person (dead), by state
    value. The dashboard counts them once per page for its fingerprint and its figures.
    Cost: three partial-index counts (`run_ready_idx`, `run_leased_idx`, `run_dead_idx`); the
    last follows the size of the dead-letter queue."""
    runs = _runs(tenant_ids)
    return {s.value: runs.filter(state=s).count() for s in LIVE_STATES}


def runs_by_state(*, tenant_ids=None, now: datetime | None = None, live: dict | None = None) -> StateCounts:
    """Exact totals for the states that are work (ready, leased) or need a person (dead) (`live`,
    when the caller has counted them already), and a breakdown of every state over the last hour.
    A total over the whole history by state would be a full-table scan; it is never asked.
    Cost: live_counts; one `run_tenant_time_idx` range per tenant over one hour."""
    now = now or db_now()
    live = live_counts(tenant_ids=tenant_ids) if live is None else live
    recent, as_of = recent_by_state(tenant_ids=tenant_ids, now=now)
    return StateCounts(live=dict(live), recent=recent, recent_window_seconds=int(RECENT.total_seconds()),
                       recent_as_of=as_of)


def recent_by_state(*, tenant_ids=None, now: datetime) -> tuple[dict, datetime | None]:
    """Runs scheduled in the last hour by state, and when they were counted (None: now).
    Counted on every call while that is cheap. A count that took longer than
    RECENT_COUNT_SLOW_SECONDS (an hour of a busy deployment: hundreds of thousands of runs) is
    kept in RecentStateCount and served to every process for up to RECENT_COUNT_MAX_AGE, so that
    pollers do not count the same hour again every few seconds each.
    Cost: one primary-key read; when counting, one `run_tenant_time_idx` range per tenant over one
    hour, and its rows."""
    tenants = _tenant_list(tenant_ids)
    key = "all" if tenant_ids is None else hashlib.sha256(",".join(sorted(map(str, tenants))).encode()).hexdigest()
    kept = RecentStateCount.objects.filter(key=key, taken_at__gt=now - RECENT_COUNT_MAX_AGE,
                                           taken_at__lte=now).first()
    if kept is not None:
        return {s.value: kept.counts.get(s.value, 0) for s in RunState}, kept.taken_at
    started = time.monotonic()
    rows = (
        Run.objects.filter(tenant_id__in=tenants, scheduled_time__gt=now - RECENT, scheduled_time__lte=now)
        .values_list("state")
        .annotate(n=Count("id"))
        .order_by()
    )
    recent = {s.value: 0 for s in RunState}
    recent.update({state: n for state, n in rows})
    if time.monotonic() - started > RECENT_COUNT_SLOW_SECONDS:
        try:
            store().counter_keep_recent(key, taken_at=now, counts=recent)
        except DatabaseError:
            # Only a saving missed: the next view counts again.
            log.warning("could not keep the last hour's run counts", exc_info=True)
    return recent, None


def forget_old_recent_counts(now: datetime) -> int:
    """Delete kept counts too old to be served again (one row per set of tenants that viewed a
    busy hour); the activity loop's pruning calls it. Returns how many went."""
    return RecentStateCount.objects.filter(taken_at__lt=now - RECENT_COUNT_MAX_AGE).delete()[0]


@dataclass
class DeadLetter:
    size: int
    last_hour: int
    hour_before: int

    @property
    def growth(self) -> int:
        return self.last_hour - self.hour_before


def dead_letter(*, tenant_ids=None, now: datetime | None = None, size: int | None = None) -> DeadLetter:
    """The dead-letter queue's size (`size`, when the caller has counted it already) and how many
    runs went dead in the last hour and the hour before.
    Cost: `run_dead_idx` (tenant, finished_at) only: the size is an index-only count of the
    dead-letter queue; the two hour buckets are one range per tenant on its second column."""
    now = now or db_now()
    dead = Run.objects.filter(state=RunState.DEAD, tenant_id__in=_tenant_list(tenant_ids))
    if size is None:
        size = dead.count()
    # Counts of columns the index has (not of the id): PostgreSQL counts from the index alone.
    agg = dead.filter(finished_at__gt=now - 2 * RECENT).aggregate(
        last_hour=Count("finished_at", filter=Q(finished_at__gt=now - RECENT)),
        hour_before=Count("finished_at", filter=Q(finished_at__lte=now - RECENT)),
    )
    return DeadLetter(size=size, **agg)


def oldest_unpublished_event_at() -> datetime | None:
    """When the oldest event the relay has not published yet was written (outbox lag).
    Cost: the first entry of outbox_unpublished_idx."""
    return (
        OutboxEvent.objects.filter(published_at__isnull=True).order_by("id").values_list("created_at", flat=True).first()
    )


@dataclass
class TenantLoad:
    tenant_id: str
    slug: str
    in_flight: int
    backlog: int
    max_in_flight: int | None


def per_tenant(*, tenant_ids=None, now: datetime | None = None) -> list[TenantLoad]:
    """Leased (in flight) and ready-and-due (backlog) runs per tenant, busiest first; only tenants
    with either. Cost: `run_leased_idx` and `run_ready_idx`, grouped by tenant."""
    now = now or db_now()
    runs = store().runs_live(due_by=now)
    runs = runs if tenant_ids is None else runs.filter(tenant_id__in=list(tenant_ids))
    leased = dict(runs.filter(state=RunState.LEASED).values_list("tenant_id").annotate(n=Count("id")).order_by())
    backlog = dict(
        runs.filter(state=RunState.READY, next_eligible_at__lte=now).values_list("tenant_id").annotate(n=Count("id")).order_by()
    )
    ids = set(leased) | set(backlog)
    tenants = {t.id: t for t in Tenant.objects.filter(id__in=ids).only("id", "slug", "max_in_flight")}
    out = [
        TenantLoad(str(tid), tenants[tid].slug, leased.get(tid, 0), backlog.get(tid, 0), tenants[tid].max_in_flight)
        for tid in ids
        if tid in tenants
    ]
    out.sort(key=lambda t: (-(t.in_flight + t.backlog), t.slug))
    return out


# How far back the latest dead runs are looked for first.
LATEST_DEAD_WINDOW = timedelta(days=1)


def latest_dead(*, tenant_ids=None, now: datetime | None = None, limit: int = 5) -> list[Run]:
    """The newest dead runs, for the dashboard's way into the dead-letter queue.
    Cost: `run_dead_idx`, one range per tenant over the last LATEST_DEAD_WINDOW; the index leads
    with the tenant, so newest-first over every tenant is a sort of what it reads, which is
    the whole dead-letter queue only when fewer than `limit` runs died in that window."""
    now = now or db_now()
    dead = (Run.objects.filter(state=RunState.DEAD, tenant_id__in=_tenant_list(tenant_ids))
            .select_related("schedule", "tenant").order_by("-finished_at", "-id"))
    latest = list(dead.filter(finished_at__gt=now - LATEST_DEAD_WINDOW)[:limit])
    return latest if len(latest) == limit else list(dead[:limit])


@dataclass
class Dashboard:
    now: datetime
    lag: Lag
    overdue: Overdue
    states: StateCounts
    dead_letter: DeadLetter
    tenants: list = field(default_factory=list)
    latest_dead: list = field(default_factory=list)


def dashboard(*, tenant_ids=None, live: dict | None = None) -> Dashboard:
    """Every figure of the dashboard; `live`: live_counts, when the caller has them already."""
    now = db_now()
    floor = recent_attempt_floor()
    live = live_counts(tenant_ids=tenant_ids) if live is None else live
    return Dashboard(
        now=now,
        lag=scheduled_to_start_lag(tenant_ids=tenant_ids, now=now, floor=floor),
        overdue=overdue(tenant_ids=tenant_ids, now=now),
        states=runs_by_state(tenant_ids=tenant_ids, now=now, live=live),
        dead_letter=dead_letter(tenant_ids=tenant_ids, now=now, size=live[RunState.DEAD.value]),
        tenants=per_tenant(tenant_ids=tenant_ids, now=now),
        latest_dead=latest_dead(tenant_ids=tenant_ids, now=now),
    )


def fingerprint(*, tenant_ids=None, live: dict | None = None, also=None) -> str:
    """A cheap token that changes whenever the dashboard's figures would: the live-state totals
    (`live`, when the caller has counted them already) and the newest attempt id. Pollers compare
    it to skip the full dashboard when nothing moved; `also`: anything else the caller's figures
    follow (the dashboard: how far the activity loop has counted).
    Cost: live_counts and two index probes."""
    live = live_counts(tenant_ids=tenant_ids) if live is None else live
    parts = {
        **live,
        # Global on purpose: scoping it would need a join walk; a change elsewhere only costs a
        # refresh, it reveals nothing.
        "attempt": Attempt.objects.aggregate(m=Max("id"))["m"] or 0,
        "oldest": _runs(tenant_ids).filter(state=RunState.READY).aggregate(m=Min("next_eligible_at"))["m"],
        "also": also,
    }
    return hashlib.sha1(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def as_dict(value) -> dict:
    """For the metrics endpoint and JSON: dataclasses all the way down (model rows, such as
    `latest_dead`, are the caller's to leave out)."""
    return asdict(value)
