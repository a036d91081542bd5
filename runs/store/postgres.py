"""The run queue's hot statements on PostgreSQL: one round trip per batch step. See `runs.store`.

`PostgresStore` is `PortableStore` with the dispatch hot path (materialise, claim, heartbeat,
complete, events) rewritten: a batch goes in as one array literal or one JSON document (a single
string join or C-encoded dump, not a Python adapter call per element), and each step is a single
statement. Why each statement has its shape is said beside it; the measurements are in
bench/README.md and docs/scaling.md.

State names, event kinds and policy names come from the enums in `runs.models` and
`schedules.models` (formatted into the statements below), never spelled out as literals here.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from datetime import datetime

import psycopg
from django.db import DEFAULT_DB_ALIAS, connection, connections, models

from runs.decisions import EVIDENCE, Claimed, Decided, completion_kind
from runs.models import TERMINAL_STATES, EventKind, RunState
from runs.partitions import LIVE_FLOOR_SQL
from runs.store.history import PostgresHistory
from runs.store.portable import PortableStore, _keep_recent_count
from scheduler_project.foundation.postgresql.prepared import prepared_cursor

READY, LEASED = RunState.READY.value, RunState.LEASED.value
TERMINAL = ", ".join(f"'{s}'" for s in TERMINAL_STATES)


@contextmanager
def _cursor():
    """A server-side-binding cursor on Django's connection (same transaction): the query and its
    array parameters travel separately, so Python does not compose a literal query text per batch.
    Statements are never prepared (`prepare=False` at each execute): a plan cached while a queue
    table was nearly empty would be kept after the table filled."""
    connection.ensure_connection()
    cur = psycopg.Cursor(connection.connection)
    try:
        yield _Unprepared(cur)
    finally:
        cur.close()


class _Unprepared:
    def __init__(self, cur):
        self.cur = cur

    def execute(self, query, params=None):
        return self.cur.execute(query, params, prepare=False)

    def fetchall(self):
        return self.cur.fetchall()


# The live floor (runs.partitions.LIVE_FLOOR_SQL): runs_run is partitioned by scheduled_time, and
# PostgreSQL plans every partition a statement may touch, at a cost per partition that would soon
# exceed the statement's own work. Every ready or leased run is at or above the floor (partitions
# below it are sealed: none of their runs is ready or leased, and a trigger unseals one the moment
# that changes), so the dispatch statements name it, as a parameter the planner prunes with, and
# plan only the few partitions from there up. Each statement comes in two spellings: with the
# floor, and without (no floor known: the catalog is empty or the kept partition is live).
def _named(name: str, floored: bool, sql: str) -> str:
    """A statement's whole text under its name (`-- name: RunClaimDue` on its first line, as
    pg_stat_statements and the logs show it); the spelling with the floor is `<name>AboveFloor`."""
    return f"-- name: {name}{'AboveFloor' if floored else ''}\n{sql.strip()}\n"


def _floor(alias: str, floored: bool) -> str:
    return f" AND {alias}scheduled_time >= %(floor)s" if floored else ""


def _due_tenants(now: str, floored: bool = False) -> str:
    """Tenants with due runs as of `now`: a skip scan over run_ready_tenant_idx, one index probe
    per tenant with due runs, however many runs each has."""
    return f"""RECURSIVE t(tenant_id) AS (
    (SELECT tenant_id FROM runs_run WHERE state = '{READY}' AND next_eligible_at <= {now}{_floor("", floored)}
     ORDER BY tenant_id LIMIT 1)
    UNION ALL
    SELECT (SELECT r.tenant_id FROM runs_run r
            WHERE r.state = '{READY}' AND r.next_eligible_at <= {now} AND r.tenant_id > t.tenant_id{_floor("r.", floored)}
            ORDER BY r.tenant_id LIMIT 1)
    FROM t WHERE t.tenant_id IS NOT NULL
)"""


def _tenant_due_runs(tenant: str, now: str, limit: str, floored: bool = False, without: str = "") -> str:
    """Up to `limit` of one tenant's oldest due runs, locked; rows another worker holds are
    skipped, not waited for. Written so that only run_ready_tenant_idx gives this order: with
    `tenant_id = x ... ORDER BY next_eligible_at` the planner walked run_ready_idx and filtered by
    tenant, reading every entry of runs already claimed (they stay in that index until vacuum).
    A range instead of an equality keeps tenant_id in the sort order. The due time stays a filter:
    a row comparison `(tenant_id, next_eligible_at) <= (tenant, now)` would end the scan at `now`
    and skip the runs the look-ahead made early, but measured back to back it cost PostgreSQL
    about twice the CPU in a burst (bench/README.md, "Issues 17 and 18").

    `without`, an array of target hosts, leaves out the tenant's runs to hosts that have no room:
    otherwise a backlog to one full host, oldest first, would fill every read and the tenant's
    other targets would never be reached. Only a tenant with a full target pays for the filter
    (it reads past that host's due runs); the array is empty for the others."""
    skip = f" AND r.target_host <> ALL({without})" if without else ""
    return f"""
    SELECT r.id, r.tenant_id, r.target_host, r.next_eligible_at FROM runs_run r
    WHERE r.state = '{READY}' AND r.tenant_id >= {tenant} AND r.tenant_id <= {tenant}
      AND r.next_eligible_at <= {now}{_floor("r.", floored)}{skip}
    ORDER BY r.tenant_id, r.next_eligible_at
    LIMIT {limit}
    FOR UPDATE OF r SKIP LOCKED"""


# The claim with caps in play, step 1: which tenants have due runs.
def _due_tenants_sql(floored: bool) -> str:
    return ("WITH " + _due_tenants("%(now)s", floored)
            + "\nSELECT tenant_id FROM t WHERE tenant_id IS NOT NULL LIMIT %(max_tenants)s")


# Step 2: up to per_tenant due runs of each of these tenants, locked, in the given tenant order,
# leaving out each tenant's full targets (%(full)s: a JSON object, tenant id -> hosts).
def _candidates_sql(floored: bool) -> str:
    return """
SELECT c.id, c.tenant_id, c.target_host
FROM unnest(%(tenants)s::uuid[]) WITH ORDINALITY AS t(tenant_id, pos)
CROSS JOIN LATERAL (SELECT ARRAY(SELECT jsonb_array_elements_text(%(full)s::jsonb -> t.tenant_id::text)) AS hosts) f
CROSS JOIN LATERAL (""" + _tenant_due_runs("t.tenant_id", "%(now)s", "%(per_tenant)s", floored, "f.hosts") + """
) c
ORDER BY t.pos
"""


DUE_TENANTS_SQL = {f: _named("RunDueTenants", f, _due_tenants_sql(f)) for f in (False, True)}
CANDIDATES_SQL = {f: _named("RunDueCandidates", f, _candidates_sql(f)) for f in (False, True)}


# The scheduled time as text in exactly the form runs.decisions.iso writes (UTC, "Z",
# microseconds only when there are some): it goes into a header as is, and text parses in C where
# a timestamptz goes through Django's Python-level time-zone loader.
_SCHEDULED_ISO = """CASE WHEN date_part('microseconds', l.scheduled_time)::bigint % 1000000 = 0
       THEN to_char(l.scheduled_time AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
       ELSE to_char(l.scheduled_time AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') END"""


def _published_at(tenant: str, now: str) -> str:
    """An event's published_at as it is written: already published when its tenant has no webhook
    (there is nobody to deliver it to, and the relay would only mark it: a second write of the row
    and of its index entries), otherwise left for the relay. One primary-key probe of the (small)
    tenants table per event. PortableStore.event_insert_many makes the same choice."""
    return f"(SELECT CASE WHEN tn.notification_url = '' THEN {now} END FROM schedules_tenant tn WHERE tn.id = {tenant})"


def _lease(now: str, until: str) -> str:
    """The SET list of a claim: the one spelling of ready -> leased on PostgreSQL."""
    return f"""state = '{LEASED}', generation = r.generation + 1, attempts_used = r.attempts_used + 1,
        lease_until = {until}, lease_owner = %(worker)s, reason = '', next_eligible_at = NULL,
        first_started_at = COALESCE(r.first_started_at, {now})"""


_LEASED_RETURNING = """RETURNING r.id, r.generation, r.attempts_used, r.max_attempts, r.tenant_id, r.schedule_id,
              r.schedule_version, r.scheduled_time, r.version_id, r.target_host"""


def _claim_tail(now: str) -> str:
    """After a `leased` CTE: open the attempts, write the events and return each claimed run with
    its version's call and retry policy."""
    return f"""), opened AS (
    INSERT INTO runs_attempt (run_id, scheduled_time, generation, worker_id, started_at, error_class, error,
                              response_excerpt, remote_address, canceled_in_flight)
    SELECT id, scheduled_time, generation, %(worker)s, {now}, '', '', '', '', false FROM leased
    RETURNING id, run_id
), events AS (
    INSERT INTO runs_outboxevent (event_id, tenant_id, run_id, kind, payload, created_at,
                                  publish_attempts, last_error, published_at)
    SELECT gen_random_uuid(), tenant_id, id, '{EventKind.LEASED.value}',
           jsonb_build_object('runId', id::text, 'generation', generation, 'workerId', %(worker)s::text,
                              'state', '{LEASED}'),
           {now}, 0, '', {_published_at("tenant_id", now)}
    FROM leased
)
SELECT l.id, l.generation, o.id, l.attempts_used, l.max_attempts, l.tenant_id, l.schedule_id,
       l.schedule_version, {_SCHEDULED_ISO.replace("%", "%%")}, l.version_id,
       v.target_url, v.target_method, v.target_headers::text, v.target_timeout_seconds, v.payload::text,
       v.backoff_base_seconds, v.backoff_max_seconds, v.overlap_policy,
       l.id::text, l.schedule_id::text, l.target_host
FROM leased l JOIN opened o ON o.run_id = l.id
-- One primary-key probe per claimed run. OFFSET 0 keeps the planner from turning this into a
-- hash join over the whole versions table (it did, with stale statistics, growing with every
-- schedule ever made).
CROSS JOIN LATERAL (SELECT * FROM schedules_scheduleversion sv WHERE sv.id = l.version_id OFFSET 0) v
"""


# Claim: lease the picked runs, open their attempts and write their events, in one statement.
def _claim_sql(floored: bool) -> str:
    return f"""
WITH leased AS (
    UPDATE runs_run r SET {_lease("%(now)s", "%(until)s")}
    -- `state || ''`: a plain `state = ...` matches run_ready_idx's predicate (see _BY_PRIMARY_KEY).
    WHERE r.id = ANY(%(ids)s::uuid[]) AND r.state || '' = '{READY}'{_floor("r.", floored)}
    {_LEASED_RETURNING}
{_claim_tail("%(now)s")}"""


CLAIM_SQL = {f: _named("RunClaim", f, _claim_sql(f)) for f in (False, True)}

# Claim without explicit caps in play, in one statement: find the tenants with due runs (a skip
# scan over run_ready_tenant_idx, one probe per tenant), rotate them by %(shift)s, lock up to
# twice a fair share of each tenant's oldest due runs (SKIP LOCKED), take them round-robin across
# tenants up to %(limit)s, and lease them as CLAIM_SQL does: the choice runs.decisions.rotate/
# fair_share/pick make for the portable store. One round trip instead of four means the rows are
# locked for one statement and a commit, so concurrent workers skip fewer of each other's rows.
#
# The default shares (runs.decisions.Holding): the claiming worker says what it holds, per tenant
# (%(held_t)s, %(held_tn)s) and per tenant and target host (%(held_ht)s, %(held_h)s, %(held_hn)s),
# and how many slots one tenant (%(tenant_cap)s) and one tenant's calls to one host
# (%(host_cap)s) may hold. A tenant without room is not served (its rows are not even locked),
# one with a little room has only that many rows read, and a target's room is taken in the order
# the pick takes runs. The arrays are as long as the worker's distinct tenants and targets in
# flight; they are hash-joined, never probed per row.
def _claim_due_sql(floored: bool) -> str:
    return "WITH " + _due_tenants("statement_timestamp()", floored) + f""", held_t AS (
    SELECT * FROM unnest(%(held_t)s::uuid[], %(held_tn)s::int[]) AS h(tenant_id, n)
), held_h AS (
    SELECT * FROM unnest(%(held_ht)s::uuid[], %(held_h)s::text[], %(held_hn)s::int[]) AS h(tenant_id, host, n)
), due AS (
    SELECT d.tenant_id, row_number() OVER (ORDER BY d.tenant_id) AS n, count(*) OVER () AS total,
           %(tenant_cap)s - COALESCE(ht.n, 0) AS room
    FROM (SELECT tenant_id FROM t WHERE tenant_id IS NOT NULL LIMIT 10000) d
    LEFT JOIN held_t ht ON ht.tenant_id = d.tenant_id
), served AS (
    SELECT tenant_id, (n + %(shift)s) %% total AS pos, room,
           ARRAY(SELECT h.host FROM held_h h WHERE h.tenant_id = due.tenant_id AND h.n >= %(host_cap)s) AS full_hosts
    FROM due WHERE room > 0 ORDER BY pos LIMIT %(limit)s
), share AS (
    SELECT 2 * ceil(%(limit)s::numeric / GREATEST(count(*), 1))::int AS per_tenant FROM served
), cand AS (
    SELECT c.id, c.next_eligible_at, c.target_host, s.tenant_id, s.pos
    FROM served s CROSS JOIN share CROSS JOIN LATERAL ({_tenant_due_runs(
    "s.tenant_id", "statement_timestamp()", "LEAST(share.per_tenant, s.room)", floored, "s.full_hosts")}
    ) c
), turns AS (
    SELECT id, pos, tenant_id, target_host,
           row_number() OVER (PARTITION BY pos ORDER BY next_eligible_at, id) AS turn,
           row_number() OVER (PARTITION BY pos, target_host ORDER BY next_eligible_at, id) AS host_turn
    FROM cand
), picked AS (
    SELECT k.id FROM turns k LEFT JOIN held_h hh ON hh.tenant_id = k.tenant_id AND hh.host = k.target_host
    WHERE k.host_turn <= %(host_cap)s - COALESCE(hh.n, 0)
    ORDER BY k.turn, k.pos
    LIMIT %(limit)s
), leased AS (
    UPDATE runs_run r SET {_lease("statement_timestamp()",
                                  "statement_timestamp() + make_interval(secs => %(lease)s)")}
    -- Primary-key probes for the picked ids: written as a join, the planner hashed the picked
    -- rows and scanned the whole runs table (every run ever kept) to find them.
    WHERE r.id = ANY(ARRAY(SELECT id FROM picked)) AND r.state || '' = '{READY}'{_floor("r.", floored)}
    {_LEASED_RETURNING}
{_claim_tail("statement_timestamp()")}"""


CLAIM_DUE_SQL = {f: _named("RunClaimDue", f, _claim_due_sql(f)) for f in (False, True)}


def _claimed(cur) -> list[Claimed]:
    """Claimed runs with their version's call (url, method, headers JSON, timeout, payload JSON),
    retry and overlap policy, and their ids and scheduled time as text."""
    out = []
    for r in cur.fetchall():
        iso = r[8]
        out.append(Claimed(*r[:8], datetime.fromisoformat(iso), r[9], r[10:15], r[15:18], r[18], r[19], iso, r[20]))
    return out


def share_params(holding) -> dict:
    """CLAIM_DUE_SQL's parameters for the default shares of a worker holding `holding`."""
    return {
        "tenant_cap": holding.tenant_cap, "host_cap": holding.host_cap,
        "held_t": _uuid_array(holding.tenants), "held_tn": _int_array(holding.tenants.values()),
        "held_ht": _uuid_array(k[0] for k in holding.hosts), "held_h": [k[1] for k in holding.hosts],
        "held_hn": _int_array(holding.hosts.values()),
    }


def _int_array(values) -> str:
    return "{" + ",".join(map(str, values)) + "}"


def _uuid_array(ids) -> str:
    # One array literal (uuids need no quoting): one string join instead of a Python dumper call
    # per element.
    return "{" + ",".join(map(str, ids)) + "}"


# Heartbeat: extend the leases this worker still holds at these generations, in one statement;
# the rows returned are the ones it still owns (the fence is the UPDATE's own WHERE).
EXTEND_LEASES_SQL = {f: _named("RunExtendLeases", f, f"""
UPDATE runs_run r SET lease_until = statement_timestamp() + make_interval(secs => %(lease)s)
FROM unnest(%(ids)s::uuid[], %(gens)s::int[]) AS k(id, generation)
WHERE r.id = k.id AND r.generation = k.generation AND r.state = '{LEASED}' AND r.lease_owner = %(worker)s{_floor("r.", f)}
RETURNING r.id, r.generation
""") for f in (False, True)}


# ISO 8601 in UTC with microseconds, as the outbox payloads written from Python carry them.
_ISO = """to_char(({}) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"""

# The result's columns in the JSON rows below, one per runs.decisions.EVIDENCE attribute, and the
# evidence object built from them as Result.evidence() builds it in Python.
_RESULT_COLUMNS = {"outcome": ("o", "text"), "http_status": ("h", "int"), "error_class": ("c", "text"),
                   "error": ("m", "text"), "latency_ms": ("l", "int")}
_EVIDENCE = "jsonb_build_object(" + ", ".join(
    f"'{key}', " + (f"NULLIF(v.{_RESULT_COLUMNS[attr][0]}, '')" if empty_is_null else f"v.{_RESULT_COLUMNS[attr][0]}")
    for key, attr, empty_is_null in EVIDENCE
) + ")"
_RESULT_RECORD = ", ".join(f"{col} {sqltype}" for col, sqltype in _RESULT_COLUMNS.values())

# Complete: apply each decided result where its generation still holds the lease, finish those
# attempts and write their events, in one statement. The fence is the UPDATE's own WHERE
# (generation and state re-checked on the row it locks), so no separate locking read is needed;
# its RETURNING carries the result on to the attempt and the event, so each later step is a
# primary-key probe per applied run. The input is one JSON document: encoding it is a single C
# call, where array parameters cost Python work per element. The next state, the event kind
# (`k`) and the run's last error (`le`) come decided from Python (runs.decisions); only times are
# the database's. Each row carries its run's scheduled time (`st`), which is the partition key of
# the run and of its attempt; %(lo)s and %(hi)s, the batch's earliest and latest, let the planner
# leave out every partition the batch cannot touch.
COMPLETE_SQL = f"""-- name: RunComplete
WITH v AS (
    SELECT * FROM json_to_recordset(%(rows)s::json) AS v(
        r uuid, st timestamptz, g int, a bigint, s text, d float8, k text, le text, x text, p text, {_RESULT_RECORD})
), applied AS (
    UPDATE runs_run r SET
        state = v.s,
        next_eligible_at = CASE WHEN v.s = '{READY}' THEN statement_timestamp() + make_interval(secs => v.d) END,
        lease_until = NULL, lease_owner = '',
        last_error = v.le,
        finished_at = CASE WHEN v.s IN ({TERMINAL}) THEN statement_timestamp() END
    FROM v
    WHERE r.id = ANY(ARRAY(SELECT v.r FROM v)) AND r.id = v.r AND r.scheduled_time = v.st AND r.generation = v.g
      -- Not `r.state = ...`: that matches run_leased_idx's predicate, a path through every leased run.
      AND r.state || '' = '{LEASED}' AND r.scheduled_time >= %(lo)s AND r.scheduled_time <= %(hi)s
    RETURNING r.id, r.generation, r.tenant_id, r.next_eligible_at, v.*
), attempts AS (
    UPDATE runs_attempt a SET
        outcome = v.o, finished_at = statement_timestamp(), http_status = v.h, error_class = left(v.c, 100),
        error = left(v.m, 2000), response_excerpt = v.x, latency_ms = v.l, remote_address = v.p
    FROM applied v
    WHERE a.id = ANY(ARRAY(SELECT v.a FROM applied v)) AND a.id = v.a AND a.scheduled_time = v.st
      AND a.scheduled_time >= %(lo)s AND a.scheduled_time <= %(hi)s
), events AS (
    INSERT INTO runs_outboxevent (event_id, tenant_id, run_id, kind, payload, created_at, publish_attempts, last_error,
                                  published_at)
    SELECT gen_random_uuid(), v.tenant_id, v.id, v.k,
           jsonb_build_object('runId', v.id::text, 'generation', v.g, 'state', v.s,
                              'nextEligibleAt', {_ISO.format("v.next_eligible_at")}) || {_EVIDENCE},
           statement_timestamp(), 0, '', {_published_at("v.tenant_id", "statement_timestamp()")}
    FROM applied v
)
SELECT id::text, generation, CASE WHEN row_number() OVER () = 1 THEN statement_timestamp() END FROM applied
"""

# Results whose generation lost its lease (rare): kept on their attempts as late evidence.
KEEP_LATE_SQL = f"""-- name: AttemptKeepLateResult
UPDATE runs_attempt a SET
    late_result = {_EVIDENCE} || jsonb_build_object('receivedAt', {_ISO.format("statement_timestamp()")})
FROM json_to_recordset(%(rows)s::json) AS v(a bigint, st timestamptz, {_RESULT_RECORD})
WHERE a.id = v.a AND a.scheduled_time = v.st AND a.scheduled_time >= %(lo)s AND a.scheduled_time <= %(hi)s
"""


# Materialise: occurrences, then the runs and events of those that were new, in one statement.
# An occurrence that already exists (a backfill's, or a crashed pass's that committed) is left
# alone by ON CONFLICT, so its run is not made twice: the unique constraint decides. (The ORM's
# bulk_create of occurrences and runs plus a read-back of which were new was over half of a
# scanner pass's time.)
INSERT_RUNS_SQL = """-- name: RunMaterialise
WITH v AS (
    SELECT * FROM json_to_recordset(%(rows)s::json) AS v(
        o uuid, r uuid, s uuid, t uuid, sv int, vid bigint, at timestamptz, wall text, lt text, tz text,
        tzv text, note text, kind text, state text, reason text, ma int, host text, el timestamptz,
        fin timestamptz, ek text, ep jsonb)
), occ AS (
    INSERT INTO runs_occurrence (id, schedule_id, schedule_version, version_id, scheduled_time, local_wall_time,
                                 local_time, time_zone, tzdata_version, note, kind, created_at)
    SELECT o, s, sv, vid, at, wall, lt, tz, tzv, note, kind, %(stamp)s FROM v
    ON CONFLICT DO NOTHING
    RETURNING id
), made AS (
    INSERT INTO runs_run (id, occurrence_id, tenant_id, schedule_id, schedule_version, version_id, scheduled_time,
                          kind, state, reason, generation, attempts_used, max_attempts, next_eligible_at, lease_until,
                          lease_owner, target_host, created_at, first_started_at, finished_at, last_error,
                          retried_by, retried_at)
    SELECT v.r, v.o, v.t, v.s, v.sv, v.vid, v.at, v.kind, v.state, v.reason, 0, 0, v.ma, v.el, NULL,
           '', v.host, %(stamp)s, NULL, v.fin, '', '', NULL
    FROM v JOIN occ ON occ.id = v.o
    RETURNING id, tenant_id
), events AS (
    INSERT INTO runs_outboxevent (event_id, tenant_id, run_id, kind, payload, created_at, publish_attempts, last_error,
                                  published_at)
    SELECT gen_random_uuid(), m.tenant_id, m.id, v.ek, v.ep, %(now)s, 0, '', """ + _published_at("m.tenant_id", "%(now)s") + """
    FROM made m JOIN v ON v.r = m.id
)
SELECT id::text FROM made
"""


def _ts(dt):
    return dt.isoformat() if dt is not None else None


INSERT_EVENTS_SQL = """-- name: OutboxInsertEvents
INSERT INTO runs_outboxevent (event_id, tenant_id, run_id, kind, payload, created_at, publish_attempts, last_error,
                              published_at)
SELECT gen_random_uuid(), v.tenant_id, v.run_id, v.kind, v.payload::jsonb, %(now)s, 0, '',
       """ + _published_at("v.tenant_id", "%(now)s") + """
FROM unnest(%(tenants)s::uuid[], %(runs)s::uuid[], %(kinds)s::text[], %(payloads)s::text[])
     AS v(tenant_id, run_id, kind, payload)
"""

ADVANCE_SCHEDULES_SQL = """-- name: ScheduleAdvance
UPDATE schedules_schedule s SET
    next_run_at = v.next_run_at, status = v.status, completed_at = v.completed_at, last_error = v.last_error
FROM unnest(%(ids)s::uuid[], %(next)s::timestamptz[], %(status)s::text[], %(completed)s::timestamptz[],
            %(errors)s::text[]) AS v(id, next_run_at, status, completed_at, last_error)
WHERE s.id = v.id
"""


def _copy_value(field):
    """How PostgresStore.rows_insert_new reads one column's value from an instance."""
    if getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False):
        return lambda obj: field.pre_save(obj, True)
    name = field.attname
    if isinstance(field, models.JSONField):
        encoder = (field.encoder or json.JSONEncoder)()

        def as_json(obj, enc=encoder):
            value = getattr(obj, name)
            return None if value is None else enc.encode(value)
        return as_json
    return lambda obj: getattr(obj, name)


