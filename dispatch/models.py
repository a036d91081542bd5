"""What the dispatch loops record about themselves: shard ownership, worker counters, and the
pre-aggregated activity (per-minute outcomes and start lags, per-schedule summaries) the portal's
charts read instead of the attempts table.

All live in the database so that any number of copies on any number of machines coordinate
without talking to each other, and so that every web process reports the same figures."""

import uuid

from django.db import models
from django.db.models import Q


class ShardLease(models.Model):
    """Ownership of one scanner shard (of `shards`), leased like a run. A copy started with
    `--shard I` prefers shard I and takes it back from a copy that borrowed it; a shard whose
    holder died is borrowed by another copy once its lease has expired. Ownership is for
    efficiency only: two scanners on one shard are safe (SKIP LOCKED and the occurrence
    unique constraint), just wasteful."""

    shards = models.PositiveSmallIntegerField()
    shard = models.PositiveSmallIntegerField()
    holder = models.CharField(max_length=200, blank=True, default="")
    borrowed = models.BooleanField(default=False)
    lease_until = models.DateTimeField()
    last_pass_at = models.DateTimeField(null=True, blank=True)
    # How far behind the shard was after its last pass: now - the oldest due next_run_at left.
    behind_seconds = models.FloatField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["shards", "shard"], name="shard_lease_unique"),
            models.CheckConstraint(condition=Q(shard__lt=models.F("shards")), name="shard_lease_in_range"),
        ]


def software_version() -> str:
    """The code a process runs: the package version and, in a git checkout, the commit. A
    WorkerStat row takes it as its default when the worker first writes it, so each worker row
    records the version of the process that made it (the workers page shows it)."""
    global _VERSION
    if _VERSION is None:
        _VERSION = _read_version()
    return _VERSION


_VERSION: str | None = None


def _read_version() -> str:
    from importlib import metadata
    from pathlib import Path

    try:
        version = metadata.version("durable-scheduler")
    except metadata.PackageNotFoundError:
        version = "unknown"
    git = Path(__file__).resolve().parents[1] / ".git"
    try:
        head = (git / "HEAD").read_text().strip()
        if head.startswith("ref: "):
            ref = head[5:]
            path = git / ref
            if path.exists():
                head = path.read_text().strip()
            else:
                packed = (git / "packed-refs").read_text().splitlines()
                head = next((line.split()[0] for line in packed if line.endswith(" " + ref)), "")
        if head:
            version += f"+g{head[:9]}"
    except OSError:
        pass
    return version[:64]


class WorkerStat(models.Model):
    """Counters a worker process flushes every few seconds (claims, empty claims, batch sizes),
    summed by /metrics."""

    worker_id = models.CharField(max_length=200, primary_key=True)
    started_at = models.DateTimeField()
    seen_at = models.DateTimeField()
    claims = models.BigIntegerField(default=0)
    empty_claims = models.BigIntegerField(default=0)
    claimed_runs = models.BigIntegerField(default=0)
    # Claim batch sizes as cumulative histogram buckets {"1": n, "10": n, ..., "+Inf": n}.
    batch_buckets = models.JSONField(default=dict)
    abandoned = models.BigIntegerField(default=0)
    fenced_results = models.BigIntegerField(default=0)
    # Filled by the default when the worker first writes its row, in the worker's own process.
    version = models.CharField(max_length=64, blank=True, default=software_version)


# --- pre-aggregated activity (dispatch.activity fills these; the portal reads them) -----------

# The tenant id of the rows that count every tenant together, so an operator's charts read one
# row per minute however many tenants there are. Not a tenant: no tenant has the nil UUID.
ALL_TENANTS = uuid.UUID(int=0)

# Upper bounds (seconds) of the start-lag histogram buckets, roughly x2 apart; the last bucket
# takes everything above. A percentile read from them is "at most" the bucket's bound.
LAG_BOUNDS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600)


