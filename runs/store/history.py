"""The history half of the storage seam: partitions and removal by retention (runs.retention decides
what goes; these apply it). `PortableStore` and `PostgresStore` each take the class for their engine:

- `PortableHistory`: no partitions (SQLite); removal by bounded batches of rows.
- `PostgresHistory`: time partitions (runs.partitions); removal by swapping out whole partitions,
  and by the same bounded batches for what a partition swap cannot reach (a tenant keeping less
  than the default).
"""

from __future__ import annotations

from datetime import datetime

from django.db import connection

from runs import partitions
from runs.models import TERMINAL_STATES, Attempt, Occurrence, OutboxEvent, Run, RunState


class PortableHistory:
    partitioned = False

    def history_ensure_partitions(self, now: datetime):
        """Make the partitions for the times ahead (none on this engine)."""
        return None

    def history_seal_partitions(self, now: datetime) -> list:
        return []

    def history_partition_layout(self) -> dict:
        """{table: [partition, ...]} (none on this engine)."""
        return {}

    def history_unpartitioned_rows(self) -> dict:
        return {}

    def history_covered_until(self):
        return None

    def history_expired_run_ids(self, *, tenant_ids, finished_before: datetime, dead_before: datetime, limit: int) -> list:
        """Up to `limit` ids of the given tenants' runs past their retention: succeeded, canceled or
        skipped runs scheduled before `finished_before` (retried by hand: retried before it too),
        dead runs that went dead before `dead_before`. Never a run that is not finished. One
        range of run_tenant_time_idx or run_dead_idx per tenant."""
        out: list = []
        finished = [s for s in TERMINAL_STATES if s != RunState.DEAD]
        for tenant_id in tenant_ids:
            if len(out) >= limit:
                break
            out += list(
                Run.objects.filter(tenant_id=tenant_id, scheduled_time__lt=finished_before, state__in=finished)
                .exclude(retried_at__gte=finished_before)
                .values_list("id", flat=True)[: limit - len(out)]
            )
            if len(out) < limit:
                out += list(
                    Run.objects.filter(tenant_id=tenant_id, state=RunState.DEAD, finished_at__lt=dead_before)
                    .values_list("id", flat=True)[: limit - len(out)]
                )
        return out

    def history_delete_runs(self, run_ids) -> dict:
        """Remove these runs with their attempts and occurrences, in the caller's transaction. The
        runs are locked and re-checked first: one retried meanwhile is no longer finished and stays.
        Returns rows removed per table. (Their outbox events have their own retention.)"""
        rows = list(Run.objects.filter(id__in=run_ids, state__in=TERMINAL_STATES).select_for_update()
                    .values_list("id", "occurrence_id"))
        ids, occurrences = [r[0] for r in rows], [r[1] for r in rows]
        if not ids:
            return {"runs_run": 0, "runs_attempt": 0, "runs_occurrence": 0}
        # Plain deletes: the ORM's cascade would also take the runs' outbox events.
        attempts = Attempt.objects.filter(run_id__in=ids)._raw_delete(Attempt.objects.db)
        runs = Run.objects.filter(id__in=ids)._raw_delete(Run.objects.db)
        occ = Occurrence.objects.filter(id__in=occurrences)._raw_delete(Occurrence.objects.db)
        return {"runs_run": runs, "runs_attempt": attempts, "runs_occurrence": occ}

    def history_delete_published_events(self, *, published_before: datetime, limit: int) -> int:
        """Delete up to `limit` outbox events published before `published_before`, in the
        caller's transaction; never an unpublished one. Walked in id order (the primary key):
        events are published about in the order they were written, so the old ones come first,
        and no index on the publication time is kept for this alone."""
        ids = list(OutboxEvent.objects.filter(published_at__lt=published_before).order_by("id")
                   .values_list("id", flat=True)[:limit])
        return OutboxEvent.objects.filter(id__in=ids)._raw_delete(OutboxEvent.objects.db) if ids else 0


class PostgresHistory(PortableHistory):
    partitioned = True

    def history_ensure_partitions(self, now: datetime):
        return partitions.ensure_ahead(now)

    def history_seal_partitions(self, now: datetime) -> list:
        return partitions.seal_quiet_partitions(now)

    def history_partition_layout(self) -> dict:
        return {t: partitions.layout(t) for t in partitions.KEY}

    def history_unpartitioned_rows(self) -> dict:
        return partitions.unpartitioned_rows()

    def history_covered_until(self):
        return partitions.covered_until()

    def history_delete_published_events(self, *, published_before: datetime, limit: int) -> int:
        """None, by design: published events go with their partition of the outbox when
        retention swaps it out (runs.retention), at most one partition width after their time.
        Deleting them row by row first cost a delete, its WAL and a vacuum per event (two or
        three events a run) and an index entry on every event written to find them."""
        return 0

    def history_table_bytes(self) -> dict:
        """Bytes on disk per history table (all partitions, with indexes and TOAST)."""
        out = {}
        with connection.cursor() as cur:
            for t in partitions.KEY:
                cur.execute("SELECT coalesce(sum(pg_total_relation_size(inhrelid)), 0) FROM pg_inherits "
                            "WHERE inhparent = %s::regclass", [t])
                out[t] = int(cur.fetchone()[0])
        return out