# The next statement's runs and attempts are found by primary key whatever the statistics say:
# a day's partition is analyzed while empty and can take a burst before autovacuum analyzes it
# again, and with statistics that say "empty" the planner joined a completion's batch against
# every leased run of the partition (run_leased_idx) and every attempt (a sequential scan), a cost
# that grew with the burst until completions took minutes (tests/core/test_plans_without_statistics.py).
# Only for the rest of the transaction, and set in the same round trip as the floor's read.
_BY_PRIMARY_KEY = ", set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true)"


_INSERTS: dict = {}


def _insert_statement(conn, obj, *, returning: bool = False, computed: dict | None = None) -> tuple[str, list]:
    """The INSERT that `obj.save()` sends for a new row (the same fields, auto_now stamps and
    adapters), as SQL and parameters; `computed` gives SQL for some columns instead of the
    instance's value ({attname: expression}), and `returning` returns the primary key. The text
    is made once per shape: Django's insert compiler costs more than the rest of the insert."""
    model = type(obj)
    meta = model._meta
    assert not (meta.auto_field and obj.pk is not None), "an auto-numbered key is left to its sequence"
    shape = (model, returning, tuple(sorted((computed or {}).items())))
    if shape not in _INSERTS:
        quote = conn.ops.quote_name
        fields = [f for f in meta.local_concrete_fields if not f.generated and f is not meta.auto_field]
        values = ", ".join((computed or {}).get(f.attname, "%s") for f in fields)
        sql = (f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) VALUES ({values})"
               + (f" RETURNING {quote(meta.pk.column)}" if returning else ""))
        _INSERTS[shape] = sql, [f for f in fields if f.attname not in (computed or {})]
    sql, fields = _INSERTS[shape]
    return sql, [f.get_db_prep_save(f.pre_save(obj, True), connection=conn) for f in fields]


