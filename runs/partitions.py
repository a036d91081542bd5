"""Time partitions of the history tables on PostgreSQL: the layout, creating partitions ahead,
sealing old ones, and the swap that removes a partition while keeping its survivors.

Layout of each partitioned table (docs/scaling.md, "Time partitioning"):

    <table>_kept_<n>   FROM (MINVALUE) TO (the oldest live partition's lower bound)
    <table>_p<time>    one per SCHEDULER_PARTITION_SECONDS (a day by default), aligned to the epoch
    <table>_future     FROM (the newest live partition's upper bound) TO (MAXVALUE)

- `_kept_<n>` holds what outlives its partition (runs not finished, dead runs within their
  retention, tenants that keep longer, runs retried by hand; unpublished events) and anything
  written for an instant older than the partitions (a backfill of last year). Each removal rewrites
  it as a new table (n + 1) from the survivors of the old one and of the partition removed.
- `_future` is the catch-all: rows land there only when the maintenance loop has not made the
  partition for their time yet. Nothing is ever lost or refused; `/metrics`
  (scheduler_history_unpartitioned_rows) and `manage.py partitions --check` say so loudly, and the
  next `ensure_ahead` moves those rows into the partition it makes.

Groups share bounds and go together: occurrences, runs and attempts by the run's scheduled_time
(so a run, its occurrence and every attempt are removed or kept as one), outbox events by
created_at.

Nothing here runs on the dispatch hot path. DDL takes the parents' ACCESS EXCLUSIVE lock for a few
milliseconds (detach and attach of catalog entries) under a short `lock_timeout`: when the lock is
not granted in time the step gives up and the next pass tries again, so a long reader never makes
dispatch queue up behind maintenance for longer than that timeout.

Lock order (`ddl`): every lock a DDL transaction needs is taken by its first statements, before
any work, and nothing after them waits. Besides the group's tables that includes the tables the
partitions' foreign keys point at (REFERENCED): detaching or creating a partition takes SHARE ROW
EXCLUSIVE on them, attaching a staged table or dropping a detached one ACCESS EXCLUSIVE (their own
foreign-key triggers go). Taken where the DDL statement came, after the group's tables, they closed
a cycle with the scanner (which holds its schedules, then reads runs) and with portal reads: the
soak saw scanner passes and web requests fail with `deadlock detected`. No order fits every hot
path (the scanner takes schedules before runs, a claim runs before versions and tenants), so
maintenance gives way instead: its waits are all in those first statements, under a lock timeout
kept below half the server's deadlock_timeout, so in any cycle it is the one that stops waiting (or the
deadlock victim, having waited first), rolls back having changed nothing, and reports the group
busy; the loop tries the step again shortly (dispatch.maintenance).

The scanner's gate: that timeout is shorter than a scanner's pass on a loaded host (it holds its
schedules while it plans them), and scanner passes follow each other with no gap, so a removal
that waited only for the tables' locks gave way pass after pass and the disk grew. Each scanner
pass first tries a shared transaction-level advisory lock (SCAN_GATE; refused, it makes nothing
and looks again shortly), and every DDL transaction that locks a group's tables or the tables they
point at takes it exclusively before the tables' locks, waiting up to
SCHEDULER_PARTITION_GATE_TIMEOUT_MS. While it waits nobody queues behind it but
new scanner passes, which step aside (a waiting exclusive request refuses new shared ones), so the
DDL waits for the pass in progress and no longer; then the tables' locks are asked for under the
short timeout, against everything else that holds them for milliseconds.

Only one maintenance process does DDL at a time (a PostgreSQL advisory lock).
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from enum import StrEnum

from django.db import DatabaseError, connection, transaction

from runs.history_settings import get as setting

log = logging.getLogger("scheduler.partitions")

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class Group(StrEnum):
    """The history tables are removed by group: a run's rows go together, events on their own."""

    RUNS = "runs"
    OUTBOX = "outbox"


class Role(StrEnum):
    """What a partition holds (stored as runs_historypartition.role)."""

    KEPT = "kept"  # MINVALUE up: the rows that outlived their partitions
    LIVE = "live"  # one width of time
    FUTURE = "future"  # the catch-all up to MAXVALUE

# The tables of each group, in the order their locks are taken (the scanner's insert takes
# occurrences before runs; claims take runs before attempts).
GROUPS = {
    Group.RUNS: ("runs_occurrence", "runs_run", "runs_attempt"),
    Group.OUTBOX: ("runs_outboxevent",),
}
KEY = {"runs_occurrence": "scheduled_time", "runs_run": "scheduled_time", "runs_attempt": "scheduled_time",
       "runs_outboxevent": "created_at"}
GROUP_OF = {t: g for g, ts in GROUPS.items() for t in ts}
# Foreign keys the partitions carry (from the parent): (column, referenced table).
FOREIGN_KEYS = {
    "runs_occurrence": (("schedule_id", "schedules_schedule"), ("version_id", "schedules_scheduleversion")),
    "runs_run": (("tenant_id", "schedules_tenant"), ("schedule_id", "schedules_schedule"),
                 ("version_id", "schedules_scheduleversion")),
    "runs_attempt": (),
    "runs_outboxevent": (),
}
ADVISORY_LOCK = 0x5C4E_D01E  # one maintenance process at a time
SCAN_GATE = 0x5C4E_9A7E  # scanner passes shared, partition DDL exclusive (see the module's docstring)
UNSEAL_FUNCTION = "runs_history_unseal"
UNSEAL_TRIGGER = "history_unseal"


