"""The activity loop: folds finished attempts into the pre-aggregated tables the portal's charts
and schedule figures read (dispatch.models: ActivityMinute, ScheduleActivity), so that no page
reads the attempts table, whose size is the whole history.

One pass (`ActivityAggregator.step`), a read and then one transaction:

1. A read, committed statement by statement before the pass's transaction: a transaction holds
   its locks on the tables it read until it ends, and `maintain` gives way to any holder of the
   history tables (runs.partitions, "Lock order"). A pass that folded thousands of attempts while
   holding them made retention give way again and again (found by bench/soak.py).
   a. The attempts parked in ActivityPending (passed while still open), by primary key: the ones
      that have ended are counted, the ones that no longer exist let go.
   b. The next attempts after the watermark by primary key, at most BATCH. Attempt ids are handed
      out when a claim inserts the row, but a claim's transaction may commit after a later one's;
      so the read stops at the first attempt that started less than SETTLE ago, leaving room for
      an older id to appear. An attempt still open is parked (a. counts it later).
   c. What the retries among them cost: their runs' earlier attempts and the schedules' owners.
2. Lock the cursor row (ActivityCursor). Passes of several loops (one per `reconcile` or
   `scheduler` process) take turns on it, so no attempt is counted twice: a pass whose cursor
   moved since its read starts again. On SQLite the transaction itself is the lock (one writer).
3. Park and let go as read; add the counts to the per-minute rows (the tenant's and the
   all-tenants row), to the per-minute rows of each target URL, update each schedule's summary
   row, and add what the retries cost to the hourly rows of each schedule, owner and target host
   (dispatch.retry_cost); advance the watermark.
4. Now and then, delete minute rows older than RETENTION, target rows older than
   TARGET_RETENTION, retry-cost hours older than retry_cost.RETENTION, and the last hour's kept
   counts too old to be served (runs.stats).

Each pass costs a primary-key range of at most BATCH attempts (joined to their runs and versions
by primary key), PENDING_BATCH primary-key lookups, and writes proportional to what it read,
whatever the size of the history. A new database starts INITIAL_TAIL attempts back rather than at
the beginning of time.
"""

from __future__ import annotations

import hashlib
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from django.db import transaction

from dispatch import activity_store, retry_cost
from dispatch.models import (
    ALL_TENANTS,
    LAG_BOUNDS,
    ActivityCursor,
    ActivityMinute,
    ActivityPending,
    ScheduleActivity,
    TargetMinute,
)
from runs import stats
from runs.decisions import LEASE_EXPIRED
from runs.models import Attempt, AttemptOutcome, RunKind, attempts_with_their_runs
from scheduler_project.foundation.dbclock import db_now

log = logging.getLogger("scheduler.activity")

BATCH = 2000
PENDING_BATCH = 5000
# Longer than any claim transaction takes between inserting its attempts and committing.
SETTLE = timedelta(seconds=10)
RETENTION = timedelta(days=8)
# The dashboard reads the last hour of target rows; the rest is kept only to spare a pass.
TARGET_RETENTION = timedelta(hours=2)
PRUNE_EVERY = timedelta(minutes=10)
PRUNE_BATCH = 5000
INITIAL_TAIL = 100_000
IDLE_SECONDS = 2.0

OUTCOME_CODES = {AttemptOutcome.SUCCEEDED: "s", AttemptOutcome.FAILED: "f", AttemptOutcome.UNKNOWN: "u",
                 AttemptOutcome.ABANDONED: "a"}
FIELDS = ("id", "generation", "started_at", "finished_at", "outcome", "http_status", "latency_ms", "error_class",
          "error", "run_id", "run__tenant_id", "run__schedule_id", "run__scheduled_time", "run__kind",
          "run__version__target_url", "run__version__spread_offset_seconds", "run__target_host", "run__retried_at")
COUNTED = (AttemptOutcome.SUCCEEDED, AttemptOutcome.FAILED, AttemptOutcome.UNKNOWN)
FAILED = (AttemptOutcome.FAILED, AttemptOutcome.UNKNOWN)


def lag_bucket(seconds: float) -> int:
    for i, bound in enumerate(LAG_BOUNDS):
        if seconds <= bound:
            return i
    return len(LAG_BOUNDS)


def minute_of(at: datetime) -> datetime:
    return at.astimezone(timezone.utc).replace(second=0, microsecond=0)