def _live_floor(cur, *, by_primary_key: bool = False):
    cur.execute(f"SELECT ({LIVE_FLOOR_SQL}){_BY_PRIMARY_KEY}" if by_primary_key else LIVE_FLOOR_SQL)
    return cur.fetchall()[0][0]


class PostgresStore(PostgresHistory, PortableStore):
    # --- new rows of any model, in bulk (schedule creation) ---------------------------------------

    def rows_insert_new(self, model, objs, *, need_ids: bool = False) -> None:
        """COPY instead of bulk_create's INSERT ... UNNEST: bulk_create prepares every value through
        the field's adapters and dumps each column as a text array literal in Python, ~60% of a
        1,000-schedule batch (bench/api_create.py --bulk). Here the values go to COPY as the
        instance holds them (already of the column's type: the callers build them from checked
        fields), JSON as its text, and auto_now/auto_now_add stamps through the field's pre_save
        as bulk_create makes them. An auto-numbered key is taken from its sequence in one
        statement when the caller needs it, and left to the column default otherwise."""
        if not objs:
            return
        # The wrapper itself, not django.db.connection: that proxy costs a thread-local lookup
        # per use.
        conn = connections[DEFAULT_DB_ALIAS]
        meta = model._meta
        pk = meta.pk
        auto_pk = pk.get_internal_type() in ("AutoField", "BigAutoField", "SmallAutoField")
        fields = [f for f in meta.concrete_fields if not (auto_pk and f is pk)]
        if auto_pk and need_ids:
            with conn.cursor() as cur:
                cur.execute("SELECT nextval(pg_get_serial_sequence(%s, %s)) FROM generate_series(1, %s)",
                            [meta.db_table, pk.column, len(objs)])
                for obj, (new_id,) in zip(objs, cur.fetchall()):
                    setattr(obj, pk.attname, new_id)
            fields = [pk, *fields]
        getters = [_copy_value(f) for f in fields]
        cols = ", ".join(conn.ops.quote_name(f.column) for f in fields)
        conn.ensure_connection()
        with conn.connection.cursor() as cur:
            with cur.copy(f"COPY {conn.ops.quote_name(meta.db_table)} ({cols}) FROM STDIN") as copy:
                for obj in objs:
                    copy.write_row([get(obj) for get in getters])
        for obj in objs:
            obj._state.adding = False
            obj._state.db = DEFAULT_DB_ALIAS

    # --- schedules --------------------------------------------------------------------------------

    def schedule_insert(self, schedule, version, entry) -> None:
        """The three inserts in one statement, in one round trip (a single create is a handful of
        round trips in all, so each one left is a large share of its cost): the INSERTs save()
        sends for the three rows, as the parts of one WITH, which PostgreSQL keeps prepared
        (parsing and planning them each time cost it more than inserting). The schedule takes the
        version's id from the version's insert, and the id comes back to the caller. One statement
        runs in the caller's transaction, or is a transaction of its own."""
        conn = connections[DEFAULT_DB_ALIAS]
        version_sql, version_params = _insert_statement(conn, version, returning=True)
        schedule_sql, schedule_params = _insert_statement(
            conn, schedule, computed={"current_id": "(SELECT id FROM new_version)"})
        entry_sql, entry_params = _insert_statement(conn, entry)
        sql = (f"WITH new_version AS ({version_sql}), new_schedule AS ({schedule_sql}), "
               f"new_entry AS ({entry_sql}) SELECT id FROM new_version")
        with prepared_cursor(conn) as cur:
            cur.execute(sql, [*version_params, *schedule_params, *entry_params])
            (version.id,) = cur.fetchone()
        schedule.current = version
        for obj in (version, schedule, entry):
            obj._state.adding = False
            obj._state.db = DEFAULT_DB_ALIAS

    def schedule_advance_many(self, schedules, *, now) -> None:
        if not schedules:
            return
        with _cursor() as cur:
            cur.execute(ADVANCE_SCHEDULES_SQL, {
                "ids": [str(s.id) for s in schedules], "next": [s.next_run_at for s in schedules],
                "status": [s.status for s in schedules], "completed": [s.completed_at for s in schedules],
                "errors": [s.last_error for s in schedules],
            })

    # --- runs -------------------------------------------------------------------------------------

    def run_insert_many(self, triples, *, stamp, now) -> set:
        rows = []
        for o, r, e in triples:
            rows.append({
                "o": str(o.id), "r": str(r.id), "s": str(o.schedule_id), "t": str(r.tenant_id),
                "sv": o.schedule_version, "vid": o.version_id, "at": _ts(o.scheduled_time), "wall": o.local_wall_time,
                "lt": o.local_time, "tz": o.time_zone, "tzv": o.tzdata_version, "note": o.note, "kind": o.kind,
                "state": r.state, "reason": r.reason, "ma": r.max_attempts, "host": r.target_host,
                "el": _ts(r.next_eligible_at), "fin": _ts(r.finished_at), "ek": e.kind, "ep": e.payload,
            })
        with _cursor() as cur:
            cur.execute(INSERT_RUNS_SQL, {"rows": json.dumps(rows), "stamp": stamp, "now": now})
            return {row[0] for row in cur.fetchall()}

    def run_due_tenants(self, now, *, max_tenants: int) -> list:
        with _cursor() as cur:
            floor = _live_floor(cur)
            cur.execute(DUE_TENANTS_SQL[floor is not None], {"now": now, "max_tenants": max_tenants, "floor": floor})
            return [row[0] for row in cur.fetchall()]

    def run_due_candidates(self, tenants: list, now, *, per_tenant: int, without: dict | None = None) -> list:
        full = json.dumps({str(t): list(hosts) for t, hosts in (without or {}).items()})
        with _cursor() as cur:
            floor = _live_floor(cur)
            cur.execute(CANDIDATES_SQL[floor is not None],
                        {"tenants": tenants, "now": now, "per_tenant": per_tenant, "floor": floor, "full": full})
            return cur.fetchall()

    def run_claim_due(self, *, worker: str, limit: int, lease_seconds: float, shift: int, holding) -> list[Claimed]:
        with _cursor() as cur:
            floor = _live_floor(cur, by_primary_key=True)
            cur.execute(CLAIM_DUE_SQL[floor is not None], {
                "worker": worker, "limit": limit, "lease": lease_seconds, "shift": shift, "floor": floor,
                **share_params(holding),
            })
            return _claimed(cur)

    def run_claim(self, ids, *, worker: str, now, until) -> list[Claimed]:
        if not ids:
            return []
        with _cursor() as cur:
            floor = _live_floor(cur, by_primary_key=True)
            cur.execute(CLAIM_SQL[floor is not None],
                        {"ids": _uuid_array(ids), "worker": worker, "now": now, "until": until, "floor": floor})
            return _claimed(cur)

    def run_extend_leases(self, keys, *, worker: str, lease_seconds: float) -> set:
        gens = "{" + ",".join(str(k[1]) for k in keys) + "}"
        with _cursor() as cur:
            floor = _live_floor(cur)
            cur.execute(EXTEND_LEASES_SQL[floor is not None],
                        {"ids": _uuid_array(k[0] for k in keys), "gens": gens, "worker": worker,
                         "lease": lease_seconds, "floor": floor})
            return {(row[0], row[1]) for row in cur.fetchall()}

    def run_complete(self, decided: list[Decided]) -> tuple[set, datetime | None]:
        """Text ids, and the time on one row only: parsing a UUID and a timestamp per row cost
        more Python time than building the whole statement."""
        rows = []
        for d in decided:
            r, c = d.result, d.result.claimed
            key = c.run_text
            rows.append((key, {
                "r": key, "st": c.scheduled_iso, "g": c.generation, "a": c.attempt_id, "s": d.state, "d": d.delay,
                "k": completion_kind(d.state), "le": r.last_error, "x": r.response_excerpt,
                "p": r.remote_address or "", "o": r.outcome, "h": r.http_status, "c": r.error_class,
                "m": r.error, "l": r.latency_ms,
            }))
        # Rows in key order, so two transactions over overlapping runs lock them in the same order.
        rows.sort(key=lambda kv: kv[0])
        times = [d.result.claimed.scheduled_time for d in decided]
        span = {"lo": min(times), "hi": max(times)}
        with _cursor() as cur:
            # Hash joins too: the planner takes a batch's CTE for one row, and a nested loop over
            # it costs the square of the batch (thousands of rows when completions queue up).
            cur.execute("SELECT true" + _BY_PRIMARY_KEY + ", set_config('enable_nestloop', 'off', true)")
            cur.fetchall()
            cur.execute(COMPLETE_SQL, {"rows": json.dumps([kv[1] for kv in rows]), **span})
            out = cur.fetchall()
            applied = {(row[0], row[1]) for row in out}
            if len(applied) < len(rows):
                late = [row for _, row in rows if (row["r"], row["g"]) not in applied]
                cur.execute(KEEP_LATE_SQL, {"rows": json.dumps(late), **span})
        return applied, next((row[2] for row in out if row[2] is not None), None)

    # --- events -----------------------------------------------------------------------------------

    def event_insert_many(self, events, *, now) -> None:
        if not events:
            return
        with _cursor() as cur:
            cur.execute(INSERT_EVENTS_SQL, {
                "now": now,
                "tenants": [str(e.tenant_id) for e in events],
                "runs": [str(e.run_id) if e.run_id else None for e in events],
                "kinds": [e.kind for e in events],
                "payloads": [json.dumps(e.payload) for e in events],
            })

    # --- counters ---------------------------------------------------------------------------------

    def counter_keep_recent(self, key: str, *, taken_at: datetime, counts: dict) -> bool:
        """As PortableStore's. Rows are locked one by one here, so the upsert only waits for
        another save of the same key or the activity loop deleting it once too old (moments)."""
        _keep_recent_count(key, taken_at, counts)
        return True