class ActivityMinute(models.Model):
    """Attempts that ended in one minute (by outcome), and the start lags of first attempts that
    began in it, for one tenant or for all of them (`tenant_id` = ALL_TENANTS). Rows only grow
    by increments, so a late-finishing attempt adds to an older minute."""

    id = models.BigAutoField(primary_key=True)
    tenant_id = models.UUIDField()
    minute = models.DateTimeField()
    succeeded = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    unknown = models.PositiveIntegerField(default=0)
    # Of the unknown ones, those the reconciler ended because their lease expired.
    lease_expired = models.PositiveIntegerField(default=0)
    # Counts per LAG_BOUNDS bucket (len(LAG_BOUNDS) + 1 entries); empty until a lag is counted.
    lag_counts = models.JSONField(default=list, blank=True)
    # Latency (ms) of attempts that got an answer, summed, with their count, for a mean per minute.
    latency_ms_sum = models.BigIntegerField(default=0)
    latency_count = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            # The charts read one tenant's (or all tenants') minutes in a time range: this index.
            models.UniqueConstraint(fields=["tenant_id", "minute"], name="activity_minute_unique"),
        ]
        indexes = [
            # The activity loop's retention pass deletes the oldest minutes.
            models.Index(fields=["minute"], name="activity_minute_time_idx"),
        ]


class TargetMinute(models.Model):
    """Attempts that ended in one minute against one target URL (the one of the version each run
    was made by), with how many of them failed, for one tenant or for all (ALL_TENANTS): the
    dashboard's "targets failing most" sums the last hour of these rather than joining the
    attempts to their runs and versions. One row per target and minute that had an attempt;
    kept a little longer than that hour (dispatch.activity.TARGET_RETENTION)."""

    id = models.BigAutoField(primary_key=True)
    tenant_id = models.UUIDField()
    minute = models.DateTimeField()
    # A digest of the URL: a URL can be longer than a b-tree entry may be.
    url_key = models.CharField(max_length=40)
    target_url = models.CharField(max_length=2000)
    attempts = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)  # failed and unknown outcomes
    last_failed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # The dashboard reads one tenant's (or all tenants') minutes of the last hour by its
            # prefix; the activity loop finds the rows it adds to by the whole key.
            models.UniqueConstraint(fields=["tenant_id", "minute", "url_key"], name="target_minute_unique"),
        ]
        indexes = [
            # The activity loop's retention pass deletes the oldest minutes.
            models.Index(fields=["minute"], name="target_minute_time_idx"),
        ]


class ScheduleActivity(models.Model):
    """One row per schedule that has had a finished attempt since aggregation began: its last
    result, last success, totals, and its newest attempts' outcomes and latencies (the sparkline,
    success rate and p95 on the schedule pages), so those pages never read the attempts table."""

    RECENT = 50

    schedule_id = models.UUIDField(primary_key=True)
    tenant_id = models.UUIDField()
    succeeded = models.BigIntegerField(default=0)
    failed = models.BigIntegerField(default=0)  # failed and unknown outcomes
    last_finished_at = models.DateTimeField(null=True, blank=True)
    last_outcome = models.CharField(max_length=16, blank=True, default="")
    last_http_status = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True, default="")
    last_run_id = models.UUIDField(null=True, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    # The newest RECENT attempts, oldest first: [finished at (epoch s), outcome, latency ms or None].
    recent = models.JSONField(default=list, blank=True)


class ActivityCursor(models.Model):
    """Where the activity loop has got to: every attempt with an id up to `watermark` has been
    counted, or is in ActivityPending waiting for its outcome. One row; its lock makes passes of
    several loops (several `reconcile` or `scheduler` processes) take turns."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    watermark = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(null=True, blank=True)
    pruned_at = models.DateTimeField(null=True, blank=True)


class ActivityPending(models.Model):
    """An attempt passed by the watermark while still open (a call in flight): counted when it
    ends. As many rows as calls were in flight at one pass, at most."""

    attempt_id = models.BigIntegerField(primary_key=True)
