"""The forecast: how many runs will become eligible in each minute ahead, from the schedules
themselves, beside the capacity the fleet has shown (issue 28).

Three tiers: the next hour per minute, the next 24 hours per 5 minutes, the next 7 days per hour.
A bucket counts occurrences by their *eligible* time (nominal + the schedule's spread offset), so a
spread flattens the shape the way the workers will see it. Two sources, never counted twice:

- runs already made and waiting (`ready`, eligible ahead: the scanner's look-ahead), exactly, from
  run_ready_idx (a range over the next 7 days, grouped by minute);
- the schedules' occurrences from their `next_run_at` on (what the scanner has not made yet).

Cost is bounded. The size of the scope comes from the counts the database keeps (one small read).
Up to EXACT_SCHEDULES every schedule is counted; beyond, a uniform sample: the schedules whose id is
below fraction * 2**128 (ids are random UUID4s), about SAMPLE_SCHEDULES of them, counts scaled up by
1 / fraction, and each bucket carries its sampling error (95%), which the page and the API state.
Either way the schedules are grouped in the database by everything the buckets depend on (rule,
zone, DST policy, anchor where the rule counts from it, next instant, spread offset, grace, target):
most fleets share few distinct rules, so 20,000 schedules `0 0 * * *` are one row and the Python
work is per group. Each distinct rule is expanded once over the window (dispatch.forecast_counts:
rate(), cron and RRULEs that repeat within a day by arithmetic, other rules walked, bounded), and
each group counted per bucket from it. Past OCCURRENCE_BUDGET of that work the sample is halved and
counted again. Measured in bench/README.md ("Issue 28"). docs/portal.md, "Forecast", says what the
page shows.
"""

from __future__ import annotations

import dataclasses
import math
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from django.db import connection, transaction
from django.db.models import Case, Count, DateTimeField, F, Q, Sum, Value, When
from django.db.models.functions import TruncMinute

from dispatch import forecast_counts as fcounts
from dispatch import forecast_store
from dispatch.models import ALL_TENANTS, LAG_BOUNDS, ActivityMinute, WorkerStat
from runs.models import Run, RunState
from scheduler_project.foundation.dbclock import db_now
from schedules import timeexpr
from schedules.models import Schedule, ScheduleStatus, TargetPrefix, TenantScheduleCount
from schedules.services import rule_for
from schedules.spread import spread_offset, spread_problem
from schedules.targets import UrlOrigin, host_key, target_host

# name, span, bucket
TIERS = (
    ("hour", timedelta(hours=1), timedelta(minutes=1)),
    ("day", timedelta(hours=24), timedelta(minutes=5)),
    ("week", timedelta(days=7), timedelta(hours=1)),
)
WEEK = TIERS[-1][1]
# Up to this many schedules in scope every one is counted (grouped in the database, so the cost in
# Python is per distinct group, not per schedule); beyond it a uniform sample of about
# SAMPLE_SCHEDULES. The database's part at these sizes is measured in bench/README.md (Issue 28).
EXACT_SCHEDULES = 200_000
SAMPLE_SCHEDULES = 50_000
# Read the schedules' groups from the kept summary (dispatch.forecast_store) rather than group
# every schedule again: exact at any size. A respread preview still reads the schedules (it
# changes some schedules' offsets), and so does a forecast past OCCURRENCE_BUDGET (sampled).
INCREMENTAL = True
# Work units of one forecast in Python: instants listed for the distinct rules plus buckets counted
# for the groups (at most about 520 a group).
OCCURRENCE_BUDGET = 3_000_000
# Occurrences walked one next_after at a time (RRULEs, at(), cron on DST days) over all the rules
# of one forecast: walking costs far more than counting, and tens of distinct every-minute RRULEs
# walked for a week kept a page past gunicorn's worker timeout (found by bench/soak.py). Rules met
# after the budget is spent are counted in part and reported as truncated.
WALK_BUDGET = 150_000
# A sample's per-bucket error is stated as this many standard errors (95%).
Z95 = 1.96
# Capacity: the busiest minute of this long, and workers seen this recently.
CAPACITY_WINDOW = timedelta(hours=24)
WORKER_ALIVE = timedelta(seconds=30)
DEFAULT_GRACE = 60
# The busiest minute measures the fleet's capacity only if the fleet was behind in some minute:
# at least BEHIND_SHARE of the first attempts that began in it started more than BEHIND_SECONDS
# after they were due. A fleet that was never behind has only shown a lower bound (a new install,
# a quiet day), and warning from it would cry wolf at every minute busier than the past.
BEHIND_SECONDS = 5
BEHIND_SHARE = 0.1
_LATE_BUCKETS = next(i for i, bound in enumerate(LAG_BOUNDS) if bound >= BEHIND_SECONDS) + 1


