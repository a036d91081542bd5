"""The run queue's hot statements on PostgreSQL: one round trip per batch step. See `runs.store`.

`PostgresStore` is `PortableStore` with the dispatch hot path (materialise, claim, heartbeat,
complete, events) rewritten: a batch goes in as one array literal or one JSON document (a single
string join or C-encoded dump, not a Python adapter call per element), and each step is a single
statement. Why each statement has its shape is said beside it; the measurements are in
bench/README.md and docs/scaling.md.

Each statement is one literal text whose first line names it (`-- name: RunClaimDue`, as
pg_stat_statements and the logs show it), written whole so that it reads top to bottom and can be
pasted into psql with its `%(...)s` parameters filled in; nothing is assembled at the call site.
State names and event kinds are written in the text as the values of their enums
(`runs.models.RunState`, `EventKind`) rather than bound: a plain `state = 'ready'` is what lets the
planner match a partial index's predicate, and the text stays pasteable.
tests/core/test_every_named_statement_explains.py EXPLAINs each one and checks that every quoted
state or kind in them is a member of its enum.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from datetime import datetime

import psycopg
from django.db import DEFAULT_DB_ALIAS, connection, connections, models
from django.utils import timezone

from runs.decisions import Claimed, Decided, candidate_limits, completion_kind
from runs.partitions import LIVE_FLOOR_SQL, SCAN_GATE
from runs.store.history import PostgresHistory
from runs.store.portable import PortableStore, _keep_recent_count
from scheduler_project.foundation.dbplanner import BY_KEY_FOR_THE_TRANSACTION
from scheduler_project.foundation.postgresql.prepared import prepared_cursor


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


# --- the statements ------------------------------------------------------------------------------
#
# The live floor, %(floor)s (runs.partitions.LIVE_FLOOR_SQL, read just before each dispatch
# statement): runs_run is partitioned by scheduled_time, and PostgreSQL plans every partition a
# statement may touch, at a cost per partition that would soon exceed the statement's own work.
# Every ready or leased run is at or above the floor (partitions below it are sealed: none of their
# runs is ready or leased, and a trigger unseals one the moment that changes), so the dispatch
# statements say `scheduled_time >= %(floor)s`, and plan only the few partitions from there up:
# the statements are never prepared, so each is planned with the value bound and the planner
# prunes with it. With no floor known (the catalog is empty or the kept partition is live) the
# value is '-infinity', which prunes nothing and costs a comparison per row read.
#
# The ceiling, %(now)s or %(ceiling)s (the database's clock, read with the floor): the partitions
# made ahead of now hold only runs that are not due yet, and the claim's statements leave them
# out the same way. A ready run's scheduled time is never after its next_eligible_at (the scanner
# makes it eligible at its instant or a spread offset later, a retry or an unbuffering after it
# was due, a manual run or a backfill now), so a run due as of a time was scheduled at or before
# it; and a leased run was due when it was claimed. `next_eligible_at <= statement_timestamp()`
# could not prune while planning: PostgreSQL plans every partition for a stable function's value
# and leaves them out only when the plan starts, after it has paid for planning them. Were a run
# ever eligible before its scheduled time, it would only wait for that time, never be lost.
#
# The published time of an outbox event, written by every statement below that writes events
# (RunClaim, RunClaimDue, RunComplete, RunMaterialise, OutboxInsertEvents) as
#     (SELECT CASE WHEN tn.notification_url = '' THEN <now> END FROM schedules_tenant tn WHERE tn.id = <tenant>)
# already published when its tenant has no webhook (there is nobody to deliver it to, and the relay
# would only mark it: a second write of the row and of its index entries), otherwise left for the
# relay; one primary-key probe of the (small) tenants table per event. PortableStore's
# event_insert_many makes the same choice in Python. It stays in SQL because the claim learns its
# runs' tenants only inside its own statement: deciding in Python would be a round trip more per
# claim, with the rows locked meanwhile. tests/core/test_every_named_statement_explains.py checks
# that it is spelled the same in each.


# The claim with caps in play, step 1: which tenants have due runs as of %(now)s. A skip scan
# over run_ready_tenant_idx: one index probe per tenant with due runs, however many runs each has.
DUE_TENANTS_SQL = """-- name: RunDueTenants
WITH RECURSIVE t(tenant_id) AS (
    (SELECT tenant_id FROM runs_run
     WHERE state = 'ready' AND next_eligible_at <= %(now)s
       AND scheduled_time >= %(floor)s::timestamptz AND scheduled_time <= %(now)s::timestamptz
     ORDER BY tenant_id LIMIT 1)
    UNION ALL
    SELECT (SELECT r.tenant_id FROM runs_run r
            WHERE r.state = 'ready' AND r.next_eligible_at <= %(now)s AND r.tenant_id > t.tenant_id
              AND r.scheduled_time >= %(floor)s::timestamptz AND r.scheduled_time <= %(now)s::timestamptz
            ORDER BY r.tenant_id LIMIT 1)
    FROM t WHERE t.tenant_id IS NOT NULL
)
SELECT tenant_id FROM t WHERE tenant_id IS NOT NULL LIMIT %(max_tenants)s
"""

# Step 2: up to %(limits)s (one a tenant, in the order of %(tenants)s) of each of these tenants'
# oldest due runs, locked, in the given tenant order; rows another worker holds are skipped, not
# waited for. A tenant's limit is its room when that is less than a share: a capped tenant's backlog
# is not locked by every claim only to be left.
#
# Written so that only run_ready_tenant_idx gives this order: with `tenant_id = x ... ORDER BY
# next_eligible_at` the planner walked run_ready_idx and filtered by tenant, reading every entry of
# runs already claimed (they stay in that index until vacuum). A range instead of an equality keeps
# tenant_id in the sort order. The due time stays a filter: a row comparison `(tenant_id,
# next_eligible_at) <= (tenant, now)` would end the scan at `now` and skip the runs the look-ahead
# made early, but measured back to back it cost PostgreSQL about twice the CPU in a burst
# (bench/README.md, "Issues 17 and 18").
#
# %(full)s, a JSON object (tenant id -> target hosts with no room), leaves out the tenant's runs to
# those hosts: otherwise a backlog to one full host, oldest first, would fill every read and the
# tenant's other targets would never be reached. Only a tenant with a full target pays for the
# filter (it reads past that host's due runs); the array is empty for the others.
CANDIDATES_SQL = """-- name: RunDueCandidates
SELECT c.id, c.tenant_id, c.target_host
FROM unnest(%(tenants)s::uuid[], %(limits)s::int[]) WITH ORDINALITY AS t(tenant_id, lim, pos)
CROSS JOIN LATERAL (SELECT ARRAY(SELECT jsonb_array_elements_text(%(full)s::jsonb -> t.tenant_id::text)) AS hosts) f
CROSS JOIN LATERAL (
    SELECT r.id, r.tenant_id, r.target_host, r.next_eligible_at FROM runs_run r
    WHERE r.state = 'ready' AND r.tenant_id >= t.tenant_id AND r.tenant_id <= t.tenant_id
      AND r.next_eligible_at <= %(now)s
      AND r.scheduled_time >= %(floor)s::timestamptz AND r.scheduled_time <= %(now)s::timestamptz
      AND r.target_host <> ALL(f.hosts)
    ORDER BY r.tenant_id, r.next_eligible_at
    LIMIT t.lim
    FOR UPDATE OF r SKIP LOCKED
) c
ORDER BY t.pos
"""

# Claims with caps in play: the capped tenants and budgeted (tenant, host) pairs this claim holds
# until it commits, by transaction-level advisory lock, never waited for (a key another claim holds
# is left out of this one). Keys are the tenant id, or "tenant host"; a collision of their hashes
# only leaves a key out of one claim.
CAP_LOCKS_SQL = """-- name: RunCapLocks
SELECT k FROM unnest(%(keys)s::text[]) AS k WHERE pg_try_advisory_xact_lock(%(space)s, hashtext(k))
"""
# The advisory lock space of those keys (the two-integer form; "CAPS").
CAP_LOCK_SPACE = 0x43415053

# Caps and budgets in play, counted across the fleet before the candidates read: leased runs per
# tenant, and per (tenant, target host). Every leased run is between the live floor and the
# ceiling, so each plans only the live partitions (an ORM count with no bounds planned every
# partition of runs_run at every claim, several times the count's own work). run_leased_idx holds
# only leased runs.
LEASED_PER_TENANT_SQL = """-- name: RunLeasedPerTenant
SELECT tenant_id, count(*) FROM runs_run
WHERE state = 'leased' AND tenant_id = ANY(%(tenants)s::uuid[])
  AND scheduled_time >= %(floor)s::timestamptz AND scheduled_time <= %(ceiling)s::timestamptz
