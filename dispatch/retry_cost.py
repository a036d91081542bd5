"""What retries cost, per schedule, per owner and per target host, over the last 24 hours and 7
days: attempts per successful run, time spent in failed attempts and waiting in backoff, and the
share of runs that needed a retry. docs/incidents.md ("Retry cost") says exactly what each figure
counts.

Written by the activity loop (dispatch.activity), which already reads every finished attempt with
its run once: `RetryTally` folds a pass's attempts into hourly RetryCostHour rows, one per
(tenant, dimension, key, hour). Its cost per pass: the pass's attempts, plus, for those that are
not a run's first (generation > 1), their runs' earlier attempts by the attempts' unique index
(on the run's partition), plus one primary-key read of the pass's schedules for their owners.

Read by the schedule and owner pages and GET /api/v1/retry-cost:
- one key (`figures_for`): its hourly rows of the window, at most one per hour (168 for 7 days),
  by the prefix of `retry_cost_hour_unique`;
- the ranking (`ranking`): the window's rows that had a retry (`retry_cost_retried_idx`), summed
  per key, then the whole window of the top keys; keys without a retry follow in key order, at
  most the limit of them (by the unique index, at most 168 rows each);
- both add what the activity loop has not counted yet (`uncounted`): attempts after its
  watermark and parked ones that have ended, at most TAIL of them, so the figures agree with the
  attempts the API lists as soon as those attempts have ended. The tail is an id range of at most
  TAIL attempts after the watermark (whoever's they are), so a stopped loop costs a bounded read
  and the figures say they are incomplete. The loop may commit a pass while a page reads: the
  cursor is read before and after, and the read repeated if it moved, so no attempt is counted
  twice or missed.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from django.db.models import Max, Q, Sum

from dispatch import activity_store
from dispatch.models import ActivityCursor, ActivityPending, CostDimension, RetryCostHour
from runs.models import Attempt, AttemptOutcome, attempts_with_their_runs
from schedules.models import Schedule

WINDOWS = {"24h": timedelta(hours=24), "7d": timedelta(days=7)}
# A little more than the longest window, so its first hour is still whole.
RETENTION = timedelta(days=8)
# The most attempts not yet counted by the activity loop that one read adds (a loop that keeps
# up leaves a few seconds' worth); past it the figures say they are incomplete.
TAIL = 20_000
PRUNE_BATCH = 5000

COUNTED = (AttemptOutcome.SUCCEEDED, AttemptOutcome.FAILED, AttemptOutcome.UNKNOWN)
FAILED = (AttemptOutcome.FAILED, AttemptOutcome.UNKNOWN)
# The attempt fields the fold needs (the activity loop reads them with its own).
FIELDS = ("id", "generation", "started_at", "finished_at", "outcome", "run_id", "run__tenant_id", "run__schedule_id",
          "run__scheduled_time", "run__target_host", "run__retried_at")
COUNTERS = activity_store.RETRY_COUNTERS


def hour_of(at: datetime) -> datetime:
    return at.astimezone(timezone.utc).replace(minute=0, second=0, microsecond=0)


def window_start(now: datetime, window: str) -> datetime:
    """The first hour of the window: the hour `now` falls in and the ones before it, 24 in all for
    24h, 168 for 7d."""
    return hour_of(now) - WINDOWS[window] + timedelta(hours=1)


def _us(delta: timedelta) -> int:
    return max(0, delta // timedelta(microseconds=1))


def classify(generation: int, started_at: datetime, earlier: dict, retried_at: datetime | None):
    """(is a retry, is the run's first retry, microseconds waited in backoff or 0) for an
    attempt, from its run's earlier attempts {generation: (outcome, finished_at)}.

    A retry is an attempt that followed a failed or unknown one; the first retry of a run is one
    whose predecessor was not itself a retry. The wait counts from the end of the failed attempt
    to the start of the retry, unless a person retried the run from the dead-letter queue in
    between (that wait is time in the DLQ, not backoff)."""
    prev = earlier.get(generation - 1)
    if prev is None or prev[0] not in FAILED:
        return False, False, 0
    before = earlier.get(generation - 2)
    first = before is None or before[0] not in FAILED
    manual = retried_at is not None and prev[1] <= retried_at <= started_at
    return True, first, 0 if manual else _us(started_at - prev[1])


@dataclass
class Counts:
    attempts: int = 0
    successes: int = 0
    retries: int = 0
    retried_runs: int = 0
    failed: int = 0
    failed_us: int = 0
    backoff_us: int = 0



class RetryTally:
    """The increments of a batch of finished attempts (dicts with FIELDS), per row key."""

    def __init__(self):
        self.attempts: list[dict] = []

    def add(self, a: dict) -> None:
        if a["outcome"] in COUNTED:
            self.attempts.append(a)

    def increments(self) -> dict:
        """{(tenant_id, dimension, key, hour): Counts}."""
        out: dict = defaultdict(Counts)
        if not self.attempts:
            return out
        earlier = _earlier_attempts([a for a in self.attempts if a["generation"] > 1])
        owners = dict(Schedule.objects.filter(id__in={a["run__schedule_id"] for a in self.attempts})
                      .values_list("id", "owner_id"))
        for a in self.attempts:
            retry, first, backoff = classify(a["generation"], a["started_at"], earlier.get(a["run_id"], {}),
                                             a["run__retried_at"])
            failed = a["outcome"] in FAILED
            owner = owners.get(a["run__schedule_id"])
            hour = hour_of(a["finished_at"])
            tenant = a["run__tenant_id"]
            for dimension, key in ((CostDimension.SCHEDULE, str(a["run__schedule_id"])),
                                   (CostDimension.OWNER, str(owner) if owner else ""),
                                   (CostDimension.TARGET, a["run__target_host"] or "")):
                c = out[(tenant, dimension.value, key, hour)]
                c.attempts += 1
                c.successes += a["outcome"] == AttemptOutcome.SUCCEEDED
                c.retries += retry
                c.retried_runs += first
                c.failed += failed
                c.failed_us += _us(a["finished_at"] - a["started_at"]) if failed else 0
                c.backoff_us += backoff
        return out


def _earlier_attempts(later: list[dict]) -> dict:
    """{run id: {generation: (outcome, finished_at)}} of the earlier attempts of these attempts'
    runs: by the attempts' (run, generation, scheduled_time) index, on the runs' partitions."""
    if not later:
        return {}
    out: dict = defaultdict(dict)
    rows = Attempt.objects.filter(run_id__in={a["run_id"] for a in later},
                                  scheduled_time__in={a["run__scheduled_time"] for a in later},
                                  generation__lt=max(a["generation"] for a in later))
    for run_id, generation, outcome, finished_at in rows.order_by().values_list("run_id", "generation", "outcome",
                                                                                "finished_at"):
        out[run_id][generation] = (outcome, finished_at)
    return out


def prune(now: datetime) -> int:
    """Deletes up to PRUNE_BATCH of the hours older than RETENTION; returns how many."""
    ids = list(RetryCostHour.objects.filter(hour__lt=now - RETENTION).order_by("hour")
               .values_list("id", flat=True)[:PRUNE_BATCH])
    if ids:
        RetryCostHour.objects.filter(id__in=ids).delete()
    return len(ids)


# --- reading ----------------------------------------------------------------------------------


@dataclass
class RetryCost(Counts):
    """The counts of one schedule, owner or target host (`key`) over a window."""

    key: str = ""

    @property
    def runs(self) -> int:
        """Runs whose first attempt ended in the window (every attempt that is not a retry)."""
        return self.attempts - self.retries

    @property
    def attempts_per_success(self) -> float | None:
        return self.attempts / self.successes if self.successes else None

    @property
    def retry_share(self) -> float | None:
        return self.retried_runs / self.runs if self.runs > 0 else None

    @property
    def failed_seconds(self) -> float:
        return self.failed_us / 1e6

    @property
    def backoff_seconds(self) -> float:
        return self.backoff_us / 1e6

    def sort_key(self):
        return (-self.retries, -(self.failed_us + self.backoff_us), self.key)


@dataclass
class Figures:
    window: str
    dimension: str
    since: datetime
    now: datetime
    complete: bool  # False: more attempts were waiting for the activity loop than one read adds
    rows: list = field(default_factory=list)  # RetryCost, costliest first


def _cursor_state():
    return ActivityCursor.objects.filter(id=1).values_list("watermark", "updated_at").first()


def uncounted(tenant_id, since: datetime, *, schedule_ids=None, limit: int = TAIL) -> tuple[dict, bool]:
    """The increments of the tenant's ended attempts the activity loop has not counted yet (after
    its watermark, or parked while open), at most `limit`; and whether that was all of them."""
    state = _cursor_state()
    newest = Attempt.objects.aggregate(m=Max("id"))["m"] or 0
    # Before the loop's first pass nothing is counted: the newest `limit` attempts stand in.
    watermark = state[0] if state else max(0, newest - limit)
    # An id range of at most `limit` attempts whoever's they are, so a stopped loop costs a
    # bounded read rather than a scan of everything since it stopped.
    upto = min(newest, watermark + limit)
    parked = list(ActivityPending.objects.order_by("attempt_id").values_list("attempt_id", flat=True)[:limit])
    qs = attempts_with_their_runs(Attempt.objects.filter(Q(id__gt=watermark, id__lte=upto) | Q(id__in=parked)))
    qs = qs.filter(outcome__isnull=False, run__tenant_id=tenant_id, finished_at__gte=since)
    if schedule_ids is not None:
        qs = qs.filter(run__schedule_id__in=list(schedule_ids))
    tally = RetryTally()
    for a in qs.order_by("id").values(*FIELDS):
        tally.add(a)
    return tally.increments(), newest <= upto and (state is not None or watermark == 0)


def _read(tenant_id, dimension: str, since: datetime, read_rows, *, schedule_ids=None):
    """Counted rows (read_rows()) and the uncounted tail, read between two identical looks at the
    activity cursor (up to five tries), so that a pass committed meanwhile is neither missed nor
    counted twice."""
    for _ in range(5):
        before = _cursor_state()
        rows = read_rows()
        tail, complete = uncounted(tenant_id, since, schedule_ids=schedule_ids)
        if _cursor_state() == before:
            break
    totals: dict = {}
    for key, counts in rows:
        activity_store.add_counts(totals.setdefault(key, RetryCost(key=key)), counts)
    for (_, dim, key, _), counts in tail.items():
        if dim == dimension:
            activity_store.add_counts(totals.setdefault(key, RetryCost(key=key)), counts)
    return totals, complete


def _summed(qs) -> list:
    """[(key, Counts)] of the rows of `qs` summed per key."""
    sums = qs.values("key").annotate(**{f"{c}_sum": Sum(c) for c in COUNTERS}).order_by()
    return [(r["key"], Counts(**{c: r[f"{c}_sum"] or 0 for c in COUNTERS})) for r in sums]


def figures_for(tenant_id, dimension: str, key: str, *, window: str, now: datetime) -> tuple[RetryCost, bool]:
    """One schedule's, owner's or target's figures over the window, and whether they are complete."""
    since = window_start(now, window)
    rows = RetryCostHour.objects.filter(tenant_id=tenant_id, dimension=dimension, key=key, hour__gte=since)
    schedule_ids = [key] if dimension == CostDimension.SCHEDULE else None
    totals, complete = _read(tenant_id, dimension, since, lambda: _summed(rows), schedule_ids=schedule_ids)
    return totals.get(key) or RetryCost(key=key), complete


