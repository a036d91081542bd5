"""Migration runs.0007 converts a database that already has history: the rows are all there
afterwards, in their partitions, attempts carry their run's time, the id sequences go on, and the
invariant checker finds nothing. Run against a database of its own, migrated in subprocesses."""

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from django.db import connection

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgresql_only("migration 0007 converts PostgreSQL tables into partitioned tables"),
]

ROOT = Path(__file__).resolve().parents[2]

OLD_HISTORY = """
INSERT INTO schedules_tenant (id, slug, name, signing_secret, notification_url, created_at)
VALUES ('00000000-0000-0000-0000-00000000000a', 'old', 'Old', 'whsec_x', '', now());
INSERT INTO schedules_schedule (id, name, version, enabled, status, next_run_at, shard, anchor_at, last_error,
                                created_at, updated_at, tenant_id)
VALUES ('00000000-0000-0000-0000-0000000000b1', 's', 1, true, 'active', now() + interval '1 day', 0,
        now() - interval '60 days', '', now(), now(), '00000000-0000-0000-0000-00000000000a');
INSERT INTO schedules_scheduleversion (id, version, name, expression, time_zone, payload, target_url, target_method,
    target_headers, target_timeout_seconds, misfire_policy, catchup_limit, misfire_grace_seconds, overlap_policy,
    max_attempts, backoff_base_seconds, backoff_max_seconds, dst_skipped, dst_repeated, created_at, created_by, changes,
    schedule_id)
VALUES (1, 1, 's', 'rate(1 hour)', 'UTC', '{}', 'http://127.0.0.1:9/', 'POST', '{}', 30, 'run_once', 10, 60, 'allow',
        5, 1, 300, 'next_valid', 'earlier', now(), 'test', '{}', '00000000-0000-0000-0000-0000000000b1');
UPDATE schedules_schedule SET current_id = 1;
-- 480 hourly occurrences and runs reaching 20 days back (some older than the regular partitions
-- made), each run succeeded after one attempt with its events; the last one leased.
INSERT INTO runs_occurrence (id, schedule_version, scheduled_time, local_wall_time, local_time, time_zone,
    tzdata_version, note, kind, created_at, schedule_id, version_id)
SELECT md5('o' || n)::uuid, 1, date_trunc('hour', now()) - make_interval(hours => 480 - n), '', '', 'UTC', '2024a', '',
       'scheduled', now(), '00000000-0000-0000-0000-0000000000b1', 1 FROM generate_series(1, 480) n;
INSERT INTO runs_run (id, schedule_version, scheduled_time, kind, state, reason, generation, attempts_used, max_attempts,
    next_eligible_at, lease_until, lease_owner, created_at, first_started_at, finished_at, last_error, retried_by,
    occurrence_id, schedule_id, tenant_id, version_id, target_host)
SELECT md5('r' || n)::uuid, 1, date_trunc('hour', now()) - make_interval(hours => 480 - n), 'scheduled',
       CASE WHEN n = 480 THEN 'leased' ELSE 'succeeded' END, '', 1, 1, 5, NULL,
       CASE WHEN n = 480 THEN now() + interval '1 minute' END, CASE WHEN n = 480 THEN 'w' ELSE '' END, now(), now(),
       CASE WHEN n = 480 THEN NULL ELSE now() END, '', '', md5('o' || n)::uuid,
       '00000000-0000-0000-0000-0000000000b1', '00000000-0000-0000-0000-00000000000a', 1, '127.0.0.1:9'
FROM generate_series(1, 480) n;
INSERT INTO runs_attempt (generation, worker_id, started_at, finished_at, outcome, error_class, error, response_excerpt,
    remote_address, canceled_in_flight, run_id)
SELECT 1, 'w', now(), CASE WHEN n = 480 THEN NULL ELSE now() END, CASE WHEN n = 480 THEN NULL ELSE 'succeeded' END,
       '', '', '', '', false, md5('r' || n)::uuid FROM generate_series(1, 480) n;
INSERT INTO runs_outboxevent (event_id, kind, payload, created_at, published_at, publish_attempts, last_error, tenant_id,
    run_id)
SELECT gen_random_uuid(), e.k, jsonb_build_object('state', e.state, 'generation', e.g), now(), now(), 0, '',
       '00000000-0000-0000-0000-00000000000a', md5('r' || n)::uuid
FROM (VALUES (1, 'run.created', 'ready', 0), (2, 'run.leased', 'leased', 1), (3, 'run.succeeded', 'succeeded', 1))
     AS e(pos, k, state, g), generate_series(1, 480) n
WHERE NOT (n = 480 AND e.k = 'run.succeeded')
ORDER BY e.pos, n;
"""