GROUP BY tenant_id
"""

LEASED_PER_HOST_SQL = """-- name: RunLeasedPerHost
SELECT tenant_id, target_host, count(*) FROM runs_run
WHERE state = 'leased' AND tenant_id = ANY(%(tenants)s::uuid[]) AND target_host = ANY(%(hosts)s::text[])
  AND scheduled_time >= %(floor)s::timestamptz AND scheduled_time <= %(ceiling)s::timestamptz
GROUP BY tenant_id, target_host
"""

# Claim: lease the picked runs (%(ids)s), open their attempts and write their events, in one
# statement, and return each claimed run with its version's call and retry policy. The scheduled
# time comes back as text in exactly the form runs.decisions.iso writes (UTC, "Z", microseconds
# only when there are some): it goes into a header as is, and text parses in C where a timestamptz
# goes through Django's Python-level time-zone loader. (`%%` is one `%` once the parameters are in.)
CLAIM_SQL = """-- name: RunClaim
WITH leased AS (
    UPDATE runs_run r SET
        state = 'leased', generation = r.generation + 1, attempts_used = r.attempts_used + 1,
        lease_until = %(until)s, lease_owner = %(worker)s, reason = '', next_eligible_at = NULL,
        first_started_at = COALESCE(r.first_started_at, %(now)s)
    -- `state || ''`: a plain `state = ...` matches run_ready_idx's predicate (see _BY_PRIMARY_KEY).
    WHERE r.id = ANY(%(ids)s::uuid[]) AND r.state || '' = 'ready'
      AND r.scheduled_time >= %(floor)s::timestamptz AND r.scheduled_time <= %(now)s::timestamptz
    RETURNING r.id, r.generation, r.attempts_used, r.max_attempts, r.tenant_id, r.schedule_id,
              r.schedule_version, r.scheduled_time, r.version_id, r.target_host
), opened AS (
    INSERT INTO runs_attempt (run_id, scheduled_time, generation, worker_id, started_at, error_class, error,
                              response_excerpt, remote_address, canceled_in_flight)
    SELECT id, scheduled_time, generation, %(worker)s, %(now)s, '', '', '', '', false FROM leased
    RETURNING id, run_id
), events AS (
    INSERT INTO runs_outboxevent (event_id, tenant_id, run_id, kind, payload, created_at,
                                  publish_attempts, last_error, published_at)
    SELECT gen_random_uuid(), tenant_id, id, 'run.leased',
           jsonb_build_object('runId', id::text, 'generation', generation, 'workerId', %(worker)s::text,
                              'state', 'leased'),
           %(now)s, 0, '',
           (SELECT CASE WHEN tn.notification_url = '' THEN %(now)s END FROM schedules_tenant tn WHERE tn.id = tenant_id)
    FROM leased
)
SELECT l.id, l.generation, o.id, l.attempts_used, l.max_attempts, l.tenant_id, l.schedule_id, l.schedule_version,
       CASE WHEN date_part('microseconds', l.scheduled_time)::bigint %% 1000000 = 0
            THEN to_char(l.scheduled_time AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
            ELSE to_char(l.scheduled_time AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') END,
       l.version_id,
       v.target_url, v.target_method, v.target_headers::text, v.target_timeout_seconds, v.payload::text,
       v.backoff_base_seconds, v.backoff_max_seconds, v.overlap_policy,
       l.id::text, l.schedule_id::text, l.target_host
FROM leased l JOIN opened o ON o.run_id = l.id
-- One primary-key probe per claimed run. OFFSET 0 keeps the planner from turning this into a
-- hash join over the whole versions table (it did, with stale statistics, growing with every
-- schedule ever made).
CROSS JOIN LATERAL (SELECT * FROM schedules_scheduleversion sv WHERE sv.id = l.version_id OFFSET 0) v
"""

# Claim without explicit caps in play, in one statement: RunDueTenants, then RunDueCandidates
# with a fair share per tenant, a pick, then RunClaim, as statement_timestamp(): find the tenants
# with due runs (the same skip scan), rotate them by %(shift)s, lock up to twice a fair share of
# each tenant's oldest due runs (SKIP LOCKED, the same read), take them round-robin across tenants
# up to %(limit)s, and lease them as RunClaim does.
#
# The choice is the one runs.decisions.rotate/fair_share/pick make in Python for the portable
# store (and for PostgreSQL when explicit caps are in play), written again here because one
# round trip instead of four means the rows are locked for one statement and a commit, so
# concurrent workers skip fewer of each other's rows; taking it out of SQL would put those round
# trips back. Where the two differ is said in runs/decisions.py beside `pick`;
# tests/core/test_claim_sql_and_python_pick_agree.py checks they choose the same runs.
#
# The default shares (runs.decisions.Holding): the claiming worker says what it holds, per tenant
# (%(held_t)s, %(held_tn)s) and per tenant and target host (%(held_ht)s, %(held_h)s, %(held_hn)s),
# and how many slots one tenant (%(tenant_cap)s) and one tenant's calls to one host
# (%(host_cap)s) may hold. A tenant without room is not served (its rows are not even locked),
# one with a little room has only that many rows read, and a target's room is taken in the order
# the pick takes runs. The arrays are as long as the worker's distinct tenants and targets in
# flight; they are hash-joined, never probed per row.
CLAIM_DUE_SQL = """-- name: RunClaimDue
WITH RECURSIVE t(tenant_id) AS (
    (SELECT tenant_id FROM runs_run
     WHERE state = 'ready' AND next_eligible_at <= statement_timestamp()
       AND scheduled_time >= %(floor)s::timestamptz AND scheduled_time <= %(ceiling)s::timestamptz
     ORDER BY tenant_id LIMIT 1)
    UNION ALL
    SELECT (SELECT r.tenant_id FROM runs_run r
            WHERE r.state = 'ready' AND r.next_eligible_at <= statement_timestamp() AND r.tenant_id > t.tenant_id
              AND r.scheduled_time >= %(floor)s::timestamptz AND r.scheduled_time <= %(ceiling)s::timestamptz
            ORDER BY r.tenant_id LIMIT 1)
    FROM t WHERE t.tenant_id IS NOT NULL
), held_t AS (
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
    FROM served s CROSS JOIN share CROSS JOIN LATERAL (
        -- RunDueCandidates' read, and why it is written so.
        SELECT r.id, r.tenant_id, r.target_host, r.next_eligible_at FROM runs_run r
        WHERE r.state = 'ready' AND r.tenant_id >= s.tenant_id AND r.tenant_id <= s.tenant_id
          AND r.next_eligible_at <= statement_timestamp()
          AND r.scheduled_time >= %(floor)s::timestamptz AND r.scheduled_time <= %(ceiling)s::timestamptz
          AND r.target_host <> ALL(s.full_hosts)
        ORDER BY r.tenant_id, r.next_eligible_at
        LIMIT LEAST(share.per_tenant, s.room)
        FOR UPDATE OF r SKIP LOCKED
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
    UPDATE runs_run r SET
        state = 'leased', generation = r.generation + 1, attempts_used = r.attempts_used + 1,
        lease_until = statement_timestamp() + make_interval(secs => %(lease)s), lease_owner = %(worker)s,
        reason = '', next_eligible_at = NULL, first_started_at = COALESCE(r.first_started_at, statement_timestamp())
    -- Primary-key probes for the picked ids: written as a join, the planner hashed the picked
    -- rows and scanned the whole runs table (every run ever kept) to find them.
    WHERE r.id = ANY(ARRAY(SELECT id FROM picked)) AND r.state || '' = 'ready'
      AND r.scheduled_time >= %(floor)s::timestamptz AND r.scheduled_time <= %(ceiling)s::timestamptz
    RETURNING r.id, r.generation, r.attempts_used, r.max_attempts, r.tenant_id, r.schedule_id,
              r.schedule_version, r.scheduled_time, r.version_id, r.target_host
), opened AS (
    INSERT INTO runs_attempt (run_id, scheduled_time, generation, worker_id, started_at, error_class, error,
                              response_excerpt, remote_address, canceled_in_flight)
    SELECT id, scheduled_time, generation, %(worker)s, statement_timestamp(), '', '', '', '', false FROM leased
    RETURNING id, run_id
), events AS (
    INSERT INTO runs_outboxevent (event_id, tenant_id, run_id, kind, payload, created_at,
                                  publish_attempts, last_error, published_at)
    SELECT gen_random_uuid(), tenant_id, id, 'run.leased',
           jsonb_build_object('runId', id::text, 'generation', generation, 'workerId', %(worker)s::text,
                              'state', 'leased'),
           statement_timestamp(), 0, '',
           (SELECT CASE WHEN tn.notification_url = '' THEN statement_timestamp() END FROM schedules_tenant tn WHERE tn.id = tenant_id)
    FROM leased
)
-- What RunClaim returns, and why it is written so.
SELECT l.id, l.generation, o.id, l.attempts_used, l.max_attempts, l.tenant_id, l.schedule_id, l.schedule_version,
       CASE WHEN date_part('microseconds', l.scheduled_time)::bigint %% 1000000 = 0
            THEN to_char(l.scheduled_time AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
            ELSE to_char(l.scheduled_time AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') END,
       l.version_id,
       v.target_url, v.target_method, v.target_headers::text, v.target_timeout_seconds, v.payload::text,
       v.backoff_base_seconds, v.backoff_max_seconds, v.overlap_policy,
       l.id::text, l.schedule_id::text, l.target_host
FROM leased l JOIN opened o ON o.run_id = l.id
CROSS JOIN LATERAL (SELECT * FROM schedules_scheduleversion sv WHERE sv.id = l.version_id OFFSET 0) v
"""

# Heartbeat: extend the leases this worker still holds at these generations, in one statement;
# the rows returned are the ones it still owns (the fence is the UPDATE's own WHERE).
EXTEND_LEASES_SQL = """-- name: RunExtendLeases
UPDATE runs_run r SET lease_until = statement_timestamp() + make_interval(secs => %(lease)s)
FROM unnest(%(ids)s::uuid[], %(gens)s::int[]) AS k(id, generation)
WHERE r.id = k.id AND r.generation = k.generation AND r.state = 'leased' AND r.lease_owner = %(worker)s
  AND r.scheduled_time >= %(floor)s::timestamptz
RETURNING r.id, r.generation
"""

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
#
# The result's columns (o, h, c, m, l) and the evidence object built from them are
# runs.decisions.EVIDENCE, as Result.evidence() builds it in Python (the test named at the top of
# this module checks they agree); times are ISO 8601 in UTC with microseconds, as the payloads written from
# Python carry them.
COMPLETE_SQL = """-- name: RunComplete
WITH v AS (
    SELECT * FROM json_to_recordset(%(rows)s::json) AS v(
        r uuid, st timestamptz, g int, a bigint, s text, d float8, k text, le text, x text, p text,
        o text, h int, c text, m text, l int)
), applied AS (
    UPDATE runs_run r SET
        state = v.s,
        next_eligible_at = CASE WHEN v.s = 'ready' THEN statement_timestamp() + make_interval(secs => v.d) END,
        lease_until = NULL, lease_owner = '',
        last_error = v.le,
        finished_at = CASE WHEN v.s IN ('succeeded', 'dead', 'canceled', 'skipped') THEN statement_timestamp() END
    FROM v
    WHERE r.id = ANY(ARRAY(SELECT v.r FROM v)) AND r.id = v.r AND r.scheduled_time = v.st AND r.generation = v.g
      -- Not `r.state = ...`: that matches run_leased_idx's predicate, a path through every leased run.
      AND r.state || '' = 'leased' AND r.scheduled_time >= %(lo)s AND r.scheduled_time <= %(hi)s
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
                              'nextEligibleAt', to_char(v.next_eligible_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))
           || jsonb_build_object('outcome', v.o, 'httpStatus', v.h, 'errorClass', NULLIF(v.c, ''),
                                 'error', NULLIF(v.m, ''), 'latencyMs', v.l),
           statement_timestamp(), 0, '',
           (SELECT CASE WHEN tn.notification_url = '' THEN statement_timestamp() END FROM schedules_tenant tn WHERE tn.id = v.tenant_id)
    FROM applied v
)
SELECT id::text, generation, CASE WHEN row_number() OVER () = 1 THEN statement_timestamp() END FROM applied
"""

# Results whose generation lost its lease (rare): kept on their attempts as late evidence (the
# same evidence object as RunComplete's events).
KEEP_LATE_SQL = """-- name: AttemptKeepLateResult
UPDATE runs_attempt a SET
    late_result = jsonb_build_object('outcome', v.o, 'httpStatus', v.h, 'errorClass', NULLIF(v.c, ''),
                                     'error', NULLIF(v.m, ''), 'latencyMs', v.l)
                  || jsonb_build_object('receivedAt', to_char(statement_timestamp() AT TIME ZONE 'UTC',
                                                              'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))
FROM json_to_recordset(%(rows)s::json) AS v(a bigint, st timestamptz, o text, h int, c text, m text, l int)
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
    SELECT gen_random_uuid(), m.tenant_id, m.id, v.ek, v.ep, %(now)s, 0, '',
           (SELECT CASE WHEN tn.notification_url = '' THEN %(now)s END FROM schedules_tenant tn WHERE tn.id = m.tenant_id)
    FROM made m JOIN v ON v.r = m.id
)
SELECT id::text FROM made
"""

# Every other outbox event: the events the loops and the requested changes write beside their own
# statements (runs.queue.write_events, runs.actions).
INSERT_EVENTS_SQL = """-- name: OutboxInsertEvents
INSERT INTO runs_outboxevent (event_id, tenant_id, run_id, kind, payload, created_at, publish_attempts, last_error,
                              published_at)
SELECT gen_random_uuid(), v.tenant_id, v.run_id, v.kind, v.payload::jsonb, %(now)s, 0, '',
       (SELECT CASE WHEN tn.notification_url = '' THEN %(now)s END FROM schedules_tenant tn WHERE tn.id = v.tenant_id)
FROM unnest(%(tenants)s::uuid[], %(runs)s::uuid[], %(kinds)s::text[], %(payloads)s::text[])
     AS v(tenant_id, run_id, kind, payload)
"""

# A scanner pass's first statement, in its transaction: the clock it plans by, and the scanner's
# gate, shared, tried and never waited for (false: partition DDL is waiting for the passes in
# progress to end; this pass makes nothing and the scanner looks again shortly). runs.partitions,
# "The scanner's gate".
SCAN_BEGIN_SQL = """-- name: ScheduleScanBegin
SELECT statement_timestamp(), pg_try_advisory_xact_lock_shared(%(gate)s)"""

# The scanner's write-back of next_run_at, completion and last scan error, one statement a batch.
ADVANCE_SCHEDULES_SQL = """-- name: ScheduleAdvance
UPDATE schedules_schedule s SET
    next_run_at = v.next_run_at, status = v.status, completed_at = v.completed_at, last_error = v.last_error
FROM unnest(%(ids)s::uuid[], %(next)s::timestamptz[], %(status)s::text[], %(completed)s::timestamptz[],
            %(errors)s::text[]) AS v(id, next_run_at, status, completed_at, last_error)
WHERE s.id = v.id
"""


# --- parameters and results ----------------------------------------------------------------------

# The value of %(floor)s when no floor is known: every run is at or above it.
NO_FLOOR = "-infinity"


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


def _ts(dt):
    return dt.isoformat() if dt is not None else None


def _copy_value(field, stamp):
    """How PostgresStore.rows_insert_new reads one column's value from an instance. An auto_now or
    auto_now_add column takes `stamp`, the statement's one timestamp, set on the instance as its
    pre_save sets it (a field's pre_save read the clock for every row and column)."""
    name = field.attname
    if isinstance(field, models.DateTimeField) and (field.auto_now or field.auto_now_add):
        def stamped(obj):
            setattr(obj, name, stamp)
            return stamp
        return stamped
    if getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False):  # a DateField's: today
        return lambda obj: field.pre_save(obj, True)
    if isinstance(field, models.JSONField):
        encoder = (field.encoder or json.JSONEncoder)()

        def as_json(obj, enc=encoder):
            value = getattr(obj, name)
            if value is None:
                return None
            # Most rows' headers, changes and payloads are empty: their text without the encoder.
            if not value and type(value) is dict:
                return "{}"
            return enc.encode(value)
        return as_json
    return lambda obj: getattr(obj, name)


# The next statement's runs and attempts are found by primary key whatever the statistics say:
# a day's partition is analyzed while empty and can take a burst before autovacuum analyzes it
# again, and with statistics that say "empty" the planner joined a completion's batch against
# every leased run of the partition (run_leased_idx) and every attempt (a sequential scan), a cost
# that grew with the burst until completions took minutes (tests/core/test_plans_without_statistics.py).
# Only for the rest of the transaction, and set in the same round trip as the floor's read.
_BY_PRIMARY_KEY = BY_KEY_FOR_THE_TRANSACTION


_INSERTS: dict = {}


def _insert_statement(conn, obj, *, returning: tuple = (), computed: dict | None = None) -> tuple[str, list]:
    """The INSERT that `obj.save()` sends for a new row (the same fields, auto_now stamps and
    adapters), as SQL and parameters; `computed` gives SQL for some columns instead of the
    instance's value ({attname: expression}), and `returning` names the columns it returns. The
    text is made once per shape: Django's insert compiler costs more than the rest of the insert."""
    model = type(obj)
    meta = model._meta
    assert not (meta.auto_field and obj.pk is not None), "an auto-numbered key is left to its sequence"
    shape = (model, returning, tuple(sorted((computed or {}).items())))
    if shape not in _INSERTS:
        quote = conn.ops.quote_name
        fields = [f for f in meta.local_concrete_fields if not f.generated and f is not meta.auto_field]
        values = ", ".join((computed or {}).get(f.attname, "%s") for f in fields)
        sql = (f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) VALUES ({values})"
               + (f" RETURNING {', '.join(quote(c) for c in returning)}" if returning else ""))
        _INSERTS[shape] = sql, [f for f in fields if f.attname not in (computed or {})]
    sql, fields = _INSERTS[shape]
    return sql, [f.get_db_prep_save(f.pre_save(obj, True), connection=conn) for f in fields]


def _live_floor(cur, *, by_primary_key: bool = False):
    """The value of %(floor)s: the live floor, or NO_FLOOR when none is known."""
    return _live_bounds(cur, by_primary_key=by_primary_key)["floor"]


def _live_bounds(cur, *, by_primary_key: bool = False) -> dict:
    """%(floor)s and %(ceiling)s: the live floor (NO_FLOOR when none is known) and the database's
    clock, in one round trip."""
    cur.execute(f"SELECT ({LIVE_FLOOR_SQL}), statement_timestamp(){_BY_PRIMARY_KEY if by_primary_key else ''}")
    floor, ceiling = cur.fetchall()[0][:2]
    return {"floor": NO_FLOOR if floor is None else floor, "ceiling": ceiling}


# schedule_insert's columns taken from the row inserted before them in the same statement.
_CURRENT_ONLY = {"current_id": "(SELECT id FROM new_version)"}
_SCHEDULE_FROM_VERSION = {**_CURRENT_ONLY, "id": "(SELECT schedule_id FROM new_version)",
                          "version": "(SELECT version FROM new_version)"}
_ENTRY_FROM_SCHEDULE = {"tenant_id": "(SELECT tenant_id FROM new_schedule)",
                        "object_id": "(SELECT schedule_id::text FROM new_version)"}


class PostgresStore(PostgresHistory, PortableStore):
    # --- new rows of any model, in bulk (schedule creation) ---------------------------------------

    def rows_insert_new(self, model, objs, *, need_ids: bool = False) -> None:
        """COPY instead of bulk_create's INSERT ... UNNEST: bulk_create prepares every value through
        the field's adapters and dumps each column as a text array literal in Python, ~60% of a
        1,000-schedule batch (bench/api_create.py --bulk). Here the values go to COPY as the
        instance holds them (already of the column's type: the callers build them from checked
        fields), JSON as its text, and auto_now/auto_now_add stamps set as the field's pre_save
        sets them, one timestamp for the statement. An auto-numbered key is taken from its sequence in one
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
        stamp = timezone.now()
        getters = [_copy_value(f, stamp) for f in fields]
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
        version_sql, version_params = _insert_statement(conn, version, returning=("id", "schedule_id", "version"))
        # Values the rows share are sent once and taken from the row that has them: with each sent
        # for every row the statement had more parameters than psycopg keeps parsed statements for
        # (psycopg._queries.MAX_CACHED_STATEMENT_PARAMS), and parsing its text on every create cost
        # more CPU than the rest of the insert (tests/core/test_single_create_statement.py).
        shared = schedule.id == version.schedule_id and schedule.version == version.version
        schedule_sql, schedule_params = _insert_statement(conn, schedule, returning=("tenant_id",) if shared else (),
                                                          computed=_SCHEDULE_FROM_VERSION if shared else _CURRENT_ONLY)
        from_schedule = shared and entry.object_id == str(schedule.id) and entry.tenant_id == schedule.tenant_id
        entry_sql, entry_params = _insert_statement(conn, entry, computed=_ENTRY_FROM_SCHEDULE if from_schedule else None)
        sql = (f"WITH new_version AS ({version_sql}), new_schedule AS ({schedule_sql}), "
               f"new_entry AS ({entry_sql}) SELECT id FROM new_version")
        with prepared_cursor(conn) as cur:
            cur.execute(sql, [*version_params, *schedule_params, *entry_params])
            (version.id,) = cur.fetchone()
        schedule.current = version
        for obj in (version, schedule, entry):
            obj._state.adding = False
            obj._state.db = DEFAULT_DB_ALIAS

    def schedule_scan_begin(self) -> tuple[datetime, bool]:
        with _cursor() as cur:
            cur.execute(SCAN_BEGIN_SQL, {"gate": SCAN_GATE})
            (now, admitted), = cur.fetchall()
        return now, admitted

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

    def runs_live(self, *, due_by: datetime | None = None):
        """As PortableStore's, held to the live partitions: at or above the live floor (read now),
        and with `due_by`, none made ahead of it. Each bound is a value in the statement, so the
        planner leaves the other partitions out of the plan, as it does for the claim's statements."""
        with _cursor() as cur:
            floor = _live_floor(cur)
        qs = super().runs_live(due_by=due_by)
        return qs if floor == NO_FLOOR else qs.filter(scheduled_time__gte=floor)

    def run_due_tenants(self, now, *, max_tenants: int) -> list:
        with _cursor() as cur:
            floor = _live_floor(cur)
            cur.execute(DUE_TENANTS_SQL, {"now": now, "max_tenants": max_tenants, "floor": floor})
            return [row[0] for row in cur.fetchall()]

    def run_due_candidates(self, tenants: list, now, *, per_tenant: int, room: dict | None = None,
                           without: dict | None = None) -> list:
        full = json.dumps({str(t): list(hosts) for t, hosts in (without or {}).items()})
        limits = candidate_limits(tenants, per_tenant, room)
        with _cursor() as cur:
            # Index scans only (for the rest of the claim's transaction, as RunClaim wants it too):
            # a read held to the partitions due now could be planned as a bitmap scan of all a
            # tenant's due runs, sorted, to lock the few oldest.
            floor = _live_floor(cur, by_primary_key=True)
            cur.execute(CANDIDATES_SQL,
                        {"tenants": tenants, "limits": limits, "now": now, "floor": floor, "full": full})
            return cur.fetchall()

    def run_cap_locks(self, tenant_ids, host_keys) -> set:
        keys = {str(t): t for t in tenant_ids} | {f"{t} {h}": (t, h) for t, h in host_keys}
        # Sorted, so two claims over the same keys try them in the same order.
        with _cursor() as cur:
            cur.execute(CAP_LOCKS_SQL, {"keys": sorted(keys), "space": CAP_LOCK_SPACE})
            return {keys[row[0]] for row in cur.fetchall()}

    def run_leased_per_tenant(self, tenant_ids) -> dict:
        with _cursor() as cur:
            cur.execute(LEASED_PER_TENANT_SQL, {"tenants": list(tenant_ids), **_live_bounds(cur)})
            return dict(cur.fetchall())

    def run_leased_per_host(self, keys) -> dict:
        with _cursor() as cur:
            cur.execute(LEASED_PER_HOST_SQL, {"tenants": list({k[0] for k in keys}),
                                              "hosts": list({k[1] for k in keys}), **_live_bounds(cur)})
            return {(t, h): n for t, h, n in cur.fetchall()}

    def run_claim_due(self, *, worker: str, limit: int, lease_seconds: float, shift: int, holding) -> list[Claimed]:
        with _cursor() as cur:
            bounds = _live_bounds(cur, by_primary_key=True)
            cur.execute(CLAIM_DUE_SQL, {
                "worker": worker, "limit": limit, "lease": lease_seconds, "shift": shift, **bounds,
                **share_params(holding),
            })
            return _claimed(cur)

    def run_claim(self, ids, *, worker: str, now, until) -> list[Claimed]:
        if not ids:
            return []
        with _cursor() as cur:
            floor = _live_floor(cur, by_primary_key=True)
            cur.execute(CLAIM_SQL,
                        {"ids": _uuid_array(ids), "worker": worker, "now": now, "until": until, "floor": floor})
            return _claimed(cur)

    def run_extend_leases(self, keys, *, worker: str, lease_seconds: float) -> set:
        gens = "{" + ",".join(str(k[1]) for k in keys) + "}"
        with _cursor() as cur:
            floor = _live_floor(cur)
            cur.execute(EXTEND_LEASES_SQL,
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