@dataclass
class Bucket:
    start: datetime
    due: float = 0.0  # estimated when sampled
    var: float = 0.0  # the sampling variance of `due` (0 when exact)
    min_grace: int | None = None  # the smallest misfire grace of what falls in it
    hosts: dict = field(default_factory=dict)  # target host -> due (the hour tier only)


    @property
    def error(self) -> float:
        """Half the 95% interval of `due` (0 when exact)."""
        return Z95 * math.sqrt(self.var)


@dataclass
class Capacity:
    peak_runs_per_second: float  # the busiest minute of CAPACITY_WINDOW, averaged over the minute
    peak_minute: datetime | None
    workers_alive: int
    mean_latency_seconds: float | None
    budgets: dict  # target host -> max concurrency (the tenants' TargetPrefix budgets in scope)
    # The fleet was behind in some minute of the window (BEHIND_SECONDS), so the peak is its rate
    # when it had more than it could start; otherwise the peak is only a lower bound.
    measured: bool = False


@dataclass
class Forecast:
    now: datetime
    tiers: dict  # name -> list[Bucket]
    exact: bool
    fraction: float  # of the scope's schedules counted (1.0 when exact)
    schedules_counted: int
    schedules_estimated: float
    waiting_now: int  # ready runs already eligible (the backlog at this moment)
    capacity: Capacity
    truncated_rules: int = 0  # rules with more occurrences in the week than RULE_OCCURRENCES
    incremental: bool = False  # counted from the kept summary (dispatch.forecast_store)
    warnings: list = field(default_factory=list)
    # What the forecast cannot tell (a capacity never measured), said once instead of as warnings.
    notes: list = field(default_factory=list)

    @property
    def method(self) -> str:
        if self.exact:
            return "exact"
        return f"sampled ({self.fraction:.2%} of schedules, scaled up)"

    @property
    def stated_error(self) -> str:
        """What the counts are worth, in words for the page."""
        if self.exact and self.incremental:
            return ("exact: every schedule in scope counted, from the schedules' group counts the database keeps "
                    "as they change")
        if self.exact:
            return "exact: every schedule in scope counted"
        peak = self.peak()
        text = (f"sampled: {self.schedules_counted:,} schedules counted, a uniform {self.fraction:.3%} by id, "
                f"scaled up; each bucket's count is within its stated error at 95%")
        if peak and peak.due:
            text += f" (the next hour's peak: {peak.due:,.0f} \u00b1 {peak.error:,.0f})"
        return text

    def peak(self, tier: str = "hour") -> Bucket | None:
        buckets = self.tiers[tier]
        return max(buckets, key=lambda b: b.due) if buckets else None


