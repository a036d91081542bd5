"""Retention of run history: what is kept, for how long, and the removal pass.

The rule, the same on both engines:
- runs that are not finished (ready, leased) are never removed;
- succeeded, canceled and skipped runs are kept SCHEDULER_RETENTION_DAYS (14) after their
  scheduled time; a run retried by hand is counted from the retry;
- dead runs are kept SCHEDULER_DEAD_RETENTION_DAYS (30) after they went dead;
- a tenant's RetentionPolicy overrides either figure for that tenant;
- a run goes with its attempts and its occurrence; outbox events follow the outbox's own retention
  (SCHEDULER_OUTBOX_RETENTION_HOURS), never while unpublished.
A run is removed at the earliest when its time is up; removal is allowed to be later by up to one
partition width (PostgreSQL) or one maintenance interval.

How (`run_pass`):
- PostgreSQL: the oldest partition of a group goes once its end is the default retention old
  (runs.partitions.swap): whatever in it must stay (not finished, dead and still kept, a tenant
  keeping longer, retried lately; for events, unpublished) is copied with what must stay of the
  kept partition into a new kept partition, and the rest is dropped with its table. The cost
  follows what stays, not what goes. Tenants keeping *less* than the default are trimmed by
  bounded batches from the regular partitions.
- SQLite: bounded batches of expired runs, per tenant.
Each removal can be exported first (JSON Lines, gzip) and is recorded in the audit log.

`status()` is the read-only summary the portal fragment (templates/runs/_retention.html) and
/metrics show.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.core import serializers
from django.db import connection, transaction

from runs import partitions
from runs.history_settings import get as setting
from runs.models import MAX_RETENTION_DAYS, Attempt, HistoryPartition, HistoryRemoval, Occurrence, RetentionPolicy, Run
from runs.partitions import Group, Role, q
from runs.store import store
from scheduler_project.foundation.dbclock import db_now
from schedules.models import AuditAction, Tenant
from schedules.services import Actor, audit

log = logging.getLogger("scheduler.retention")

ACTOR = Actor("system:maintain")
AUDIT_ACTION = AuditAction.HISTORY_REMOVE


# --- the policy -------------------------------------------------------------------------------------


@dataclass
class Policy:
    finished: timedelta  # default for succeeded, canceled, skipped
    dead: timedelta  # default for dead
    outbox: timedelta
    # tenant id -> (finished, dead) where the tenant's own policy says something
    tenants: dict = field(default_factory=dict)

    def keep(self, tenant_id) -> tuple[timedelta, timedelta]:
        return self.tenants.get(tenant_id, (self.finished, self.dead))


def policy() -> Policy:
    finished = timedelta(days=setting("SCHEDULER_RETENTION_DAYS"))
    dead = timedelta(days=setting("SCHEDULER_DEAD_RETENTION_DAYS"))
    tenants = {}
    for tid, fin, dd in RetentionPolicy.objects.values_list("tenant_id", "finished_days", "dead_days"):
        tenants[tid] = (finished if fin is None else timedelta(days=fin), dead if dd is None else timedelta(days=dd))
    return Policy(finished, dead, timedelta(hours=settings.SCHEDULER_OUTBOX_RETENTION_HOURS), tenants)


def set_policy(tenant: Tenant, *, finished_days: int | None, dead_days: int | None, by: Actor) -> RetentionPolicy | None:
    """A tenant's retention (None in both: back to the defaults). The one entry point for it.
    Raises ValueError for a period outside 1..MAX_RETENTION_DAYS (the database refuses it too)."""
    for name, v in (("finished_days", finished_days), ("dead_days", dead_days)):
        if v is not None and not 1 <= v <= MAX_RETENTION_DAYS:
            raise ValueError(f"{name} must be between 1 and {MAX_RETENTION_DAYS}")
    before = RetentionPolicy.objects.filter(tenant=tenant).values("finished_days", "dead_days").first()
    if finished_days is None and dead_days is None:
        RetentionPolicy.objects.filter(tenant=tenant).delete()
        p = None
    else:
        p, _ = RetentionPolicy.objects.update_or_create(
            tenant=tenant, defaults={"finished_days": finished_days, "dead_days": dead_days, "updated_by": by.name})
    audit(AuditAction.TENANT_RETENTION, by=by, obj_type="tenant", obj_id=tenant.id, tenant=tenant, before=before,
          after={"finished_days": finished_days, "dead_days": dead_days})
    return p


# --- which rows of a partition stay (PostgreSQL) ------------------------------------------------------

# Each part is backed by an index of the partition: the ready and leased partial indexes, run_dead_idx,
# run_retried_idx, run_tenant_time_idx. `live` marks rows that may still change before the swap.
# `{only}` restricts every part to some ids (the swap's re-copy under the lock: the few runs that
# changed while it staged, so that what the lock costs follows them, not every survivor); "" for all.
_RUN_SURVIVORS = """
SELECT id, true AS live FROM {src} WHERE state = 'ready'{only}
UNION ALL SELECT id, true FROM {src} WHERE state = 'leased'{only}
UNION ALL SELECT r.id, false FROM {src} r
    LEFT JOIN unnest(%(dead_t)s::uuid[], %(dead_cut)s::timestamptz[]) AS d(t, cut) ON d.t = r.tenant_id
    WHERE r.state = 'dead' AND r.finished_at >= coalesce(d.cut, %(dead_default)s){only}
