"""Scanner shard ownership, leased in the database (README, "Production set-up").

`scan --shards N --shard I`: the copy prefers shard I and takes it back from whoever borrowed it;
it also borrows any shard whose lease has expired (its holder died), so every shard is scanned
within one lease of its holder's death. Ownership only avoids wasted work: two copies scanning
one shard are still correct (SKIP LOCKED, and the occurrence unique constraint)."""

from datetime import timedelta

from django.db import transaction
from django.db.models import Min, Q

from dispatch.models import ShardLease
from runs.queue import due_schedules
from scheduler_project.foundation.dbclock import db_now

SHARD_LEASE_SECONDS = 15
EPOCH_LEASE = "1970-01-01T00:00:00Z"


def hold_shards(holder: str, shards: int, prefer: int | None) -> list[int]:
    """Renew or take shards for `holder`; returns the shards it holds now."""
    with transaction.atomic():
        now = db_now()
        until = now + timedelta(seconds=SHARD_LEASE_SECONDS)
        existing = set(ShardLease.objects.filter(shards=shards).values_list("shard", flat=True))
        missing = [i for i in range(shards) if i not in existing]
        if missing:
            ShardLease.objects.bulk_create(
                [ShardLease(shards=shards, shard=i, lease_until=EPOCH_LEASE) for i in missing], ignore_conflicts=True
            )
        if prefer is not None:
            ShardLease.objects.filter(shards=shards, shard=prefer).filter(
                Q(holder=holder) | Q(lease_until__lt=now) | Q(borrowed=True)
            ).update(holder=holder, borrowed=False, lease_until=until)
        # Borrow what nobody holds; keep renewing what this copy borrowed until its preferring
        # copy takes it back.
        others = ShardLease.objects.filter(shards=shards)
        if prefer is not None:
            others = others.exclude(shard=prefer)
        others.filter(Q(lease_until__lt=now) | Q(holder=holder, borrowed=True)).update(
            holder=holder, borrowed=True, lease_until=until
        )
        return sorted(
            ShardLease.objects.filter(shards=shards, holder=holder, lease_until__gte=now).values_list("shard", flat=True)
        )


def record_pass(shards: int, held: list[int]) -> None:
    """After a pass: how far behind each held shard still is, for /metrics."""
    now = db_now()
    for i in held:
        oldest = due_schedules(now, shards=shards, shard=i).aggregate(m=Min("next_run_at"))["m"]
        ShardLease.objects.filter(shards=shards, shard=i).update(
            last_pass_at=now, behind_seconds=(now - oldest).total_seconds() if oldest else 0.0
        )