def url_key(url: str) -> str:
    return hashlib.sha1(url.encode("utf-8", "surrogatepass")).hexdigest()


def _initial_watermark() -> int:
    """The id just below the INITIAL_TAIL-th newest attempt (0 with fewer). Cost: a backward
    primary-key scan of INITIAL_TAIL entries, once per database."""
    row = Attempt.objects.order_by("-id").values_list("id", flat=True)[INITIAL_TAIL - 1:INITIAL_TAIL]
    return row[0] - 1 if row else 0


def _cursor_state() -> tuple[int, datetime | None]:
    """The cursor's (watermark, updated_at), made on a database's first pass."""
    state = ActivityCursor.objects.filter(id=1).values_list("watermark", "updated_at").first()
    if state is None:
        # Two first passes at once: one insert wins, the other's is ignored.
        ActivityCursor.objects.bulk_create([ActivityCursor(id=1, watermark=_initial_watermark())],
                                           ignore_conflicts=True)
        state = ActivityCursor.objects.filter(id=1).values_list("watermark", "updated_at").get()
    return state


class _Tally:
    """The increments of one pass, applied at its end."""

    def __init__(self):
        self.minutes: dict[tuple, dict] = defaultdict(lambda: {"succeeded": 0, "failed": 0, "unknown": 0,
                                                               "lease_expired": 0,
                                                               "lag": [0] * (len(LAG_BOUNDS) + 1),
                                                               "latency_sum": 0, "latency_count": 0})
        self.targets: dict[tuple, dict] = defaultdict(lambda: {"attempts": 0, "failed": 0, "last_failed_at": None})
        self.schedules: dict = defaultdict(list)
        self.retries = retry_cost.RetryTally()
        self.retry_rows: dict = {}
        self.counted = 0

    def add(self, a: dict) -> None:
        outcome = a["outcome"]
        tenant = a["run__tenant_id"]
        self.counted += 1
        if outcome in COUNTED:
            minute = minute_of(a["finished_at"])
            for key in ((tenant, minute), (ALL_TENANTS, minute)):
                m = self.minutes[key]
                m[outcome] += 1
                if outcome == AttemptOutcome.UNKNOWN and a["error_class"] == LEASE_EXPIRED:
                    m["lease_expired"] += 1
                if a["latency_ms"] is not None:
                    m["latency_sum"] += a["latency_ms"]
                    m["latency_count"] += 1
            url = a["run__version__target_url"]
            for key in ((tenant, minute, url), (ALL_TENANTS, minute, url)):
                t = self.targets[key]
                t["attempts"] += 1
                if outcome in FAILED:
                    t["failed"] += 1
                    if t["last_failed_at"] is None or a["finished_at"] > t["last_failed_at"]:
                        t["last_failed_at"] = a["finished_at"]
        # A backfill's scheduled times are in the past on purpose: its lag says nothing.
        if a["generation"] == 1 and a["run__kind"] != RunKind.BACKFILL and a["started_at"]:
            # From when it became eligible: a scheduled run's spread offset is not lag.
            spread = a["run__version__spread_offset_seconds"] if a["run__kind"] == RunKind.SCHEDULED else 0
            lag = max(0.0, (a["started_at"] - a["run__scheduled_time"]).total_seconds() - (spread or 0))
            bucket = lag_bucket(lag)
            minute = minute_of(a["started_at"])
            for key in ((tenant, minute), (ALL_TENANTS, minute)):
                self.minutes[key]["lag"][bucket] += 1
        # Abandoned attempts (given back at shutdown, canceled mid-call) are no result of the target.
        if outcome != AttemptOutcome.ABANDONED:
            self.schedules[a["run__schedule_id"]].append(a)
        self.retries.add(a)

    def settle(self) -> None:
        """What retries cost reads earlier attempts and the schedules' owners: done in the pass's
        read, with the history tables' other reads."""
        self.retry_rows = self.retries.increments()

    def apply(self) -> None:
        self._apply_minutes()
        self._apply_targets()
        self._apply_schedules()
        activity_store.add_retry_cost_hours(self.retry_rows)

    def _apply_minutes(self) -> None:
        if not self.minutes:
            return
        tenants = {k[0] for k in self.minutes}
        minutes = {k[1] for k in self.minutes}
        existing = {(r.tenant_id, r.minute): r for r in
                    ActivityMinute.objects.filter(tenant_id__in=tenants, minute__in=minutes)}
        rows = []
        for key, inc in self.minutes.items():
            row = existing.get(key) or ActivityMinute(tenant_id=key[0], minute=key[1])
            rows.append(row)
            row.succeeded += inc["succeeded"]
            row.failed += inc["failed"]
            row.unknown += inc["unknown"]
            row.lease_expired += inc["lease_expired"]
            row.latency_ms_sum += inc["latency_sum"]
            row.latency_count += inc["latency_count"]
            if any(inc["lag"]):
                counts = list(row.lag_counts) or [0] * (len(LAG_BOUNDS) + 1)
                row.lag_counts = [x + y for x, y in zip(counts, inc["lag"])]
        activity_store.upsert_summed(ActivityMinute, rows, ["tenant_id", "minute"],
                                     ["succeeded", "failed", "unknown", "lease_expired", "lag_counts",
                                      "latency_ms_sum", "latency_count"])

    def _apply_targets(self) -> None:
        # Keyed as the rows are (by the URL's digest), so one statement never meets a row twice.
        rows: dict = {}
        for (tenant, minute, url), inc in self.targets.items():
            row = rows.setdefault((tenant, minute, url_key(url)),
                                  {"url": url, "attempts": 0, "failed": 0, "last_failed_at": None})
            row["attempts"] += inc["attempts"]
            row["failed"] += inc["failed"]
            if inc["last_failed_at"] and (row["last_failed_at"] is None or inc["last_failed_at"] > row["last_failed_at"]):
                row["last_failed_at"] = inc["last_failed_at"]
        activity_store.add_target_minutes(rows)

    def _apply_schedules(self) -> None:
        batches = {}
        for sid, attempts in self.schedules.items():
            b = batches[sid] = activity_store.ScheduleBatch(tenant_id=attempts[0]["run__tenant_id"])
            ordered = sorted(attempts, key=lambda a: (a["finished_at"], a["id"]))
            for a in ordered:
                if a["outcome"] == AttemptOutcome.SUCCEEDED:
                    b.succeeded += 1
                    if b.last_success_at is None or a["finished_at"] > b.last_success_at:
                        b.last_success_at = a["finished_at"]
                else:
                    b.failed += 1
            last = ordered[-1]
            ok = last["outcome"] == AttemptOutcome.SUCCEEDED
            b.last_finished_at, b.last_outcome, b.last_http_status = last["finished_at"], last["outcome"], last["http_status"]
            b.last_run_id, b.last_error = last["run_id"], "" if ok else _error_text(last)[:300]
            b.recent = [[round(a["finished_at"].timestamp(), 3), OUTCOME_CODES[a["outcome"]], a["latency_ms"]]
                        for a in ordered[-ScheduleActivity.RECENT:]]
        activity_store.add_schedule_batches(batches)


