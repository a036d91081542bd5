"""The queue's hot statements on PostgreSQL: one round trip per batch step, arrays in, rows out.

`runs.queue` decides every transition (which runs, which states, which events); on PostgreSQL it
writes them through these statements, elsewhere (the embedded SQLite quickstart) through the ORM.
Measured before this module (bench/queue_profile.py): `complete` spent ~2.1 ms of Python per run
building `bulk_update` CASE expressions and OR-chains of (id, generation); these statements pass
columns as arrays (`unnest`), so the cost per run is a few microseconds of Python.
"""

import json
from contextlib import contextmanager

import psycopg
from django.db import connection


@contextmanager
def _cursor():
    """A server-side-binding cursor on Django's connection (same transaction): the query and its
    array parameters travel separately, so Python does not compose a literal query text per batch
    (the client-side cursor's cost on these large statements). Statements are never prepared
    (`prepare=False` at each execute): a plan cached while a queue table was nearly empty is the
    trap measured in shared/notes/performance.md."""
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

# Claim: lease the picked runs, open their attempts and write their events, in one statement.
CLAIM_SQL = """
WITH leased AS (
    UPDATE runs_run r SET
        state = 'leased', generation = r.generation + 1, attempts_used = r.attempts_used + 1,
        lease_until = %(until)s, lease_owner = %(worker)s, reason = '', next_eligible_at = NULL,
        first_started_at = COALESCE(r.first_started_at, %(now)s), updated_at = %(now)s
    WHERE r.id = ANY(%(ids)s::uuid[]) AND r.state = 'ready'
    RETURNING r.id, r.generation, r.attempts_used, r.max_attempts, r.tenant_id, r.schedule_id,
              r.schedule_version, r.scheduled_time, r.version_id
), opened AS (
    INSERT INTO runs_attempt (run_id, generation, worker_id, started_at, error_class, error,
                              response_excerpt, remote_address, canceled_in_flight)
    SELECT id, generation, %(worker)s, %(now)s, '', '', '', '', false FROM leased
    RETURNING id, run_id
), events AS (
    INSERT INTO runs_outboxevent (event_id, tenant_id, run_id, kind, payload, created_at,
                                  publish_attempts, last_error)
    SELECT gen_random_uuid(), tenant_id, id, 'run.leased',
           jsonb_build_object('runId', id::text, 'generation', generation, 'workerId', %(worker)s::text,
                              'state', 'leased'),
           %(now)s, 0, ''
    FROM leased
)
SELECT l.id, l.generation, o.id, l.attempts_used, l.max_attempts, l.tenant_id, l.schedule_id,
       l.schedule_version, l.scheduled_time, l.version_id,
       v.target_url, v.target_method, v.target_headers::text, v.target_timeout_seconds, v.payload::text
FROM leased l JOIN opened o ON o.run_id = l.id JOIN schedules_scheduleversion v ON v.id = l.version_id
"""


def claim(ids, *, worker: str, now, until) -> list[tuple]:
    """Rows of (Claimed fields..., (url, method, headers JSON, timeout, payload JSON))."""
    with _cursor() as cur:
        cur.execute(CLAIM_SQL, {"ids": list(ids), "worker": worker, "now": now, "until": until})
        return [(*r[:10], r[10:]) for r in cur.fetchall()]


# Which of these (run, generation) pairs still hold their lease; locks them for the caller's
# transaction and reads the database clock in the same round trip.
LOCK_OWNED_SQL = """
SELECT r.id, r.generation, r.attempts_used, r.max_attempts, r.version_id, r.schedule_id, statement_timestamp()
FROM runs_run r
JOIN unnest(%(ids)s::uuid[], %(gens)s::int[]) AS k(id, generation) ON k.id = r.id AND k.generation = r.generation
WHERE r.state = 'leased' {owner}
ORDER BY r.id
FOR UPDATE OF r
"""


def lock_owned(keys, worker: str | None = None) -> list[tuple]:
    ids = [str(k[0]) for k in keys]
    gens = [k[1] for k in keys]
    sql = LOCK_OWNED_SQL.format(owner="AND r.lease_owner = %(worker)s" if worker else "")
    with _cursor() as cur:
        cur.execute(sql, {"ids": ids, "gens": gens, "worker": worker})
        return cur.fetchall()


def extend_leases(ids, *, until) -> None:
    with _cursor() as cur:
        cur.execute("UPDATE runs_run SET lease_until = %s WHERE id = ANY(%s::uuid[])", [until, [str(i) for i in ids]])