class PartitionLockBusy(Exception):
    """The DDL could not get its lock within SCHEDULER_PARTITION_LOCK_TIMEOUT_MS; try again later."""


def enabled() -> bool:
    return connection.vendor == "postgresql"


def width() -> timedelta:
    return timedelta(seconds=setting("SCHEDULER_PARTITION_SECONDS"))


def ahead() -> timedelta:
    """How far beyond now partitions must exist: at least one partition width and the scanner's
    look-ahead (runs are made up to that far ahead of their instant)."""
    return max(width(), timedelta(seconds=setting("SCHEDULER_PARTITION_AHEAD_SECONDS")))


def align(t: datetime) -> datetime:
    """The lower bound of the partition holding instant t."""
    w = setting("SCHEDULER_PARTITION_SECONDS")
    return EPOCH + timedelta(seconds=((t - EPOCH).total_seconds() // w) * w)


def partition_name(table: str, lower: datetime) -> str:
    return f"{table}_p{lower.astimezone(timezone.utc):%Y%m%dt%H%M%S}"


# The tables the partitions' foreign keys point at (FOREIGN_KEYS), in the order they are locked:
# the scanner's (its schedules with their versions, then runs, then the tenants).
REFERENCED = ("schedules_schedule", "schedules_scheduleversion", "schedules_tenant")


def lock_timeout_sql() -> str:
    """This transaction's lock timeout: the setting, but below half the server's deadlock_timeout,
    so that in a lock cycle with a hot statement maintenance stops waiting before the other side's
    deadlock check runs (that side would be the one rolled back)."""
    return ("SELECT set_config('lock_timeout', LEAST(%d, extract(epoch FROM "
            "current_setting('deadlock_timeout')::interval) * 500)::int || 'ms', true)"
            % int(setting("SCHEDULER_PARTITION_LOCK_TIMEOUT_MS")))


# Taken first by the DDL transactions that lock what a scanner pass holds (ddl, _short), waiting
# up to the gate's own timeout: nothing but new scanner passes queues behind it. (Set and taken in two statements: the order in which one
# SELECT's expressions run is not promised.)
GATE_TIMEOUT_SQL = "SELECT set_config('lock_timeout', %s || 'ms', true)"
GATE_CLOSE_SQL = """-- name: MaintenanceCloseScanGate
SELECT pg_advisory_xact_lock(%(gate)s)"""


def q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


# --- what exists ----------------------------------------------------------------------------------


@dataclass
class Part:
    name: str
    table: str
    lower: datetime | None  # None: MINVALUE
    upper: datetime | None  # None: MAXVALUE
    sealed: bool = False

    @property
    def role(self) -> Role:
        if self.lower is None:
            return Role.KEPT
        if self.upper is None:
            return Role.FUTURE
        return Role.LIVE


_LAYOUT_SQL = """
SELECT c.relname,
       CASE WHEN b[1] = 'MINVALUE' THEN NULL ELSE trim(both '''' from b[1])::timestamptz END,
       CASE WHEN b[2] = 'MAXVALUE' THEN NULL ELSE trim(both '''' from b[2])::timestamptz END
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
CROSS JOIN LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \\((.*)\\) TO \\((.*)\\)') AS b
WHERE i.inhparent = %s::regclass
"""


def layout(table: str) -> list[Part]:
    """The partitions of `table` as the database has them, oldest first, with our sealed flags."""
    with connection.cursor() as cur:
        cur.execute(_LAYOUT_SQL, [table])
        rows = cur.fetchall()
        cur.execute("SELECT name FROM runs_historypartition WHERE \"table\" = %s AND sealed", [table])
        sealed = {r[0] for r in cur.fetchall()}
    parts = [Part(name, table, lo, hi, name in sealed) for name, lo, hi in rows]
    parts.sort(key=lambda p: (p.lower is not None, p.lower or EPOCH))
    return parts


def sync_catalog(table: str) -> list[Part]:
    """Make runs_historypartition list exactly the partitions `table` has (a row missing after a
    crash or a test's flush comes back unsealed, which only makes plans include it)."""
    parts = layout(table)
    with connection.cursor() as cur:
        cur.execute("DELETE FROM runs_historypartition WHERE \"table\" = %s AND NOT (name = ANY(%s))",
                    [table, [p.name for p in parts]])
        for p in parts:
            cur.execute(
                """INSERT INTO runs_historypartition (name, "table", lower, upper, role, sealed, created_at)
                   VALUES (%s, %s, %s, %s, %s, false, now())
                   ON CONFLICT (name) DO UPDATE SET lower = EXCLUDED.lower, upper = EXCLUDED.upper, role = EXCLUDED.role""",
                [p.name, table, p.lower, p.upper, p.role])
    return parts


# --- the hot path's lower bound -------------------------------------------------------------------

# The dispatch statements read this first and restrict runs_run to scheduled_time >= the result, so
# PostgreSQL plans only the partitions that can hold a ready or leased run (planning costs per
# partition considered; see runs.store.postgres). NULL: some unsealed partition has no lower bound
# (the kept one), or the catalog has no rows: no restriction.
LIVE_FLOOR_SQL = """
SELECT CASE WHEN count(*) = 0 OR bool_or(lower IS NULL) THEN NULL ELSE min(lower) END
FROM runs_historypartition WHERE "table" = 'runs_run' AND NOT sealed
"""


# --- DDL helpers ----------------------------------------------------------------------------------


def _exec(cur, sql, params=None):
    cur.execute(sql, params)


def _checks_now(cur) -> None:
    """Run the deferred foreign-key checks queued so far in this transaction: PostgreSQL refuses an
    ALTER TABLE on a table with pending ones. The maintenance loop's transactions have none; a
    caller inside a longer transaction (a test, an import) has them deferred again afterwards by
    _checks_deferred, since inserts that follow may rely on deferral (a schedule and its version
    point at each other)."""
    _exec(cur, "SET CONSTRAINTS ALL IMMEDIATE")


def _checks_deferred(cur) -> None:
    # Every deferrable constraint of this schema is a foreign key Django made INITIALLY DEFERRED.
    _exec(cur, "SET CONSTRAINTS ALL DEFERRED")


# SQLSTATEs of a lock not granted: lock_timeout fired (55P03), chosen as a deadlock's victim (40P01).
LOCK_NOT_GRANTED = frozenset({"55P03", "40P01"})


def lock_not_granted(exc: BaseException) -> bool:
    return getattr(getattr(exc, "__cause__", None), "sqlstate", None) in LOCK_NOT_GRANTED


def referenced(group: str) -> tuple:
    """The tables the group's partitions point at, in REFERENCED order."""
    refs = {ref for t in GROUPS[group] for _, ref in FOREIGN_KEYS[t]}
    return tuple(t for t in REFERENCED if t in refs)


@contextmanager
def ddl(group: str | None, *, also: tuple = (), gate: bool | None = None):
    """A transaction of partition DDL that takes every lock it needs first: the scanner's gate
    (under its own timeout; by default when it locks a group, whose tables a scanner pass holds, and
    not for single partitions), then under the lock timeout the tables `group`'s partitions point
    at, then the group's tables (with their partitions), all ACCESS EXCLUSIVE (attaching a table
    that carries its own foreign keys, which a detached partition and a staged one do, takes that
    on the tables they point at), then `also` (single
    partitions, SHARE ROW EXCLUSIVE). A lock not granted in time, or a deadlock, anywhere in the
    transaction rolls it back and raises PartitionLockBusy: nothing changed, try again."""
    try:
        with transaction.atomic(), connection.cursor() as cur:
            if group is not None or also:
                _checks_now(cur)
            if group is not None if gate is None else gate:
                _close_scan_gate(cur)
            _exec(cur, lock_timeout_sql())
            if group is not None:
                refs = referenced(group)
                if refs:
                    _exec(cur, f"LOCK TABLE {', '.join(refs)} IN ACCESS EXCLUSIVE MODE")
                _exec(cur, "LOCK TABLE " + ", ".join(GROUPS[group]) + " IN ACCESS EXCLUSIVE MODE")
            if also:
                _exec(cur, "LOCK TABLE " + ", ".join(q(t) for t in also) + " IN SHARE ROW EXCLUSIVE MODE")
            yield cur
    except DatabaseError as exc:
        if lock_not_granted(exc):
            raise PartitionLockBusy(f"could not lock {group or ', '.join(also)} within the lock timeout") from exc
        raise


def _close_scan_gate(cur) -> None:
    _exec(cur, GATE_TIMEOUT_SQL, [str(int(setting("SCHEDULER_PARTITION_GATE_TIMEOUT_MS")))])
    try:
        _exec(cur, GATE_CLOSE_SQL, {"gate": SCAN_GATE})
    except DatabaseError as exc:
        if lock_not_granted(exc):
            raise PartitionLockBusy("a scanner pass went on longer than SCHEDULER_PARTITION_GATE_TIMEOUT_MS") from exc
        raise


def _short(sql, params=None) -> None:
    """One statement of DDL outside the locked transaction (staging, cleaning up) that takes a lock
    on the tables the foreign keys point at (SHARE ROW EXCLUSIVE to add a foreign key, ACCESS
    EXCLUSIVE to drop a table carrying one): under the lock timeout too, so that a request of
    maintenance queued behind a long reader never holds every later reader and writer of those
    tables behind it. Raises PartitionLockBusy when the lock is not granted in time."""
    with ddl(None, gate=True) as c:
        _exec(c, sql, params)


def _drop_quietly(names) -> None:
    """Drop what a swap that gave way had staged; whatever is still locked is left for the next
    attempt, whose staging drops it first."""
    for name in names:
        try:
            _short(f"DROP TABLE IF EXISTS {q(name)}")
        except PartitionLockBusy:
            pass


def _bound(v: datetime | None, minmax: str) -> str:
    return minmax if v is None else "'" + v.astimezone(timezone.utc).isoformat() + "'"


def name_child_indexes(cur, partition: str) -> None:
    """Name each index of `partition` after the parent's index it belongs to (run_ready_idx on
    runs_run_p20261130t000000 becomes run_ready_idx_p20261130t000000), so plans and catalogs show
    which of the model's indexes a partition's scan uses. PostgreSQL would name them after their
    columns."""
    table = next((t for t in KEY if partition.startswith(t + "_")), None)
    suffix = partition[len(table) + 1:] if table else partition
    cur.execute("""SELECT ci.relname, pi.relname FROM pg_index x
                   JOIN pg_class ci ON ci.oid = x.indexrelid
                   JOIN pg_inherits h ON h.inhrelid = x.indexrelid
                   JOIN pg_class pi ON pi.oid = h.inhparent
                   WHERE x.indrelid = %s::regclass""", [partition])
    for child, parent in cur.fetchall():
        want = f"{parent[:62 - len(suffix)]}_{suffix}"
        if child != want:
            _exec(cur, f"ALTER INDEX {q(child)} RENAME TO {q(want)}")


def try_advisory_lock() -> bool:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_try_advisory_lock(%s)", [ADVISORY_LOCK])
        return bool(cur.fetchone()[0])


def advisory_unlock() -> None:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_advisory_unlock(%s)", [ADVISORY_LOCK])


# The transactions holding a lock on any of the tables, oldest first: what a DDL transaction that
# gave way was waiting for (they are still there when it has given up: it waited the lock timeout).
LOCK_HOLDERS_SQL = """
SELECT coalesce(nullif(a.application_name, ''), a.backend_type), extract(epoch FROM clock_timestamp() - a.xact_start),
       a.state, left(regexp_replace(a.query, '[[:space:]]+', ' ', 'g'), 100)
FROM pg_stat_activity a
WHERE a.pid <> pg_backend_pid() AND a.xact_start IS NOT NULL
  AND a.pid IN (SELECT l.pid FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
                WHERE l.granted AND l.locktype = 'relation' AND c.relname = ANY(%s)
                  -- pg_locks spans every database; a relation's oid is only this database's
                  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))
ORDER BY a.xact_start
LIMIT %s"""


@dataclass(frozen=True)
class LockHolder:
    application: str
    seconds: float  # in its transaction
    state: str  # 'active', 'idle in transaction', ...
    query: str  # its current or last statement, cut short

    def __str__(self) -> str:
        return f"{self.application} for {self.seconds:.1f} s ({self.state}: {self.query!r})"


def lock_holders(limit: int = 3) -> list[LockHolder]:
    """The oldest transactions holding a lock on the history tables or the tables they point at:
    who a maintenance step that gave way gave way to (its log says so)."""
    tables = list(REFERENCED) + [t for group in GROUPS.values() for t in group]
    with connection.cursor() as cur:
        cur.execute(LOCK_HOLDERS_SQL, [tables, limit])
        return [LockHolder(app or "?", float(secs or 0), state or "?", query or "") for app, secs, state, query
                in cur.fetchall()]


def ensure_unseal_function(cur) -> None:
    cur.execute(f"""
CREATE OR REPLACE FUNCTION {UNSEAL_FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- A row of a sealed partition became ready or leased again (a manual retry, a backfill into
    -- the past): the dispatch statements must plan this partition again.
    -- The share lock first, whether the partition is sealed or not: the sealer's update of this
    -- row then waits for this transaction, and its check sees this row. Without it, a retry
    -- whose trigger found the partition unsealed (an update matching nothing locks nothing)
    -- could commit after the sealer's check: a ready run in a sealed partition, never claimed.
    -- Shared, so the claims of a partition's runs do not wait for each other; it fires only on
    -- ended partitions (where seal_quiet_partitions put the trigger), never on today's.
    PERFORM 1 FROM runs_historypartition WHERE name = TG_TABLE_NAME FOR SHARE;
    UPDATE runs_historypartition SET sealed = false WHERE name = TG_TABLE_NAME AND sealed;
    RETURN NULL;
END $$""")


def _split_off(cur, table: str, source: str, lo: datetime, hi: datetime) -> int:
    """Make `table`'s regular partition [lo, hi) and move into it the rows of that range from
    `source` (a detached catch-all or kept partition); returns how many rows moved. Under the
    group's lock (ensure_ahead, extend_back)."""
    name = partition_name(table, lo)
    _exec(cur, f"CREATE TABLE {q(name)} PARTITION OF {table} FOR VALUES FROM ({_bound(lo, '')}) TO ({_bound(hi, '')})")
    name_child_indexes(cur, name)
    _exec(cur, f"WITH m AS (DELETE FROM {q(source)} WHERE {KEY[table]} >= %s AND {KEY[table]} < %s RETURNING *) "
               f"INSERT INTO {q(name)} SELECT * FROM m", [lo, hi])
    return max(cur.rowcount, 0)


# --- making partitions ahead ----------------------------------------------------------------------


@dataclass
class EnsureResult:
    created: list[str] = field(default_factory=list)
    moved_from_future: int = 0


def ensure_ahead(now: datetime, *, until: datetime | None = None) -> EnsureResult:
    """Make the partitions of every group up to `until` (default now + ahead()), splitting them off
    the catch-all: detach `_future`, create the new partitions, move into them whatever landed in
    `_future` meanwhile (nothing, when the loop keeps up), attach `_future` again above them. One
    short transaction per group under the parents' lock."""
    until = until or now + ahead()
    out = EnsureResult()
    for group, tables in GROUPS.items():
        parts = {t: layout(t) for t in tables}
        future = {t: next((p for p in parts[t] if p.role == Role.FUTURE), None) for t in tables}
        if any(f is None for f in future.values()):
            raise RuntimeError(f"the {group} tables have no catch-all partition; was migration runs.0007 applied?")
        start = min(f.lower for f in future.values())
        if start >= until:
            continue
        bounds = []
        lo = start
        while lo < until:
            hi = align(lo) + width()
            bounds.append((lo, hi))
            lo = hi
        with ddl(group) as cur:
            for t in tables:
                fut = future[t].name
                _exec(cur, f"ALTER TABLE {t} DETACH PARTITION {q(fut)}")
                for lo, hi in bounds:
                    out.moved_from_future += _split_off(cur, t, fut, lo, hi)
                    out.created.append(partition_name(t, lo))
                # Rows older than the new partitions cannot be in _future (its lower bound was
                # `start`); rows beyond them stay.
                _exec(cur, f"ALTER TABLE {t} ATTACH PARTITION {q(fut)} FOR VALUES FROM ({_bound(bounds[-1][1], '')}) "
                           "TO (MAXVALUE)")
            for t in tables:
                sync_catalog(t)
            _checks_deferred(cur)
        if out.moved_from_future:
            log.warning("moved %d rows out of the catch-all partitions into %s: partitions were missing",
                        out.moved_from_future, ", ".join(out.created))
    return out


def extend_back(start: datetime) -> list[str]:
    """Make regular partitions from `start` (aligned) up to the oldest one, taking that range off the
    kept partition and moving its rows of that range into them: for importing or loading history
    older than the partitions (a benchmark's history, a restore). The kept partition is scanned
    once, under the parents' lock."""
    start = align(start)
    made = []
    for group, tables in GROUPS.items():
        with ddl(group) as cur:
            for t in tables:
                kept, oldest = _kept_and_oldest(t)
                top = oldest.lower if oldest else kept.upper
                if start >= top:
                    continue
                _exec(cur, f"ALTER TABLE {t} DETACH PARTITION {q(kept.name)}")
                lo = start
                while lo < top:
                    hi = min(align(lo) + width(), top)
                    _split_off(cur, t, kept.name, lo, hi)
                    made.append(partition_name(t, lo))
                    lo = hi
                _exec(cur, f"ALTER TABLE {t} ATTACH PARTITION {q(kept.name)} FOR VALUES FROM (MINVALUE) "
                           f"TO ({_bound(start, '')})")
                sync_catalog(t)
            _checks_deferred(cur)
    return made


def unpartitioned_rows(*, cap: int = 100_000) -> dict:
    """Rows in each catch-all partition (counted up to `cap`): rows written for an instant no
    partition covered yet. Anything above 0 means the maintenance loop is behind or not running."""
    out = {}
    with connection.cursor() as cur:
        for table in KEY:
            cur.execute(f"SELECT count(*) FROM (SELECT 1 FROM {q(table + '_future')} LIMIT %s) x", [cap])
            out[table] = cur.fetchone()[0]
    return out


def covered_until() -> datetime | None:
    """The end of the newest regular partition common to every table (partitions exist up to here)."""
    ends = []
    for table in KEY:
        fut = next((p for p in layout(table) if p.role == Role.FUTURE), None)
        if fut is None:
            return None
        ends.append(fut.lower)
    return min(ends)


# --- sealing --------------------------------------------------------------------------------------

_LIVE_IN = "SELECT EXISTS (SELECT 1 FROM {p} WHERE state = 'ready') OR EXISTS (SELECT 1 FROM {p} WHERE state = 'leased')"


def _unseal_trigger(cur, name: str) -> None:
    ensure_unseal_function(cur)
    _exec(cur, f"CREATE OR REPLACE TRIGGER {UNSEAL_TRIGGER} AFTER INSERT OR UPDATE OF state ON {q(name)} "
               f"FOR EACH ROW WHEN (NEW.state IN ('ready', 'leased')) EXECUTE FUNCTION {UNSEAL_FUNCTION}()")


def _seal_now(cur, name: str) -> None:
    """Seal a runs partition that holds no ready or leased run, in the caller's transaction, which
    holds the tables' lock (a new, empty one): its unseal trigger, then its flag."""
    _unseal_trigger(cur, name)
    _exec(cur, "UPDATE runs_historypartition SET sealed = true WHERE name = %s", [name])


def seal_quiet_partitions(now: datetime) -> list[str]:
    """Seal the runs partitions that have ended (and the kept one) and hold no ready or leased run,
    so the dispatch statements stop planning them. The unseal trigger goes on first, then the flag
    is set and the partition checked in one transaction: a run made ready in between either
    committed before the flag's update (which waits for the trigger's share lock on the catalog
    row), so the check sees it and the flag is not set, or fires the trigger after, whose update
    of the flag waits for this transaction and undoes it."""
    sealed = []
    parts = sync_catalog("runs_run")
    current = align(now)
    for p in parts:
        if p.sealed or p.role == Role.FUTURE or (p.upper is not None and p.upper > current):
            continue
        # Each under the lock timeout; a partition whose lock is not granted is sealed on a later pass.
        try:
            with ddl(None, also=(p.name,)) as cur:
                _unseal_trigger(cur, p.name)
                _checks_deferred(cur)
            with ddl(None) as cur:
                _exec(cur, "UPDATE runs_historypartition SET sealed = true WHERE name = %s", [p.name])
                _exec(cur, _LIVE_IN.format(p=q(p.name)))
                if cur.fetchone()[0]:
                    transaction.set_rollback(True)
                    continue
        except PartitionLockBusy:
            continue
        sealed.append(p.name)
    return sealed


# --- removing a partition with its survivors --------------------------------------------------------


@dataclass
class SwapPlan:
    """What one removal does: the oldest regular partition of each table of `group` goes, together
    with the current kept partition; a new kept partition holding the survivors of both replaces them.

    `survivors` is SQL selecting the ids (`id`) of the runs (or events) of a source table {src} that
    outlive this removal, built from index-backed parts (runs.retention builds it), each part ending
    with `{only}` (a further condition on `id`, or ""); `params` go with it.
    `changed` selects ids that may have changed since staging (the live ones, those retried lately):
    they are copied again under the lock."""

    group: str
    upper: datetime  # the removed partition's upper bound: the new kept partition ends here
    survivors: str
    params: dict
    changed: str


@dataclass
class SwapResult:
    group: str
    # partition name -> rows it had, as ANALYZE counted them while staging: exact for a partition
    # under 30,000 pages (ANALYZE then reads every page), a sampled estimate above
    removed: dict = field(default_factory=dict)
    kept: dict = field(default_factory=dict)  # table -> rows in the new kept partition
    kept_name: dict = field(default_factory=dict)
    lock_ms: float = 0.0
    staged_s: float = 0.0
    exported: list = field(default_factory=list)


def _kept_and_oldest(table: str) -> tuple[Part, Part | None]:
    parts = layout(table)
    kept = next(p for p in parts if p.role == Role.KEPT)
    live = [p for p in parts if p.role == Role.LIVE]
    return kept, (live[0] if live else None)


def _next_kept_name(table: str, current: str) -> str:
    prefix = f"{table}_kept_"
    n = int(current[len(prefix):]) + 1 if current.startswith(prefix) and current[len(prefix):].isdigit() else 1
    return f"{prefix}{n}"


def _stage_table(cur, table: str, stage: str, upper: datetime) -> None:
    """An empty table shaped like `table`'s partitions (same columns, indexes and checks), with the
    bound of its future place as a CHECK (so attaching it needs no scan)."""
    key = KEY[table]
    _short(f"DROP TABLE IF EXISTS {q(stage)}")  # a leftover carries foreign keys: see _short
    _exec(cur, f"CREATE TABLE {q(stage)} (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING INDEXES)")
    _exec(cur, f"ALTER TABLE {q(stage)} ADD CONSTRAINT {q(stage + '_bound')} CHECK ({key} < %s)", [upper])


def _add_foreign_keys(cur, stage: str, table: str) -> None:
    """The parent's foreign keys on the staged table, added once its rows are in and validated while
    it is still detached (VALIDATE blocks no writer of the referenced tables), so that attaching it
    finds them in place and validates nothing under the lock."""
    for column, ref in FOREIGN_KEYS[table]:
        _short(f"ALTER TABLE {q(stage)} ADD CONSTRAINT {q(f'{stage}_{column}_fk')} FOREIGN KEY ({column}) "
               f"REFERENCES {ref} (id) DEFERRABLE INITIALLY DEFERRED NOT VALID")
        _exec(cur, f"ALTER TABLE {q(stage)} VALIDATE CONSTRAINT {q(f'{stage}_{column}_fk')}")


def _cols(cur, table: str) -> str:
    cur.execute("SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute "
                "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped", [table])
    return cur.fetchone()[0]


def swap(plan: SwapPlan, *, now: datetime, export=None, record=None) -> SwapResult | None:
    """Remove the oldest regular partition of plan.group, keeping its survivors and the kept
    partition's survivors in a new kept partition (or, when plan.upper is the kept partition's own
    bound, rewrite the kept partition alone with its survivors). Returns None when the lock was not
    granted in time (nothing changed; the next pass tries again). `record(result)` is called in the
    swap's own transaction once the old partitions are dropped (the audit entry), so that a removal
    is never committed without its record, nor a record without its removal.

    Steps, in this order because each depends on the one before:
    1. Stage, with no lock on the parents: copy the survivors' rows (runs by the index-backed
       survivor query; their attempts and occurrences by key) from both sources into new standalone
       tables carrying the bound as a CHECK and the foreign keys validated. Remember which staged
       runs were live: their rows may change until the lock is taken. This is the part whose cost
       follows the number of survivors, and it blocks nobody.
    2. Export (optional) what is about to go: every row of the sources not staged.
    3. Under the parents' ACCESS EXCLUSIVE lock (lock_timeout): copy again the runs that may have
       changed since staging (live then or now, retried lately), with their attempts and occurrence;
       detach the old partitions, attach the staged tables as the new kept partition (no scan: the
       CHECK proves the bound; no validation: the foreign keys are there and valid), drop the old.
       This part costs what changed during staging, not what is removed. `record` writes the
       removal's audit entry in the same transaction.
    """
    group, tables = plan.group, GROUPS[plan.group]
    res = SwapResult(group)
    runs_table = "runs_run" if group == Group.RUNS else "runs_outboxevent"
    kept, oldest = {}, {}
    for t in tables:
        kept[t], oldest[t] = _kept_and_oldest(t)
        if kept[t].upper == plan.upper:
            oldest[t] = None  # only the kept partition is rewritten
        elif oldest[t] is None or oldest[t].upper != plan.upper:
            raise RuntimeError(f"{t}: the oldest partition does not end at {plan.upper} (layout changed?)")
    stage = {t: _next_kept_name(t, kept[t].name) for t in tables}
    sources = {t: tuple(x.name for x in (kept[t], oldest[t]) if x is not None) for t in tables}

    try:
        return _swap(plan, group, tables, runs_table, sources, stage, res, now=now, export=export, record=record)
    except PartitionLockBusy:
        # Nothing changed: the lock phase rolled back whole, and staging touches only its own tables.
        _drop_quietly([*stage.values(), "history_swap_ids"])
        return None


def _swap(plan, group, tables, runs_table, sources, stage, res, *, now, export, record) -> SwapResult:
    # 1. stage
    t0 = time.monotonic()
    staged_at = now
    with connection.cursor() as cur:
        _checks_now(cur)
        for t in tables:
            _stage_table(cur, t, stage[t], plan.upper)
        cols = {t: _cols(cur, t) for t in tables}
        ids = "history_swap_ids"
        _exec(cur, f"DROP TABLE IF EXISTS {ids}")
        _exec(cur, f"CREATE UNLOGGED TABLE {ids} (id uuid PRIMARY KEY, live boolean NOT NULL)"
                   if group == Group.RUNS else
                   f"CREATE UNLOGGED TABLE {ids} (id bigint PRIMARY KEY, live boolean NOT NULL)")
        for src in sources[runs_table]:
            _exec(cur, f"INSERT INTO {ids} (id, live) SELECT id, bool_or(live) FROM "
                       f"({plan.survivors.format(src=q(src), only='')}) s GROUP BY id ON CONFLICT (id) DO NOTHING",
                       plan.params)
        _exec(cur, f"ANALYZE {ids}")
        # How many rows each source holds, for the audit: ANALYZE reads at most 30,000 pages (every
        # page of a smaller partition, so its count is exact) and takes no lock dispatch waits for;
        # pg_class.reltuples read under the lock instead was -1 (so 0) for a partition never
        # analysed, and the audit said a partition of removed runs had none.
        for t in tables:
            for src in sources[t]:
                _exec(cur, f"ANALYZE {q(src)}")
                cur.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass", [q(src)])
                res.removed[src] = max(0, cur.fetchone()[0])
        _copy_survivors(cur, group, sources, stage, cols, ids)
        for t in tables:
            _add_foreign_keys(cur, stage[t], t)
            _exec(cur, f"ANALYZE {q(stage[t])}")
        _checks_deferred(cur)
    res.staged_s = time.monotonic() - t0

    # 2. export what goes
    if export is not None:
        res.exported = export(group, sources, stage)

    # 3. swap under the lock: every lock first (ddl), so nothing below waits for one
    t1 = time.monotonic()
    with ddl(group) as cur:
        changed = "history_swap_changed"
        _exec(cur, f"DROP TABLE IF EXISTS {changed}")
        _exec(cur, f"CREATE TEMP TABLE {changed} ON COMMIT DROP AS SELECT id FROM {ids} WHERE live")
        for src in sources[runs_table]:
            _exec(cur, f"INSERT INTO {changed} {plan.changed.format(src=q(src))}", {**plan.params, "staged_at": staged_at})
        # Statistics of the few changed ids, so that every statement below finds their rows by
        # key instead of reading every survivor while the tables are locked (with 60,000
        # survivors the lock was held 500-1,200 ms, nearly all of it those reads).
        _exec(cur, f"ANALYZE {changed}")
        _exec(cur, f"DELETE FROM {ids} WHERE id IN (SELECT id FROM {changed})")
        _uncopy(cur, group, stage, changed)
        only = f" AND id IN (SELECT id FROM {changed})"
        for src in sources[runs_table]:
            _exec(cur, f"INSERT INTO {ids} (id, live) SELECT id, bool_or(live) FROM "
                       f"({plan.survivors.format(src=q(src), only=only)}) s GROUP BY id ON CONFLICT (id) DO NOTHING",
                       plan.params)
        _copy_survivors(cur, group, sources, stage, cols, ids, only=changed)
        for t in tables:
            for src in sources[t]:
                _exec(cur, f"ALTER TABLE {t} DETACH PARTITION {q(src)}")
            _exec(cur, f"ALTER TABLE {t} ATTACH PARTITION {q(stage[t])} FOR VALUES FROM (MINVALUE) TO ({_bound(plan.upper, '')})")
            for src in sources[t]:
                _exec(cur, f"DROP TABLE {q(src)}")
            name_child_indexes(cur, stage[t])
            cur.execute(f"SELECT count(*) FROM {q(stage[t])}")
            res.kept[t] = cur.fetchone()[0]
            res.kept_name[t] = stage[t]
        _exec(cur, f"DROP TABLE {ids}")
        _exec(cur, f"DROP TABLE {changed}")
        _removed(cur, tables, res, t1, record)
    return res


def _removed(cur, tables, res: SwapResult, locked_at: float, record, *, sealed: str | None = None) -> None:
    """The end of a removal's locked transaction: the catalog as the tables now are (with `sealed`,
    a runs partition known to hold no ready or leased run, sealed), the deferred checks back, the
    time the lock was held, and the audit entry (`record`) in the same transaction."""
    for t in tables:
        sync_catalog(t)
    if sealed is not None:
        _seal_now(cur, sealed)
    _checks_deferred(cur)
    res.lock_ms = (time.monotonic() - locked_at) * 1000
    if record is not None:
        record(res)


def drop_oldest(plan: SwapPlan, *, record=None) -> SwapResult | None:
    """Remove the oldest regular partition of plan.group when nothing in it outlives it and the
    kept partition is empty (the caller counted no survivors and exports nothing): one transaction
    under the group's locks, checking both again there, instead of a swap's staging, whose several
    DDL transactions must each get their locks in turn (on a saturated host the removals fell behind
    the partitions' ageing, and the disk grew). The old partitions and the empty kept one are
    dropped and an empty kept partition up to plan.upper is made in their place. Returns None when
    the locks were not granted in time, or when the check under them found a row to keep (a run
    retried by hand meanwhile): nothing changed, and the caller's next pass swaps instead."""
    group, tables = plan.group, GROUPS[plan.group]
    main = "runs_run" if group == Group.RUNS else "runs_outboxevent"
    res = SwapResult(group)
    parts = {t: _kept_and_oldest(t) for t in tables}
    if any(oldest is None or oldest.upper != plan.upper for _, oldest in parts.values()):
        raise RuntimeError(f"{group}: the oldest partitions do not end at {plan.upper} (layout changed?)")
    with connection.cursor() as cur:
        # What the audit says was removed: ANALYZE counts a partition under 30,000 pages exactly, and
        # takes no lock dispatch waits for (read under the lock, reltuples was -1 for a partition
        # never analysed).
        for t, (_, oldest) in parts.items():
            _exec(cur, f"ANALYZE {q(oldest.name)}")
            cur.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass", [q(oldest.name)])
            res.removed[oldest.name] = max(0, cur.fetchone()[0])
    t1 = time.monotonic()
    try:
        with ddl(group) as cur:
            kept_rows = " OR ".join(f"EXISTS (SELECT 1 FROM {q(kept.name)})" for kept, _ in parts.values())
            _exec(cur, f"SELECT {kept_rows} OR EXISTS (SELECT 1 FROM ("
                       f"{plan.survivors.format(src=q(parts[main][1].name), only='')}) s)", plan.params)
            if cur.fetchone()[0]:
                transaction.set_rollback(True)
                return None
            for t, (kept, oldest) in parts.items():
                name = _next_kept_name(t, kept.name)
                for old in (oldest, kept):
                    _exec(cur, f"ALTER TABLE {t} DETACH PARTITION {q(old.name)}")
                    _exec(cur, f"DROP TABLE {q(old.name)}")
                _exec(cur, f"CREATE TABLE {q(name)} PARTITION OF {t} FOR VALUES FROM (MINVALUE) TO "
                           f"({_bound(plan.upper, '')})")
                name_child_indexes(cur, name)
                res.kept[t], res.kept_name[t] = 0, name
                res.removed.setdefault(kept.name, 0)
            # The new kept partition is empty: sealed at once, so that the dispatch statements'
            # live floor does not fall to none (the kept partition has no lower bound) until the
            # next seal pass.
            _removed(cur, tables, res, t1, record, sealed=res.kept_name.get("runs_run"))
    except PartitionLockBusy:
        return None
    return res


def _copy_survivors(cur, group, sources, stage, cols, ids, only=None):
    """Copy the rows of the runs (events) listed in `ids` (or only those also in `only`) and, for
    runs, their attempts and occurrences, from both sources into the staged tables."""
    pick = f"SELECT id FROM {ids}" + (f" WHERE id IN (SELECT id FROM {only})" if only else "")
    if group == Group.OUTBOX:
        for src in sources["runs_outboxevent"]:
            _exec(cur, f"INSERT INTO {q(stage['runs_outboxevent'])} ({cols['runs_outboxevent']}) "
                       f"SELECT {cols['runs_outboxevent']} FROM {q(src)} WHERE id IN ({pick})")
        return
    for src in sources["runs_run"]:
        _exec(cur, f"INSERT INTO {q(stage['runs_run'])} ({cols['runs_run']}) "
                   f"SELECT {cols['runs_run']} FROM {q(src)} WHERE id IN ({pick})")
    picked_runs = f"SELECT id, scheduled_time, occurrence_id FROM {q(stage['runs_run'])} WHERE id IN ({pick})"
    for src in sources["runs_attempt"]:
        _exec(cur, f"INSERT INTO {q(stage['runs_attempt'])} ({cols['runs_attempt']}) "
                   f"SELECT {', '.join('a.' + c.strip() for c in cols['runs_attempt'].split(','))} FROM {q(src)} a "
                   f"JOIN ({picked_runs}) r ON a.run_id = r.id AND a.scheduled_time = r.scheduled_time")
    for src in sources["runs_occurrence"]:
        _exec(cur, f"INSERT INTO {q(stage['runs_occurrence'])} ({cols['runs_occurrence']}) "
                   f"SELECT {', '.join('o.' + c.strip() for c in cols['runs_occurrence'].split(','))} FROM {q(src)} o "
                   f"JOIN ({picked_runs}) r ON o.id = r.occurrence_id AND o.scheduled_time = r.scheduled_time "
                   f"ON CONFLICT DO NOTHING")


def _uncopy(cur, group, stage, changed):
    if group == Group.OUTBOX:
        _exec(cur, f"DELETE FROM {q(stage['runs_outboxevent'])} WHERE id IN (SELECT id FROM {changed})")
        return
    _exec(cur, f"DELETE FROM {q(stage['runs_attempt'])} WHERE run_id IN (SELECT id FROM {changed})")
    _exec(cur, f"DELETE FROM {q(stage['runs_occurrence'])} WHERE id IN "
               f"(SELECT occurrence_id FROM {q(stage['runs_run'])} WHERE id IN (SELECT id FROM {changed}))")
    _exec(cur, f"DELETE FROM {q(stage['runs_run'])} WHERE id IN (SELECT id FROM {changed})")