def digest(c, table, columns) -> str:
    """md5 of every row of `table` (these columns), in a fixed order."""
    cols = ", ".join(columns)
    return c.execute(f"SELECT md5(string_agg(x::text, E'\\n' ORDER BY x::text)) FROM (SELECT {cols} FROM {table}) x"
                     ).fetchone()[0]


def manage(url, *args):
    env = {**os.environ, "DATABASE_URL": url, "SCHEDULER_ALLOW_DEV_SECRET": "1", "DJANGO_SETTINGS_MODULE": "scheduler_project.settings"}
    return subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], env=env, capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


@pytest.fixture
def old_database():
    params = connection.get_connection_params()
    name = connection.settings_dict["NAME"] + "_mig0007"
    server = f"postgres://{params.get('user', 'postgres')}@{params.get('host', '127.0.0.1')}:{params.get('port', 5432)}"
    with psycopg.connect(server + "/postgres", autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{name}"')
    yield server + "/" + name
    with psycopg.connect(server + "/postgres", autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_migrating_a_database_with_history_keeps_every_row(old_database):
    r = manage(old_database, "migrate", "runs", "0006_run_updated_at_removed")
    assert r.returncode == 0, r.stderr
    with psycopg.connect(old_database, autocommit=True) as c:
        c.execute(OLD_HISTORY)
        before = {t: c.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                  for t in ("runs_occurrence", "runs_run", "runs_attempt", "runs_outboxevent")}
        # Every value of every row, not only how many rows: the migration copies by column name
        # into new tables, and a column copied into the wrong one (or not at all) keeps the counts.
        columns = {t: [r[0] for r in c.execute(
            "SELECT quote_ident(attname) FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
            "AND NOT attisdropped ORDER BY attnum", [t])] for t in before}
        digest_before = {t: digest(c, t, columns[t]) for t in before}
        max_attempt = c.execute("SELECT max(id) FROM runs_attempt").fetchone()[0]

    r = manage(old_database, "migrate")
    assert r.returncode == 0, r.stderr

    with psycopg.connect(old_database, autocommit=True) as c:
        after = {t: c.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in before}
        assert after == before == {"runs_occurrence": 480, "runs_run": 480, "runs_attempt": 480, "runs_outboxevent": 1439}
        assert {t: digest(c, t, columns[t]) for t in before} == digest_before
        partitioned = {r[0] for r in c.execute("SELECT partrelid::regclass::text FROM pg_partitioned_table")}
        assert partitioned == set(before)
        assert c.execute("SELECT count(*) FROM runs_attempt a JOIN runs_run r ON r.id = a.run_id "
                         "AND r.scheduled_time = a.scheduled_time").fetchone()[0] == 480
        # Rows older than the regular partitions are in the kept one; the newest in a regular one.
        kept = c.execute("SELECT count(*) FROM runs_run_kept_1").fetchone()[0]
        assert 0 < kept < 480
        # The id sequence goes on after the copied rows.
        new_id = c.execute("INSERT INTO runs_attempt (generation, worker_id, started_at, error_class, error, "
                           "response_excerpt, remote_address, canceled_in_flight, run_id, scheduled_time) "
                           "SELECT 2, 'w', now(), '', '', '', '', false, id, scheduled_time FROM runs_run "
                           "WHERE state = 'succeeded' LIMIT 1 RETURNING id").fetchone()[0]
        assert new_id > max_attempt
        c.execute("DELETE FROM runs_attempt WHERE id = %s", [new_id])
    r = manage(old_database, "check_invariants")
    assert "0 violations" in r.stdout, r.stdout + r.stderr
    r = manage(old_database, "partitions", "--check")
    assert r.returncode == 0, r.stdout + r.stderr
