"""The forecast: how many runs will become eligible in each minute ahead, from the schedules
themselves, beside the capacity the fleet has shown (issue 28).

Three tiers: the next hour per minute, the next 24 hours per 5 minutes, the next 7 days per hour.
A bucket counts occurrences by their *eligible* time (nominal + the schedule's spread offset), so a
spread flattens the shape the way the workers will see it. Two sources, never counted twice:

- runs already made and waiting (`ready`, eligible ahead: the scanner's look-ahead), exactly, from
  run_ready_idx (a range over the next 7 days, grouped by minute);
- the schedules' occurrences from their `next_run_at` on (what the scanner has not made yet).

Cost is bounded. The schedules in scope are read in primary-key order, at most EXACT_SCHEDULES of
them: when the scope holds no more, every one is counted (exact). Otherwise the ones read are those
whose id is below the last one read, and since ids are random (UUID4) that is a uniform sample of
the scope with fraction id / 2**128; its counts are scaled up by the inverse and the forecast says
"sampled" with the fraction. Each distinct rule is walked once (20,000 schedules `0 0 * * *` are
one walk), and schedules that fall in the same buckets alike (same rule, first instant, spread
offset, grace and host) are counted together, so a group costs its occurrences in the week once;
past OCCURRENCE_BUDGET such occurrences the schedules not yet counted are left out and the sample
shrinks accordingly (still uniform: they come in id order). Measured in bench/README.md
("Issue 28"). docs/portal.md, "Forecast", says what the page shows.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from django.db.models import Count
from django.db.models.functions import TruncMinute

from dispatch.models import ALL_TENANTS, ActivityMinute, WorkerStat
from runs.models import Run, RunState
from scheduler_project.foundation.dbclock import db_now
from schedules import timeexpr
from schedules.models import Schedule, ScheduleStatus, TargetPrefix
from schedules.services import rule_for
from schedules.spread import spread_offset, spread_problem
from schedules.targets import target_host

# name, span, bucket
TIERS = (
    ("hour", timedelta(hours=1), timedelta(minutes=1)),
    ("day", timedelta(hours=24), timedelta(minutes=5)),
    ("week", timedelta(days=7), timedelta(hours=1)),
)
WEEK = TIERS[-1][1]
EXACT_SCHEDULES = 50_000
OCCURRENCE_BUDGET = 1_000_000
# Occurrences of one rule walked at most (an every-second RRULE has 604,800 in a week).
RULE_OCCURRENCES = 20_000
# Capacity: the busiest minute of this long, and workers seen this recently.
CAPACITY_WINDOW = timedelta(hours=24)
WORKER_ALIVE = timedelta(seconds=30)
DEFAULT_GRACE = 60


@dataclass
class Bucket:
    start: datetime
    due: float = 0.0  # estimated when sampled
    min_grace: int | None = None  # the smallest misfire grace of what falls in it
    hosts: dict = field(default_factory=dict)  # target host -> due (the hour tier only)


@dataclass
class Capacity:
    peak_runs_per_second: float  # the busiest minute of CAPACITY_WINDOW, averaged over the minute
    peak_minute: datetime | None
    workers_alive: int
    mean_latency_seconds: float | None
    budgets: dict  # target host -> max concurrency (the tenants' TargetPrefix budgets in scope)


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
    warnings: list = field(default_factory=list)

    @property
    def method(self) -> str:
        if self.exact:
            return "exact"
        return f"sampled ({self.fraction:.2%} of schedules, scaled up)"

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
    for name, span, step in TIERS:
        buckets = tiers[name]
        if at >= now + span:
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


def _scope(tenant_ids):
    qs = Schedule.objects.filter(enabled=True, status=ScheduleStatus.ACTIVE, next_run_at__isnull=False)
    return qs if tenant_ids is None else qs.filter(tenant_id__in=list(tenant_ids))


@dataclass(frozen=True)
class _Version:
    """What rule_for and the walk read of a version."""

    expression: str
    time_zone: str
    dst_skipped: str
    dst_repeated: str
    end_at: datetime | None


def _rule_key(anchor, version):
    # cron and at() are the same rule whatever the anchor; rate() counts from it, and an RRULE's
    # DTSTART may come from it.
    text = version.expression.strip().upper()
    anchored = text.startswith("RATE(") or "FREQ=" in text
    return (version.expression, version.time_zone, version.dst_skipped, version.dst_repeated,
            anchor if anchored else None, version.end_at)


def _walk(rule, version, after: datetime, until: datetime) -> tuple[list, bool]:
    out = []
    for occ in rule.iter_after(after):
        if occ.at >= until or (version.end_at and occ.at >= version.end_at):
            return out, False
        if not occ.dropped:
            out.append(occ.at)
        if len(out) >= RULE_OCCURRENCES:
            return out, True
    return out, False


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
    if len(host) > 300 or not host or not set(host) <= _HOST_CHARS:
        return "give a target as host:port (letters, digits, '.', '-', ':' and brackets; at most 300 characters)"
    return None


def capacity(*, tenant_ids=None, now: datetime | None = None) -> Capacity:
    now = now or db_now()
    minutes = list(ActivityMinute.objects.filter(tenant_id=ALL_TENANTS, minute__gte=now - CAPACITY_WINDOW)
                   .values_list("minute", "succeeded", "failed", "unknown", "latency_ms_sum", "latency_count"))
    peak, peak_minute, lat_sum, lat_n = 0, None, 0, 0
    for minute, s, f, u, ls, lc in minutes:
        if s + f + u > peak:
            peak, peak_minute = s + f + u, minute
        lat_sum, lat_n = lat_sum + ls, lat_n + lc
    workers = WorkerStat.objects.filter(seen_at__gte=now - WORKER_ALIVE).count()
    prefixes = TargetPrefix.objects.filter(max_concurrency__isnull=False)
    if tenant_ids is not None:
        prefixes = prefixes.filter(tenant_id__in=list(tenant_ids))
    budgets: dict = {}
    for prefix, cap in prefixes.values_list("prefix", "max_concurrency"):
        h = target_host(prefix)
        if h:
            budgets[h] = min(cap, budgets.get(h, cap))
    return Capacity(peak / 60.0, peak_minute, workers, (lat_sum / lat_n / 1000.0) if lat_n else None, budgets)


def forecast(*, tenant_ids=None, host: str | None = None, now: datetime | None = None,
             respread: tuple | None = None, span: timedelta = WEEK) -> Forecast:
    """Runs becoming eligible in each bucket ahead, for every tenant (tenant_ids None), some
    tenants, and/or one target host ("host:port"). `respread` = (schedule ids, window): the
    forecast as it would be if those schedules had that spread window (a bulk spread's preview;
    one whose rule the window does not fit keeps its own, as the change would leave it).
    `span` bounds how far ahead occurrences are walked: /metrics asks for the next hour only, a
    small part of a week's work for sub-hourly rules (the tiers beyond it stay empty)."""
    now = now or db_now()
    tiers = _buckets(now)
    waiting = _materialised(tiers, tenant_ids, host, now)
    until = now + min(span, WEEK)
    scope = _scope(tenant_ids).filter(next_run_at__lt=until)
    # Plain tuples in id order (model instances cost several times more to build, at 50,000 rows).
    rows = list(scope.order_by("id").values_list(
        "id", "anchor_at", "next_run_at", "current__expression", "current__time_zone", "current__dst_skipped",
        "current__dst_repeated", "current__end_at", "current__spread_offset_seconds",
        "current__misfire_grace_seconds", "current__target_url")[:EXACT_SCHEDULES + 1])
    exact = len(rows) <= EXACT_SCHEDULES
    rows = rows[:EXACT_SCHEDULES]
    # Each rule is walked once from the earliest next instant in scope (no more than an hour back:
    # older ones are the scanner's backlog, due now, and mostly misfires).
    after = max(min((r[2] for r in rows), default=now), now - timedelta(hours=1)) - timedelta(microseconds=1)
    walks: dict = {}
    fits: dict = {}
    hosts: dict = {}
    # Schedules that fall in the same buckets alike (same rule, first instant, offset, grace and
    # host) are counted together: a fleet of `0 0 * * *` costs one pass over its week per offset.
    groups: dict = {}
    truncated = spent = counted = 0
    for sid, anchor, next_at, expression, tz, dst_s, dst_r, end_at, offset, grace, url in rows:
        h = hosts.get(url)
        if h is None:
            h = hosts[url] = target_host(url)
        if host and h != host:
            counted += 1
            continue
        v = _Version(expression, tz, dst_s, dst_r, end_at)
        key = _rule_key(anchor, v)
        if key not in walks:
            try:
                walked, cut = _walk(rule_for(v, anchor), v, after, until)
            except timeexpr.ExpressionError:
                walked, cut = [], False  # parked by the scanner: it makes nothing meanwhile
            truncated += cut
            walks[key] = walked
        instants = walks[key]
        if respread and str(sid) in respread[0]:
            if key not in fits:
                fits[key] = _fits(respread[1], v, anchor, now)
            if fits[key]:
                offset = spread_offset(sid, respread[1])  # the preview's counts only
        first = bisect.bisect_left(instants, next_at)
        group = (key, first, offset, grace, h)
        if group not in groups:
            # Past the budget the schedules read so far are the sample (an id-ordered prefix).
            if spent + len(instants) - first > OCCURRENCE_BUDGET and counted:
                exact = False
                break
            spent += len(instants) - first
            groups[group] = 0
        groups[group] += 1
        counted += 1
    # The counted schedules are the first `counted` of the scope in id order: a uniform sample
    # with fraction (last id counted + 1) / 2**128 unless every schedule of the scope was counted.
    if exact:
        fraction = 1.0
    else:
        last = rows[counted - 1][0].int if counted else 0
        fraction = max((last + 1) / 2 ** 128, 1e-12)
    scale = 1.0 / fraction
    for (key, first, offset, grace, h), n in groups.items():
        shift = timedelta(seconds=offset)
        for at in walks[key][first:]:
            _add(tiers, max(at + shift, now), n * scale, grace=grace, host=h, now=now)
    f = Forecast(now=now, tiers=tiers, exact=exact, fraction=fraction, schedules_counted=counted,
                 schedules_estimated=counted * scale, waiting_now=waiting,
                 capacity=capacity(tenant_ids=tenant_ids, now=now), truncated_rules=truncated)
    f.warnings = warnings(f)
    return f