def _error_text(a: dict) -> str:
    if a["error"]:
        return a["error"]
    if a["http_status"]:
        return f"HTTP {a['http_status']}"
    return a["error_class"] or a["outcome"]


@dataclass
class _Read:
    """What a pass read, before its transaction: the increments, and the cursor's next state."""

    tally: _Tally
    watermark: int
    parked: list = field(default_factory=list)  # attempt ids passed while open
    unparked: list = field(default_factory=list)  # parked attempt ids now counted or gone
    more: bool = False

    @property
    def changes(self) -> bool:
        return bool(self.tally.counted or self.parked or self.unparked)


class ActivityAggregator:
    """The loop (run by dispatch.loops.run_loop): `step()` is one pass; True when it stopped at a
    bound with more to read, or gave way to another loop's pass."""

    name = "activity"

    def __init__(self, *, batch: int = BATCH, pending_batch: int = PENDING_BATCH, settle: timedelta = SETTLE):
        self.batch, self.pending_batch, self.settle = batch, pending_batch, settle

    def idle_seconds(self) -> float:
        return IDLE_SECONDS

    def step(self) -> bool:
        start = _cursor_state()
        now = db_now()
        # Read outside the pass's transaction: each statement's locks on the history tables end
        # with it, so `maintain` never waits for the writes below (see the module's docstring).
        read = self._read(start[0], now)
        with transaction.atomic():
            cursor = ActivityCursor.objects.select_for_update().get(id=1)
            if (cursor.watermark, cursor.updated_at) != start:
                return True  # another loop's pass went first: read again from where it stopped
            # Parked before the watermark's save (same transaction): an open attempt passed by the
            # watermark is counted when it ends, however the pass stopped.
            if read.parked:
                ActivityPending.objects.bulk_create([ActivityPending(attempt_id=i) for i in read.parked],
                                                    ignore_conflicts=True)
            if read.unparked:
                ActivityPending.objects.filter(attempt_id__in=read.unparked).delete()
            read.tally.apply()
            changed = read.changes or read.watermark != cursor.watermark
            cursor.watermark = read.watermark
            if cursor.pruned_at is None or now - cursor.pruned_at >= PRUNE_EVERY:
                pruned = self._prune(now)
                if pruned < PRUNE_BATCH:
                    cursor.pruned_at = now
                changed = True
            # An idle pass writes nothing (SQLite has one writer); one that counted anything moves
            # updated_at, which readers of the counts compare (dispatch.retry_cost).
            if changed:
                cursor.updated_at = now
                cursor.save()
        if read.tally.counted:
            log.debug("activity: %d attempts counted, watermark %d", read.tally.counted, read.watermark)
        return read.more

    def _read(self, watermark: int, now: datetime) -> _Read:
        read = _Read(tally=_Tally(), watermark=watermark)
        self._ended_pending(read)
        self._after_watermark(read, now)
        read.tally.settle()
        return read

    def _ended_pending(self, read: _Read) -> None:
        ids = list(ActivityPending.objects.order_by("attempt_id").values_list("attempt_id", flat=True)
                   [:self.pending_batch])
        if not ids:
            return
        rows = {a["id"]: a for a in attempts_with_their_runs(Attempt.objects.filter(id__in=ids)).values(*FIELDS)}
        for attempt_id in ids:
            a = rows.get(attempt_id)
            if a is None:  # its run was removed meanwhile
                read.unparked.append(attempt_id)
            elif a["outcome"] is not None:
                read.tally.add(a)
                read.unparked.append(attempt_id)

    def _after_watermark(self, read: _Read, now: datetime) -> None:
        # The batch's id range first, from the attempts' primary key alone: with the join in the
        # same statement, PostgreSQL joins everything after the watermark before it limits.
        after = Attempt.objects.filter(id__gt=read.watermark)
        bound = list(after.order_by("id").values_list("id", flat=True)[self.batch - 1:self.batch])
        window = after.filter(id__lte=bound[0]) if bound else after
        rows = list(attempts_with_their_runs(window).order_by("id").values(*FIELDS))
        settled_before = now - self.settle
        settled = True
        for a in rows:
            if a["started_at"] >= settled_before:
                settled = False  # the rest are too new to be sure nothing older is still to appear
                break
            if a["outcome"] is None:
                read.parked.append(a["id"])
            else:
                read.tally.add(a)
            read.watermark = a["id"]
        if settled and bound:
            read.watermark = bound[0]  # past the window even if its last attempts had no run
        read.more = settled and bool(bound)

    def _prune(self, now: datetime) -> int:
        """Deletes up to PRUNE_BATCH of the oldest rows of each table; returns the most deleted
        from one (PRUNE_BATCH: there may be more)."""
        most = 0
        for model, keep in ((ActivityMinute, RETENTION), (TargetMinute, TARGET_RETENTION)):
            ids = list(model.objects.filter(minute__lt=now - keep).order_by("minute")
                       .values_list("id", flat=True)[:PRUNE_BATCH])
            if ids:
                model.objects.filter(id__in=ids).delete()
            most = max(most, len(ids))
        most = max(most, retry_cost.prune(now))
        return max(most, stats.forget_old_recent_counts(now))


def counted_up_to() -> int:
    """The activity loop's watermark (0 before its first pass): pollers of figures it feeds
    compare it to see that something was counted. Cost: one primary-key lookup."""
    return ActivityCursor.objects.filter(id=1).values_list("watermark", flat=True).first() or 0


def drain(aggregator: ActivityAggregator | None = None) -> None:
    """Passes until nothing more can be read now (tests, `aggregate --once`)."""
    aggregator = aggregator or ActivityAggregator()
    while aggregator.step():
        pass