UNION ALL SELECT r.id, false FROM {src} r
    LEFT JOIN unnest(%(fin_t)s::uuid[], %(fin_cut)s::timestamptz[]) AS f(t, cut) ON f.t = r.tenant_id
    WHERE r.retried_at IS NOT NULL AND r.retried_at >= coalesce(f.cut, %(fin_default)s){only}
UNION ALL SELECT r.id, false FROM unnest(%(long_t)s::uuid[], %(long_cut)s::timestamptz[]) AS l(t, cut)
    JOIN {src} r ON r.tenant_id = l.t AND r.scheduled_time >= l.cut AND r.state <> 'dead'{only}
"""
# Rows that may have changed since staging: live then (kept in the ids table), live now, retried lately.
_RUN_CHANGED = """
SELECT id FROM {src} WHERE state = 'ready'
UNION SELECT id FROM {src} WHERE state = 'leased'
UNION SELECT id FROM {src} WHERE retried_at >= %(staged_at)s - make_interval(secs => %(slack)s)
"""
_EVENT_SURVIVORS = "SELECT id, true AS live FROM {src} WHERE published_at IS NULL{only}"
_EVENT_CHANGED = "SELECT id FROM {src} WHERE published_at IS NULL"


def _run_params(p: Policy, now: datetime) -> dict:
    dead_t, dead_cut, fin_t, fin_cut, long_t, long_cut = [], [], [], [], [], []
    for tid, (fin, dead) in p.tenants.items():
        dead_t.append(str(tid))
        dead_cut.append(now - dead)
        fin_t.append(str(tid))
        fin_cut.append(now - fin)
        if fin > p.finished:
            long_t.append(str(tid))
            long_cut.append(now - fin)
    return {"dead_t": dead_t, "dead_cut": dead_cut, "dead_default": now - p.dead, "fin_t": fin_t,
            "fin_cut": fin_cut, "fin_default": now - p.finished, "long_t": long_t, "long_cut": long_cut,
            "slack": float(settings.SCHEDULER_MAX_TIMEOUT_SECONDS + 2 * settings.SCHEDULER_LEASE_SECONDS)}


# --- the pass ---------------------------------------------------------------------------------------


@dataclass
class PassResult:
    swaps: list = field(default_factory=list)  # runs.partitions.SwapResult
    trimmed: dict = field(default_factory=dict)  # table -> rows removed by batches
    held_back: list = field(default_factory=list)  # (partition, survivors, limit)
    busy: list = field(default_factory=list)  # groups whose lock was not granted in time
    more: bool = False  # a bound was reached: call again

    @property
    def removed_anything(self) -> bool:
        return bool(self.swaps or any(self.trimmed.values()))


def due_partitions(now: datetime, p: Policy | None = None, *, kept_every: timedelta | None = None) -> dict:
    """{group: the partition to remove now}: the oldest regular partition of the group's main table
    once its end is the default retention old; else the kept partition, to be rewritten without
    what has expired in it, at most once per `kept_every` (default: one partition width) since it
    was made. (The kept partition holds the few rows that outlived their partitions; rewriting it
    costs what stays in it.)"""
    p = p or policy()
    kept_every = partitions.width() if kept_every is None else kept_every
    out = {}
    for group, main, keep in ((Group.RUNS, "runs_run", p.finished), (Group.OUTBOX, "runs_outboxevent", p.outbox)):
        layout = partitions.layout(main)
        live = [x for x in layout if x.role == Role.LIVE]
        # The partition holding now (and those ahead) never goes, whatever the retention says.
        if live and live[0].upper <= now - keep and live[0].upper <= partitions.align(now):
            out[group] = live[0]
            continue
        kept = next((x for x in layout if x.role == Role.KEPT), None)
        made = HistoryPartition.objects.filter(name=kept.name).values_list("created_at", flat=True).first() if kept else None
        if kept and (made is None or made <= now - kept_every) and _kept_has_expired(group, kept.name, p, now):
            out[group] = kept
    return out


def _kept_has_expired(group: str, kept: str, p: Policy, now: datetime) -> bool:
    """Whether the kept partition holds a row that would not survive (a count of the kept
    partition, which holds only what outlived its partition, against its survivors)."""
    with connection.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM {q(kept)}")
        total = cur.fetchone()[0]
    return bool(total) and count_survivors(group, [kept], _run_params(p, now) if group == Group.RUNS else {}) < total


def _kept_empty(group: str) -> bool:
    """Whether every kept partition of the group is empty: then a partition with no survivors is
    removed without a swap (runs.partitions.drop_oldest)."""
    with connection.cursor() as cur:
        for t in partitions.GROUPS[group]:
            kept = next(x for x in partitions.layout(t) if x.role == Role.KEPT)
            cur.execute(f"SELECT EXISTS (SELECT 1 FROM {q(kept.name)})")
            if cur.fetchone()[0]:
                return False
    return True


def count_survivors(group: str, sources, params: dict) -> int:
    sql = _RUN_SURVIVORS if group == Group.RUNS else _EVENT_SURVIVORS

    with connection.cursor() as cur:
        total = 0
        for src in sources:
            cur.execute(f"SELECT count(DISTINCT id) FROM ({sql.format(src=q(src), only='')}) s", params)
            total += cur.fetchone()[0]
    return total


def run_pass(*, now: datetime | None = None, export_dir: str | None = None, max_swaps: int = 1,
             dry_run: bool = False, kept_every: timedelta | None = None) -> PassResult:
    """One retention pass: at most `max_swaps` partition removals (PostgreSQL) and at most one batch
    per tenant trimmed; `more` says whether to come straight back."""
    now = now or db_now()
    p = policy()
    export_dir = export_dir if export_dir is not None else (setting("SCHEDULER_RETENTION_EXPORT_DIR") or None)
    res = PassResult()
    if store().partitioned:
        _partition_pass(res, now, p, export_dir, max_swaps, dry_run, kept_every)
        # Tenants keeping finished or dead runs for less than the default: their rows are in the
        # regular partitions until those go, so they are trimmed by batches.
        shorter = [t for t, (fin, dead) in p.tenants.items() if fin < p.finished or dead < p.dead]
    else:
        shorter = list(Tenant.objects.values_list("id", flat=True))
    if shorter and not dry_run:
        _trim(res, now, p, shorter, export_dir)
    return res


def _partition_pass(res, now, p, export_dir, max_swaps, dry_run, kept_every):
    for group, part in due_partitions(now, p, kept_every=kept_every).items():
        if len(res.swaps) >= max_swaps:
            res.more = True
            break
        params = _run_params(p, now) if group == Group.RUNS else {}
        main = "runs_run" if group == Group.RUNS else "runs_outboxevent"
        kept = next(x for x in partitions.layout(main) if x.role == Role.KEPT)
        survivors = count_survivors(group, {kept.name, part.name}, params)
        limit = setting("SCHEDULER_RETENTION_MAX_SURVIVORS")
        if survivors > limit:
            log.warning("retention: %s is due but holds %d rows that must stay (limit %d, "
                        "SCHEDULER_RETENTION_MAX_SURVIVORS); it stays until fewer do", part.name, survivors, limit)
            res.held_back.append((part.name, survivors, limit))
            continue
        if dry_run:
            res.held_back.append((part.name, survivors, None))
            continue
        plan = partitions.SwapPlan(
            group=group, upper=part.upper,
            survivors=_RUN_SURVIVORS if group == Group.RUNS else _EVENT_SURVIVORS,
            changed=_RUN_CHANGED if group == Group.RUNS else _EVENT_CHANGED,
            params=params,
        )
        exporter = (lambda g, sources, stage: export_swap(export_dir, g, sources, stage, now)) if export_dir else None

        def record(done, part=part, group=group):
            # In the swap's transaction: a removal is never committed without its audit entry.
            removed = {t: max(0, sum(n for src, n in done.removed.items() if src.startswith(t + "_")) - done.kept[t])
                       for t in done.kept}
            HistoryRemoval.objects.create(what=part.name, removed=removed, kept=done.kept, lock_ms=done.lock_ms)
            audit(AUDIT_ACTION, by=ACTOR, obj_type="partition", obj_id=part.name,
                  after={"group": group, "until": part.upper.isoformat(), "removed": removed,
                         "rowsBefore": done.removed, "kept": done.kept, "keptPartition": done.kept_name,
                         "lockMs": round(done.lock_ms, 1), "exported": done.exported})

        done = None
        if not survivors and exporter is None and part.role == Role.LIVE and _kept_empty(group):
            done = partitions.drop_oldest(plan, record=record)
        if done is None:
            done = partitions.swap(plan, now=now, export=exporter, record=record)
        if done is None:
            res.busy.append(group)
            res.more = True
            continue
        res.swaps.append(done)
        log.info("retention: removed %s (history before %s); kept %s; lock held %.0f ms",
                 part.name, part.upper.isoformat(), done.kept, done.lock_ms)
        res.more = part.role != Role.KEPT  # another partition may be due


def _trim(res, now, p, tenant_ids, export_dir):
    """One bounded batch of expired runs per tenant rule, removed with attempts and occurrences."""
    batch = setting("SCHEDULER_RETENTION_BATCH")
    removed = {"runs_run": 0, "runs_attempt": 0, "runs_occurrence": 0}
    by_keep: dict = {}
    for tid in tenant_ids:
        by_keep.setdefault(p.keep(tid), []).append(tid)
    for (fin, dead), tids in by_keep.items():
        ids = store().history_expired_run_ids(tenant_ids=tids, finished_before=now - fin, dead_before=now - dead,
                                              limit=batch)
        if not ids:
            continue
        with transaction.atomic():
            if export_dir:
                export_runs(export_dir, ids, now)
            got = store().history_delete_runs(ids)
            # In the removal's transaction: never a removal without its audit entry.
            if got["runs_run"]:
                HistoryRemoval.objects.create(what="batches", removed=got)
                audit(AUDIT_ACTION, by=ACTOR, obj_type="runs", obj_id=f"batch:{now.isoformat()}",
                      after={"removed": got, "tenants": len(tids)})
        for k, v in got.items():
            removed[k] += v
        if len(ids) >= batch:
            res.more = True
    for k, v in removed.items():
        res.trimmed[k] = res.trimmed.get(k, 0) + v


# --- export -----------------------------------------------------------------------------------------


def _export_file(export_dir: str, name: str):
    os.makedirs(export_dir, exist_ok=True)
    return gzip.open(os.path.join(export_dir, name), "at", encoding="utf-8")


def export_swap(export_dir: str, group: str, sources: dict, stage: dict, now: datetime) -> list:
    """Write every row a swap is about to remove (in a source partition, not staged to stay) as JSON
    Lines, one gzip file per source partition; returns the files written. Reads with a server-side
    cursor, so memory stays flat however large the partition."""
    files = []
    for table, srcs in sources.items():
        for src in srcs:
            name = f"{src}-{now:%Y%m%dT%H%M%S}.jsonl.gz"
            with transaction.atomic(), connection.cursor() as cur, _export_file(export_dir, name) as out:
                cur.execute(f"DECLARE history_export NO SCROLL CURSOR FOR SELECT row_to_json(x)::text FROM {q(src)} x "
                            f"WHERE NOT EXISTS (SELECT 1 FROM {q(stage[table])} s WHERE s.id = x.id)")
                while True:
                    cur.execute("FETCH 5000 FROM history_export")
                    rows = cur.fetchall()
                    if not rows:
                        break
                    out.writelines(r[0] + "\n" for r in rows)
                cur.execute("CLOSE history_export")
            files.append(name)
    return files


def export_runs(export_dir: str, run_ids, now: datetime) -> None:
    """Append these runs, their attempts and occurrences to the pass's export files (batch removal)."""
    stamp = f"{now:%Y%m%dT%H%M%S}"
    runs = list(Run.objects.filter(id__in=run_ids))
    for model, rows in ((Run, runs), (Attempt, Attempt.objects.filter(run_id__in=run_ids)),
                        (Occurrence, Occurrence.objects.filter(id__in=[r.occurrence_id for r in runs]))):
        with _export_file(export_dir, f"{model._meta.db_table}-batches-{stamp}.jsonl.gz") as out:
            for obj in serializers.serialize("python", rows):
                out.write(json.dumps({"pk": str(obj["pk"]), **obj["fields"]}, default=str) + "\n")