FINISH_ATTEMPTS_SQL = """
UPDATE runs_attempt a SET
    outcome = v.outcome, finished_at = %(now)s, http_status = v.http_status, error_class = v.error_class,
    error = v.error, response_excerpt = v.excerpt, latency_ms = v.latency_ms, remote_address = v.remote
FROM unnest(%(ids)s::bigint[], %(outcome)s::text[], %(http_status)s::int[], %(error_class)s::text[],
            %(error)s::text[], %(excerpt)s::text[], %(latency)s::int[], %(remote)s::text[])
     AS v(id, outcome, http_status, error_class, error, excerpt, latency_ms, remote)
WHERE a.id = v.id
"""


def finish_attempts(rows, *, now) -> None:
    """rows: (attempt id, outcome, http_status, error_class, error, excerpt, latency_ms, remote)."""
    if not rows:
        return
    cols = list(zip(*rows))
    with _cursor() as cur:
        cur.execute(FINISH_ATTEMPTS_SQL, {
            "now": now, "ids": list(cols[0]), "outcome": list(cols[1]), "http_status": list(cols[2]),
            "error_class": list(cols[3]), "error": list(cols[4]), "excerpt": list(cols[5]),
            "latency": list(cols[6]), "remote": list(cols[7]),
        })


def keep_late_results(rows) -> None:
    """rows: (attempt id, late result dict): evidence from a fenced-off worker, nothing else."""
    if not rows:
        return
    with _cursor() as cur:
        cur.execute(
            "UPDATE runs_attempt a SET late_result = v.late::jsonb "
            "FROM unnest(%s::bigint[], %s::text[]) AS v(id, late) WHERE a.id = v.id",
            [[r[0] for r in rows], [json.dumps(r[1]) for r in rows]],
        )


APPLY_RUNS_SQL = """
UPDATE runs_run r SET
    state = v.state, next_eligible_at = v.eligible, lease_until = NULL, lease_owner = '',
    last_error = v.error, updated_at = %(now)s,
    finished_at = CASE WHEN v.state IN ('succeeded', 'dead', 'canceled', 'skipped') THEN %(now)s ELSE NULL END
FROM unnest(%(ids)s::uuid[], %(states)s::text[], %(eligible)s::timestamptz[], %(errors)s::text[])
     AS v(id, state, eligible, error)
WHERE r.id = v.id
"""


def apply_runs(updates, *, now) -> None:
    """updates: (run id, state, next_eligible_at or None, error text or None)."""
    if not updates:
        return
    with _cursor() as cur:
        cur.execute(APPLY_RUNS_SQL, {
            "now": now, "ids": [str(u[0]) for u in updates], "states": [u[1] for u in updates],
            "eligible": [u[2] for u in updates], "errors": [u[3] or "" for u in updates],
        })


INSERT_EVENTS_SQL = """
INSERT INTO runs_outboxevent (event_id, tenant_id, run_id, kind, payload, created_at, publish_attempts, last_error)
SELECT gen_random_uuid(), v.tenant_id, v.run_id, v.kind, v.payload::jsonb, %(now)s, 0, ''
FROM unnest(%(tenants)s::uuid[], %(runs)s::uuid[], %(kinds)s::text[], %(payloads)s::text[])
     AS v(tenant_id, run_id, kind, payload)
"""


def insert_events(events, *, now) -> None:
    """events: runs.queue.Event objects."""
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


ADVANCE_SCHEDULES_SQL = """
UPDATE schedules_schedule s SET
    next_run_at = v.next_run_at, status = v.status, completed_at = v.completed_at, last_error = v.last_error,
    updated_at = %(now)s
FROM unnest(%(ids)s::uuid[], %(next)s::timestamptz[], %(status)s::text[], %(completed)s::timestamptz[],
            %(errors)s::text[]) AS v(id, next_run_at, status, completed_at, last_error)
WHERE s.id = v.id
"""


def advance_schedules(schedules, *, now) -> None:
    """The scanner's write-back of next_run_at (and completion) for a batch of schedules."""
    if not schedules:
        return
    with _cursor() as cur:
        cur.execute(ADVANCE_SCHEDULES_SQL, {
            "now": now, "ids": [str(s.id) for s in schedules], "next": [s.next_run_at for s in schedules],
            "status": [s.status for s in schedules], "completed": [s.completed_at for s in schedules],
            "errors": [s.last_error for s in schedules],
        })
