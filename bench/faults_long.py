"""The fault-injection suite, long form: the same chaos as tests/faults for longer and larger.

    python bench/faults_long.py --seconds 300 --schedules 200 --backlog 60

Uses its own database (default postgres://postgres@127.0.0.1:5432/scheduler_faults, created
and flushed here), prints the counting line, exits 1 if an invariant broke.
"""

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--schedules", type=int, default=200)
    ap.add_argument("--backlog", type=int, default=60, help="minutes of due occurrences per schedule at the start")
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--database", default="postgres://postgres@127.0.0.1:5432/scheduler_faults")
    args = ap.parse_args()

    os.environ["DATABASE_URL"] = args.database
    os.environ.setdefault("SCHEDULER_ALLOW_DEV_SECRET", "1")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "scheduler_project.settings")
    import psycopg

    name = args.database.rsplit("/", 1)[1]
    admin = args.database.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as c:
        if not c.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            c.execute(f'CREATE DATABASE "{name}"')
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    settings.SCHEDULER_TARGET_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    call_command("migrate", verbosity=0)
    call_command("flush", interactive=False, verbosity=0)
    from tests.faults.harness import run_chaos

    print(f"seed={args.seed} seconds={args.seconds:.0f} schedules={args.schedules} backlog={args.backlog}")
    report = run_chaos(duration=args.seconds, seed=args.seed, schedules=args.schedules,
                       backlog_minutes=args.backlog, drain_timeout=max(180, args.seconds))
    print(report.line())
    for d in report.details:
        print("  " + d)
    print(f"  (dead={report.dead} late_results_kept={report.late_results})")
    sys.exit(0 if report.ok() else 1)


if __name__ == "__main__":
    main()
