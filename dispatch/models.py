"""What the dispatch loops record about themselves: shard ownership and worker counters.

Both live in the database so that any number of copies on any number of machines coordinate
without talking to each other, and so that every web process reports the same metrics."""

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