def ranking(tenant_id, dimension: str, *, window: str, now: datetime, limit: int = 50) -> Figures:
    """The tenant's schedules, owners or target hosts with the most retries in the window first
    (then the most time in failed attempts and backoff), then, up to `limit`, ones that had
    attempts but no retry, in key order."""
    since = window_start(now, window)
    base = RetryCostHour.objects.filter(tenant_id=tenant_id, dimension=dimension, hour__gte=since)

    def read_rows():
        top = [r["key"] for r in base.filter(retries__gt=0).values("key").annotate(n=Sum("retries"))
               .order_by("-n", "key").values("key")[:limit]]
        quiet = []
        if len(top) < limit:
            # Keys without a retry, by the unique index's order: at most one row per hour each.
            seen: set = set(top)
            for k in base.order_by("key").values_list("key", flat=True).distinct()[:limit + len(top)]:
                if k not in seen:
                    quiet.append(k)
                    seen.add(k)
                if len(top) + len(quiet) >= limit:
                    break
        return _summed(base.filter(key__in=top + quiet))

    totals, complete = _read(tenant_id, dimension, since, read_rows)
    rows = sorted(totals.values(), key=RetryCost.sort_key)[:limit]
    return Figures(window=window, dimension=dimension, since=since, now=now, complete=complete, rows=rows)
