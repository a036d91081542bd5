"""Migration runs.0007 on a database with history: how long the conversion to partitioned tables
takes (the downtime: the tables are locked while their rows are copied), per million runs.

    .venv/bin/python bench/migration_0007.py [--runs 1000000] [--days 14]

Migrates a fresh database to runs.0006, loads `--runs` succeeded runs spread over the `--days` days
before now (each with its occurrence, one attempt and three published outbox events, the shapes of
tests/partitions/test_migration_with_data.py), then times `manage.py migrate` (0007 and what follows)
in a subprocess, as an operator would run it, and checks every row is still there.

Database: scheduler_bench_migration (dropped and made again).
"""

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402

TABLES = ("runs_occurrence", "runs_run", "runs_attempt", "runs_outboxevent")

LOAD = """
INSERT INTO schedules_tenant (id, slug, name, signing_secret, notification_url, created_at)
VALUES ('00000000-0000-0000-0000-00000000000a', 'old', 'Old', 'whsec_x', '', now());
INSERT INTO schedules_schedule (id, name, version, enabled, status, next_run_at, shard, anchor_at, last_error,
                                created_at, updated_at, tenant_id)
SELECT md5('s' || s)::uuid, 's' || s, 1, true, 'active', now() + interval '1 day', 0, now() - interval '60 days', '',
       now(), now(), '00000000-0000-0000-0000-00000000000a' FROM generate_series(1, 1000) s;
INSERT INTO schedules_scheduleversion (id, version, name, expression, time_zone, payload, target_url, target_method,
    target_headers, target_timeout_seconds, misfire_policy, catchup_limit, misfire_grace_seconds, overlap_policy,
    max_attempts, backoff_base_seconds, backoff_max_seconds, dst_skipped, dst_repeated, created_at, created_by, changes,
    schedule_id)
SELECT s, 1, 's' || s, 'rate(1 minute)', 'UTC', '{}', 'http://127.0.0.1:9/', 'POST', '{}', 30, 'run_once', 10, 60,
       'allow', 5, 1, 300, 'next_valid', 'earlier', now(), 'bench', '{}', md5('s' || s)::uuid
FROM generate_series(1, 1000) s;
UPDATE schedules_schedule s SET current_id = v.id FROM schedules_scheduleversion v WHERE v.schedule_id = s.id;
SELECT setval(pg_get_serial_sequence('schedules_scheduleversion', 'id'), 1000);
"""

RUNS = """
INSERT INTO runs_occurrence (id, schedule_version, scheduled_time, local_wall_time, local_time, time_zone,
    tzdata_version, note, kind, created_at, schedule_id, version_id)
SELECT md5('o' || n)::uuid, 1, now() - make_interval(secs => %(span)s::float8 * (%(n)s::int - n) / %(n)s::int), '', '', 'UTC', '2024a',
       '', 'scheduled', now(), md5('s' || (mod(n, 1000) + 1))::uuid, mod(n, 1000) + 1
FROM generate_series(%(lo)s::int, %(hi)s::int) n;
INSERT INTO runs_run (id, schedule_version, scheduled_time, kind, state, reason, generation, attempts_used, max_attempts,
    next_eligible_at, lease_until, lease_owner, created_at, first_started_at, finished_at, last_error, retried_by,
    occurrence_id, schedule_id, tenant_id, version_id, target_host)
SELECT md5('r' || n)::uuid, 1, now() - make_interval(secs => %(span)s::float8 * (%(n)s::int - n) / %(n)s::int), 'scheduled', 'succeeded',
       '', 1, 1, 5, NULL, NULL, '', now(), now(), now(), '', '', md5('o' || n)::uuid,
       md5('s' || (mod(n, 1000) + 1))::uuid, '00000000-0000-0000-0000-00000000000a', mod(n, 1000) + 1, '127.0.0.1:9'
FROM generate_series(%(lo)s::int, %(hi)s::int) n;
INSERT INTO runs_attempt (generation, worker_id, started_at, finished_at, outcome, error_class, error, response_excerpt,
    remote_address, canceled_in_flight, run_id)
SELECT 1, 'w', now(), now(), 'succeeded', '', '', 'ok', '127.0.0.1:9', false, md5('r' || n)::uuid
FROM generate_series(%(lo)s::int, %(hi)s::int) n;
INSERT INTO runs_outboxevent (event_id, kind, payload, created_at, published_at, publish_attempts, last_error, tenant_id,
    run_id)
SELECT gen_random_uuid(), e.k, jsonb_build_object('state', e.state, 'generation', e.g),
       now() - make_interval(secs => %(span)s::float8 * (%(n)s::int - n) / %(n)s::int), now(), 0, '',
       '00000000-0000-0000-0000-00000000000a', md5('r' || n)::uuid
FROM (VALUES ('run.created', 'ready', 0), ('run.leased', 'leased', 1), ('run.succeeded', 'succeeded', 1))
     AS e(k, state, g), generate_series(%(lo)s::int, %(hi)s::int) n;
"""


def manage(db, *args):
    t0 = time.monotonic()
    r = subprocess.run([str(C.PYTHON), "manage.py", *args], env=C.bench_env(db), cwd=C.CODE, capture_output=True,
                       text=True)
    if r.returncode:
        sys.exit(f"manage.py {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}")
    return time.monotonic() - t0, r.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=1_000_000)
    ap.add_argument("--days", type=int, default=14)
    ap.add_argument("--database", default="scheduler_bench_migration")
    args = ap.parse_args()
    print(C.machine_line(), flush=True)
    import psycopg

    with psycopg.connect(C.PG_SERVER + "/postgres", autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{args.database}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{args.database}"')
    manage(args.database, "migrate", "runs", "0006_run_updated_at_removed")
    url = f"{C.PG_SERVER}/{args.database}"
    t0 = time.monotonic()
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(LOAD)
        step = 250_000
        for lo in range(1, args.runs + 1, step):
            params = {"lo": lo, "hi": min(args.runs, lo + step - 1), "n": args.runs, "span": args.days * 86400}
            for statement in RUNS.split(";\n"):
                if statement.strip():
                    c.execute(statement, params)
        for t in TABLES:
            c.execute(f"VACUUM (ANALYZE) {t}")
        before = {t: c.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}
        size = c.execute("SELECT pg_size_pretty(pg_database_size(current_database()))").fetchone()[0]
    print(f"loaded {args.runs} runs over {args.days} days in {time.monotonic() - t0:.0f}s: {before}; database {size}",
          flush=True)
    secs, out = manage(args.database, "migrate")
    with psycopg.connect(url, autocommit=True) as c:
        after = {t: c.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}
        parts = c.execute("SELECT count(*) FROM pg_inherits WHERE inhparent = 'runs_run'::regclass").fetchone()[0]
    print(f"\nmigration 0007 over {args.runs} runs ({args.days} days of history): {secs:.1f} s "
          f"({secs / args.runs * 1e6:.1f} s per million runs, with their occurrences, attempts and 3 events each); "
          f"runs_run now has {parts} partitions")
    print(f"  check  {'OK: every row is there' if after == before else f'ROWS DIFFER: {before} -> {after}'}")


if __name__ == "__main__":
    main()