# --- what the portal and /metrics show ----------------------------------------------------------------


@dataclass
class TenantRetention:
    slug: str
    finished_days: float
    dead_days: float
    own: bool  # the tenant has its own policy


@dataclass
class RetentionStatus:
    now: datetime
    partitioned: bool
    finished_days: float  # the defaults
    dead_days: float
    outbox_hours: float
    overrides: int  # tenants with their own policy
    tenants: list = field(default_factory=list)  # TenantRetention, for the tenants asked about
    history_from: datetime | None = None  # the oldest regular partition's start (PostgreSQL)
    next_removal_at: datetime | None = None  # when the next partition is due (PostgreSQL)
    next_removal: str = ""
    covered_until: datetime | None = None  # partitions exist up to here
    partitions: dict = field(default_factory=dict)  # table -> count
    unpartitioned_rows: dict = field(default_factory=dict)  # table -> rows in the catch-all (alert if > 0)
    table_bytes: dict = field(default_factory=dict)
    last_removal_at: datetime | None = None
    last_removal: str = ""
    maintenance_seconds: float = 0.0

    @property
    def unpartitioned(self) -> int:
        return sum(self.unpartitioned_rows.values())

    @property
    def total_bytes(self) -> int:
        return sum(self.table_bytes.values())


def status(*, tenant_ids=None, now: datetime | None = None) -> RetentionStatus:
    """What is kept and when the next removal is due. Cost: the partition catalog (pg_inherits, a
    few dozen rows), one LIMIT-bounded count per catch-all partition, pg_total_relation_size per
    partition, the newest removal (history_removal_at_idx), and the
    retention policies of the tenants asked about."""
    now = now or db_now()
    p = policy()
    st = RetentionStatus(
        now=now, partitioned=store().partitioned, finished_days=p.finished.total_seconds() / 86400,
        dead_days=p.dead.total_seconds() / 86400, outbox_hours=p.outbox.total_seconds() / 3600,
        overrides=len(p.tenants), maintenance_seconds=setting("SCHEDULER_MAINTENANCE_SECONDS"),
    )
    tenants = Tenant.objects.all() if tenant_ids is None else Tenant.objects.filter(id__in=list(tenant_ids))
    if tenant_ids is not None:
        for t in tenants.only("id", "slug"):
            fin, dead = p.keep(t.id)
            st.tenants.append(TenantRetention(t.slug, fin.total_seconds() / 86400, dead.total_seconds() / 86400,
                                              t.id in p.tenants))
    last = HistoryRemoval.objects.order_by("-at").values_list("at", "what").first()
    if last:
        st.last_removal_at, st.last_removal = last
    if st.partitioned:
        layout = store().history_partition_layout()
        st.partitions = {t: len(parts) for t, parts in layout.items()}
        live = [x for x in layout.get("runs_run", []) if x.role == Role.LIVE]
        if live:
            st.history_from = live[0].lower
            st.next_removal_at = live[0].upper + p.finished
            st.next_removal = live[0].name
        st.covered_until = store().history_covered_until()
        st.unpartitioned_rows = store().history_unpartitioned_rows()
        st.table_bytes = store().history_table_bytes()
    return st