def _buckets(now: datetime) -> dict:
    start = now.replace(second=0, microsecond=0)
    out = {}
    for name, span, step in TIERS:
        n = int(span / step)
        if step >= timedelta(hours=1):
            first = start.replace(minute=0)
        else:
            first = start - timedelta(minutes=start.minute % int(step.total_seconds() // 60))
        out[name] = [Bucket(first + i * step) for i in range(n + 1)]
    return out


def _add(tiers: dict, at: datetime, n: float, *, grace: int | None, host: str | None, now: datetime) -> None:
    start = now.replace(second=0, microsecond=0)
    for name, span, step in TIERS:
        buckets = tiers[name]
        if at >= start + span:
            continue
        i = max(0, int((at - buckets[0].start) / step))
        if i >= len(buckets):
            continue
        b = buckets[i]
        b.due += n
        if grace is not None:
            b.min_grace = grace if b.min_grace is None else min(b.min_grace, grace)
        if host is not None and name == "hour":
            b.hosts[host] = b.hosts.get(host, 0) + n


def _materialised(tiers, tenant_ids, host, now) -> int:
    """Runs already made and waiting (exact); returns how many are already eligible."""
    ready = Run.objects.filter(state=RunState.READY, next_eligible_at__lt=now + WEEK)
    if tenant_ids is not None:
        ready = ready.filter(tenant_id__in=list(tenant_ids))
    if host:
        ready = ready.filter(target_host=host)
    waiting = ready.filter(next_eligible_at__lte=now).count()
    ahead = (ready.filter(next_eligible_at__gt=now).annotate(m=TruncMinute("next_eligible_at"))
             .values("m", "target_host").annotate(n=Count("id")).order_by())
    for row in ahead:
        _add(tiers, row["m"], row["n"], grace=None, host=row["target_host"], now=now)
    return waiting


_HOST_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_:[]")


def host_problem(host: str) -> str | None:
    """Why `host` cannot be a target host filter ("host:port", as run lists and budgets name
    targets), or None."""
    if len(host) > 300 or not host or not set(host) <= _HOST_CHARS or host_key(host) is None:
        return ("give a target as host:port, e.g. billing.internal:443 or [::1]:9000 (letters, digits, '.', '-', "
                "':' and brackets; a port from 1 to 65535; at most 300 characters)")
    return None


def capacity(*, tenant_ids=None, now: datetime | None = None) -> Capacity:
    now = now or db_now()
    minutes = list(ActivityMinute.objects.filter(tenant_id=ALL_TENANTS, minute__gte=now - CAPACITY_WINDOW)
                   .values_list("minute", "succeeded", "failed", "unknown", "latency_ms_sum", "latency_count",
                                "lag_counts"))
    peak, peak_minute, lat_sum, lat_n, measured = 0, None, 0, 0, False
    for minute, s, f, u, ls, lc, lags in minutes:
        if s + f + u > peak:
            peak, peak_minute = s + f + u, minute
        lat_sum, lat_n = lat_sum + ls, lat_n + lc
        late = sum(lags[_LATE_BUCKETS:]) if lags else 0
        measured = measured or (late > 0 and late >= BEHIND_SHARE * sum(lags))
    workers = WorkerStat.objects.filter(seen_at__gte=now - WORKER_ALIVE).count()
    prefixes = TargetPrefix.objects.filter(max_concurrency__isnull=False)
    if tenant_ids is not None:
        prefixes = prefixes.filter(tenant_id__in=list(tenant_ids))
    budgets: dict = {}
    for prefix, cap in prefixes.values_list("prefix", "max_concurrency"):
        h = target_host(prefix)
        if h:
            budgets[h] = min(cap, budgets.get(h, cap))
    return Capacity(peak / 60.0, peak_minute, workers, (lat_sum / lat_n / 1000.0) if lat_n else None, budgets,
                    measured)


def _scope(tenant_ids):
    qs = Schedule.objects.filter(enabled=True, status=ScheduleStatus.ACTIVE, next_run_at__isnull=False)
    return qs if tenant_ids is None else qs.filter(tenant_id__in=list(tenant_ids))


def _scope_size(tenant_ids) -> int:
    """Schedules not archived in scope, from the counts the database keeps (one small read)."""
    qs = TenantScheduleCount.objects.all()
    if tenant_ids is not None:
        qs = qs.filter(tenant_id__in=list(tenant_ids))
    return qs.aggregate(n=Sum("live"))["n"] or 0


# The group key read per row of the grouped query: every field the week's buckets depend on.
_GROUP_FIELDS = ("current__expression", "current__time_zone", "current__dst_skipped", "current__dst_repeated",
                 "current__end_at", "anchored", "next_run_at", "current__spread_offset_seconds",
                 "current__misfire_grace_seconds", "current__target_url")


def _anchored():
    # cron and at() are the same rule whatever the anchor; rate() counts from it, and an RRULE's
    # DTSTART may come from it: only those keep the anchor in the group key.
    return Case(When(Q(current__expression__icontains="rate(") | Q(current__expression__icontains="freq="),
                     then=F("anchor_at")), default=Value(None), output_field=DateTimeField())


def _grouped(qs, *, few: bool) -> list:
    """(expression, zone, dst_skipped, dst_repeated, end_at, anchor or None, next_run_at, offset,
    grace, target origin, count) of the schedules of `qs`, grouped in the database: 20,000 schedules
    `0 0 * * *` due at one midnight to one target are one row. `few`: qs is a small part of the
    schedules (a sample, one tenant)."""
    # By the target's origin, not its whole URL (forecast_store.grouped says why).
    fields = tuple("origin" if f == "current__target_url" else f for f in _GROUP_FIELDS)
    rows = (qs.annotate(anchored=_anchored(), origin=UrlOrigin("current__target_url")).values_list(*fields)
            .annotate(n=Count("id")).order_by())
    if not few or connection.vendor != "postgresql":
        return list(rows)
    # PostgreSQL estimates looking 50,000 versions up by key dearer than reading all of them to hash
    # them, and at millions of versions that read is most of a forecast's time (bench/README.md,
    # Issue 28): for a small part of the fleet, join by key.
    with transaction.atomic(), connection.cursor() as c:
        c.execute("SET LOCAL enable_hashjoin = off")
        c.execute("SET LOCAL enable_mergejoin = off")
        return list(rows)


@dataclass(frozen=True)
class Respread:
    """A bulk spread's selection (runs.actions.schedules_for_spread: a tenant's schedules,
    optionally of one target host and one expression as written) and the window it would give them."""

    tenant_id: uuid.UUID
    window: int
    host: str | None = None
    expression: str | None = None

    def q(self) -> Q:
        q = Q(tenant_id=self.tenant_id)
        return q & Q(current__expression=self.expression) if self.expression else q


@dataclass(frozen=True)
class _Version:
    """What rule_for reads of a version."""

    expression: str
    time_zone: str
    dst_skipped: str
    dst_repeated: str


class _OverBudget(Exception):
    pass


class _Counter:
    """Adds groups of schedules to the tiers: expands each distinct rule once over the window
    (dispatch.forecast_counts), counts each group's occurrences per bucket, and keeps the work
    spent under OCCURRENCE_BUDGET (instants listed plus buckets counted)."""

    def __init__(self, tiers, start, span, now, host):
        self.tiers, self.now, self.host = tiers, now, host
        self.lo = start - timedelta(hours=1)  # older next instants are the scanner's backlog, due now
        self.hi = start + min(span, WEEK)
        self.start_s = fcounts.seconds(start)
        self.hi_s = fcounts.seconds(self.hi)
        # name -> (first bucket start, step, number of buckets, end) in epoch seconds
        self.meta = {}
        for name, tspan, step in TIERS:
            b0 = fcounts.seconds(tiers[name][0].start)
            self.meta[name] = (b0, int(step.total_seconds()), len(tiers[name]),
                               min(self.start_s + int(tspan.total_seconds()), self.hi_s))
        self.rules: dict = {}
        self.hosts: dict = {}
        self.fits: dict = {}
        self.spent = 0
        self.truncated = 0
        self.walked = 0
        self.groups: dict = {}

    def host_of(self, url):
        h = self.hosts.get(url)
        if h is None:
            h = self.hosts[url] = target_host(url)
        return h

    def counts_for(self, version, anchor):
        key = (version, anchor)
        got = self.rules.get(key)
        if got is None:
            try:
                # cron and at() ignore the anchor (the group key has None for them)
                got = fcounts.occurrence_counts(rule_for(version, anchor or self.lo), self.lo, self.hi,
                                                walk_limit=min(fcounts.RULE_OCCURRENCES,
                                                               WALK_BUDGET - self.walked))
            except timeexpr.ExpressionError:
                got = fcounts.Counts([])  # parked by the scanner: it makes nothing meanwhile
            self.truncated += got.truncated
            self.walked += getattr(got, "walked", 0)
            self.spent += len(got) if isinstance(got, fcounts.Counts) else 1
            self.rules[key] = got
            if self.spent > OCCURRENCE_BUDGET:
                raise _OverBudget
        return got

    def take(self, row, n: int, offset: int | None = None) -> bool:
        """One grouped row (n schedules); offset overrides the row's (a respread preview). Returns
        whether it is in scope (its target host)."""
        expression, tz, dst_s, dst_r, end_at, anchor, next_at, row_offset, grace, url, *_ = row
        h = self.host_of(url)
        if self.host and h != self.host:
            return False
        counts = self.counts_for(_Version(expression, tz, dst_s, dst_r), anchor)
        first = counts.first_at_or_after(max(math.ceil((next_at - fcounts.EPOCH).total_seconds()),
                                             fcounts.seconds(self.lo)))
        if end_at is not None:
            stop = math.ceil((end_at - fcounts.EPOCH).total_seconds())
        else:
            stop = self.hi_s
        if first is None or first >= stop:
            return True
        shift = row_offset if offset is None else offset
        if counts.minute_aligned:
            # Instants and bucket edges on whole minutes: only the offset's whole minutes move one
            # across an edge, so schedules a few seconds apart count alike.
            shift -= shift % 60
        key = (id(counts), first, min(stop, self.hi_s), shift, grace, h)
        if key not in self.groups:
            self.groups[key] = [counts, 0]
        self.groups[key][1] += n
        return True

    def add_all(self, scale: float, var_weight: float) -> None:
        """Every group into the buckets: due += count * schedules * scale, and the sampling
        variance of that estimate, var_weight * schedules * count**2 (each schedule of the sample
        brings its own count in that bucket)."""
        for (_, first, stop, shift, grace, h), (counts, n) in self.groups.items():
            occurrences = counts.count(first, stop)
            self.spent += min(occurrences, 520)
            if self.spent > OCCURRENCE_BUDGET:
                raise _OverBudget
            if not occurrences:
                continue
            for name, (b0, step, nb, end) in self.meta.items():
                per = {}
                if occurrences <= nb:
                    for t in counts.between(first, stop):
                        e = t + shift
                        if e >= end:
                            break
                        i = max(0, (e - b0) // step)
                        per[i] = per.get(i, 0) + 1
                else:
                    for i in range(nb):
                        lo = first if i == 0 else max(first, b0 + i * step - shift)
                        hi = min(b0 + (i + 1) * step, end) - shift
                        c = counts.count(lo, min(hi, stop))
                        if c:
                            per[i] = c
                buckets = self.tiers[name]
                for i, c in per.items():
                    if i >= nb:
                        continue
                    b = buckets[i]
                    b.due += c * n * scale
                    b.var += var_weight * n * c * c
                    b.min_grace = grace if b.min_grace is None else min(b.min_grace, grace)
                    if name == "hour":
                        b.hosts[h] = b.hosts.get(h, 0) + c * n * scale


def forecast(*, tenant_ids=None, host: str | None = None, now: datetime | None = None,
             respread: Respread | None = None, span: timedelta = WEEK, incremental: bool | None = None) -> Forecast:
    """Runs becoming eligible in each bucket ahead, for every tenant (tenant_ids None), some
    tenants, and/or one target host ("host:port"). `respread`: the forecast as it would be if the
    schedules of a bulk spread's selection had its window (the preview; one whose rule the window
    does not fit keeps its own, as the change would leave it).
    `span` bounds how far ahead occurrences are counted: /metrics asks for the next hour only.

    Steps: (1) the runs already made ahead, exactly; (2) the schedules' groups (everything the
    buckets depend on, with how many schedules share it): from the summary the database keeps
    (dispatch.forecast_store) unless `incremental` is False or this is a respread preview; else
    grouped again from the schedules, every one up to EXACT_SCHEDULES in scope (from the counts
    the database keeps) and a uniform sample by id of about SAMPLE_SCHEDULES beyond; (3) each
    distinct rule expanded once, each group counted per bucket; past OCCURRENCE_BUDGET a sample
    (halved each time) is counted again."""
    now = now or db_now()
    host = (host_key(host) or host) if host else None  # as typed (`[::1]:9000`) to as kept (`::1:9000`)
    if respread is not None and respread.host:
        respread = dataclasses.replace(respread, host=host_key(respread.host) or respread.host)
    tiers = _buckets(now)
    waiting = _materialised(tiers, tenant_ids, host, now)
    start = now.replace(second=0, microsecond=0)
    until = start + min(span, WEEK)
    size = _scope_size(tenant_ids)
    fraction = 1.0 if size <= EXACT_SCHEDULES else min(1.0, SAMPLE_SCHEDULES / size)
    rules_cache = None
    counter = None
    summary = INCREMENTAL if incremental is None else incremental
    if summary and respread is None:
        # Every schedule, from the kept summary (dispatch.forecast_store): exact at any size.
        counter = _Counter(_buckets(now), start, span, now, host)
        counted = 0
        try:
            for row in forecast_store.grouped(tenant_ids=tenant_ids, until=until):
                counted += row[-1] if counter.take(row, row[-1]) else 0
            counter.add_all(1.0, 0.0)
            fraction = 1.0
        except _OverBudget:
            rules_cache, counter = counter.rules, None
            fraction = min(fraction / 2, SAMPLE_SCHEDULES / max(size, 1))
    else:
        summary = False
    scope = _scope(tenant_ids).filter(next_run_at__lt=until)
    while counter is None:
        counter = _Counter(_buckets(now), start, span, now, host)
        if rules_cache is not None:
            counter.rules = rules_cache
        sample = scope
        if fraction < 1.0:
            bound = int(fraction * 2 ** 128)
            sample = scope.filter(id__lt=uuid.UUID(int=bound))
        try:
            counted = 0
            if respread:
                # The selection row by row (each its own offset under the new window), the rest grouped.
                selected = sample.filter(respread.q()).annotate(anchored=_anchored()).values_list(*_GROUP_FIELDS, "id")
                for row in selected.iterator(chunk_size=5000):
                    offset = None
                    if not respread.host or counter.host_of(row[9]) == respread.host:
                        offset = _respread_offset(counter, row, respread.window, now)
                    counted += counter.take(row, 1, offset)
                sample = sample.exclude(respread.q())
            few = fraction < 1.0 or (tenant_ids is not None and size <= SAMPLE_SCHEDULES * 4)
            for row in _grouped(sample, few=few):
                counted += row[-1] if counter.take(row, row[-1]) else 0
            scale = 1.0 / fraction
            counter.add_all(scale, (1 - fraction) / fraction ** 2)
        except _OverBudget:
            rules_cache, counter = counter.rules, None
            fraction = min(fraction / 2, SAMPLE_SCHEDULES / max(size, 1))
            if fraction < 1e-9:
                raise
    counted_tiers = counter.tiers
    # A sample's variance is estimated from the schedules it holds, so a bucket where it holds none
    # (or few) of a rule's schedules would state an error of zero while schedules it missed fall
    # there. Each sampled bucket's variance is at least that of one schedule the sample may miss.
    floor = (1 - fraction) / fraction ** 2 if fraction < 1.0 else 0.0
    for name in tiers:
        for b, c in zip(tiers[name], counted_tiers[name]):
            b.due += c.due
            b.var += max(c.var, floor)
            if c.min_grace is not None:
                b.min_grace = c.min_grace if b.min_grace is None else min(b.min_grace, c.min_grace)
            for h, n in c.hosts.items():
                b.hosts[h] = b.hosts.get(h, 0) + n
    exact = fraction >= 1.0
    f = Forecast(now=now, tiers=tiers, exact=exact, fraction=fraction, schedules_counted=counted,
                 schedules_estimated=counted / fraction, waiting_now=waiting,
                 capacity=capacity(tenant_ids=tenant_ids, now=now), truncated_rules=counter.truncated,
                 incremental=summary and exact)
    f.warnings = warnings(f)
    f.notes = notes(f)
    return f


def _respread_offset(counter, row, window, now):
    """The offset a schedule of a bulk spread's preview would have, or None (keeps its own: the
    window does not fit its rule)."""
    expression, tz, dst_s, dst_r, _end, anchor, *_rest, sid = row
    key = (expression, tz, dst_s, dst_r, anchor)
    if key not in counter.fits:
        counter.fits[key] = _fits(window, _Version(expression, tz, dst_s, dst_r), anchor or now, now)
    return spread_offset(sid, window) if counter.fits[key] else None


def _fits(window: int, version, anchor, now: datetime) -> bool:
    try:
        return spread_problem(window, rule_for(version, anchor), after=now) is None
    except timeexpr.ExpressionError:
        return False


def _past_grace(f: Forecast, b: Bucket) -> float | None:
    """Seconds the bucket's runs take to start at the fleet's peak rate, when past their grace."""
    if b.due < 1 or f.capacity.peak_runs_per_second <= 0:
        return None
    drain = b.due / f.capacity.peak_runs_per_second
    grace = b.min_grace if b.min_grace is not None else DEFAULT_GRACE
    return drain if drain > grace + 60 else None


def warnings(f: Forecast) -> list[str]:
    """Minutes of the next hour whose runs the fleet would not start within their misfire grace,
    at the peak rate it has shown when it was behind, or that a target's concurrency budget would
    not drain in it."""
    out = []
    cap = f.capacity
    for b in f.tiers["hour"]:
        if b.due < 1:
            continue
        grace = b.min_grace if b.min_grace is not None else DEFAULT_GRACE
        at = b.start.strftime("%H:%M")
        if cap.measured:
            drain = _past_grace(f, b)
            if drain is not None:
                out.append(f"{at}: {b.due:,.0f} due; at the observed {cap.peak_runs_per_second:,.1f} runs/s the last "
                           f"starts about {_minutes(drain)} later, past the misfire grace of {grace} s")
        for h, n in sorted(b.hosts.items()):
            budget = cap.budgets.get(h)
            if budget and cap.mean_latency_seconds:
                drain = n * cap.mean_latency_seconds / budget
                if drain > grace + 60:
                    out.append(f"{at}: {n:,.0f} due for {h}; its budget of {budget} in flight at "
                               f"{cap.mean_latency_seconds:.2f} s a call starts the last about {_minutes(drain)} later")
    return out


def notes(f: Forecast) -> list[str]:
    """What the forecast cannot tell: minutes of the next hour busier than anything the fleet has
    started while it was never behind, whose runs may or may not start in time."""
    cap = f.capacity
    if cap.measured:
        return []
    if cap.peak_runs_per_second == 0:
        due = any(b.due >= 1 for b in f.tiers["hour"])
        return ["capacity unknown: no dispatch observed in the last 24 hours"] if due else []
    beyond = [b for b in f.tiers["hour"] if _past_grace(f, b) is not None]
    if not beyond:
        return []
    top = max(beyond, key=lambda b: b.due)
    return [f"capacity not measured yet: in the last 24 hours no minute left runs waiting over {BEHIND_SECONDS} s, "
            f"so {_rate(cap.peak_runs_per_second)} runs/s (the busiest minute) is only a lower bound. "
            f"{len(beyond)} minute(s) of the next hour are busier than that; the busiest, "
            f"{top.start.strftime('%H:%M')}, has {top.due:,.0f} due ({top.due / 60 / cap.peak_runs_per_second:,.0f}x "
            f"that minute's rate)."]


def _rate(per_second: float) -> str:
    return f"{per_second:,.1f}" if per_second >= 1 else f"{per_second:.2f}"


def _minutes(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min"


def as_json(f: Forecast) -> dict:
    def iso(dt):
        return dt.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ") if dt else None

    return {
        "at": iso(f.now),
        "method": "exact" if f.exact else "sampled",
        "source": "summary" if f.incremental else "schedules",
        "sampledFraction": f.fraction,
        "schedulesCounted": f.schedules_counted,
        "schedulesEstimated": round(f.schedules_estimated),
        "waitingNow": f.waiting_now,
        "truncatedRules": f.truncated_rules,
        "statedError": f.stated_error,
        "tiers": {name: [{"start": iso(b.start), "due": round(b.due, 1), "error": round(b.error, 1)}
                         for b in f.tiers[name]]
                  for name, _, _ in TIERS},
        "nextHourPeak": ({"start": iso(p.start), "due": round(p.due, 1), "error": round(p.error, 1)}
                         if (p := f.peak()) else None),
        "capacity": {"peakRunsPerSecond": round(f.capacity.peak_runs_per_second, 2),
                     "peakMinute": iso(f.capacity.peak_minute), "workersAlive": f.capacity.workers_alive,
                     "meanLatencySeconds": f.capacity.mean_latency_seconds,
                     "targetBudgets": f.capacity.budgets, "measured": f.capacity.measured},
        "warnings": f.warnings,
        "notes": f.notes,
    }