def _fits(window: int, version, anchor, now: datetime) -> bool:
    try:
        return spread_problem(window, rule_for(version, anchor), after=now) is None
    except timeexpr.ExpressionError:
        return False


def warnings(f: Forecast) -> list[str]:
    """Minutes of the next hour whose runs the fleet would not start within their misfire grace,
    at the peak rate it has shown, or that a target's concurrency budget would not drain in it."""
    out = []
    cap = f.capacity
    for b in f.tiers["hour"]:
        if b.due < 1:
            continue
        grace = b.min_grace if b.min_grace is not None else DEFAULT_GRACE
        at = b.start.strftime("%H:%M")
        if cap.peak_runs_per_second > 0:
            drain = b.due / cap.peak_runs_per_second
            if drain > grace + 60:
                out.append(f"{at}: {b.due:,.0f} due; at the observed {cap.peak_runs_per_second:,.1f} runs/s the last "
                           f"starts about {_minutes(drain)} later, past the misfire grace of {grace} s")
        for h, n in sorted(b.hosts.items()):
            budget = cap.budgets.get(h)
            if budget and cap.mean_latency_seconds:
                drain = n * cap.mean_latency_seconds / budget
                if drain > grace + 60:
                    out.append(f"{at}: {n:,.0f} due for {h}; its budget of {budget} in flight at "
                               f"{cap.mean_latency_seconds:.2f} s a call starts the last about {_minutes(drain)} later")
    if cap.peak_runs_per_second == 0 and any(b.due >= 1 for b in f.tiers["hour"]):
        out.append("no dispatch observed in the last 24 hours: capacity unknown")
    return out


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
        "sampledFraction": f.fraction,
        "schedulesCounted": f.schedules_counted,
        "schedulesEstimated": round(f.schedules_estimated),
        "waitingNow": f.waiting_now,
        "truncatedRules": f.truncated_rules,
        "tiers": {name: [{"start": iso(b.start), "due": round(b.due, 1)} for b in f.tiers[name]]
                  for name, _, _ in TIERS},
        "nextHourPeak": ({"start": iso(p.start), "due": round(p.due, 1)} if (p := f.peak()) else None),
        "capacity": {"peakRunsPerSecond": round(f.capacity.peak_runs_per_second, 2),
                     "peakMinute": iso(f.capacity.peak_minute), "workersAlive": f.capacity.workers_alive,
                     "meanLatencySeconds": f.capacity.mean_latency_seconds,
                     "targetBudgets": f.capacity.budgets},
        "warnings": f.warnings,
    }
