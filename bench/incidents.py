"""The incidents loop's pass: what one `IncidentEvaluator.step()` costs when the outbox holds a
backlog of run transitions, against how many schedules exist (it must not grow with them).

    .venv/bin/python bench/incidents.py [--schedules 1000000] [--runs 20000] [--passes 5]

Loaded: `--schedules` schedules of one tenant (none of them due), `--runs` ready runs of the
first of them with their run.created events, then for each run a run.leased and a
run.retry_scheduled event with an error (every run failing: streaks grow, incidents open once
a schedule has failed SCHEDULER_INCIDENT_FAILURES times, and are added to after that), and
repeated so a pass's batch is full. Each pass reads up to BATCH events after the cursor, joins
their runs and schedules by key, and writes what it found. Printed: the median time and the
SQL statements of one full pass (BATCH events), events evaluated per second, and the missed-start
probe's time on a backlog of `--runs` ready runs past their grace.

Database: scheduler_bench_incidents (dropped and made again).
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--schedules", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3, help="failure events per run")
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--database", default="scheduler_bench_incidents")
    args = ap.parse_args()
    print(C.machine_line(), flush=True)
    C.setup_database(args.database)
    from django.conf import settings
    from django.db import connection, reset_queries

    from dispatch.incidents import IncidentEvaluator, probe_missed
    from dispatch.models import Incident
    from runs.models import OutboxEvent
    from scheduler_project.foundation.dbclock import db_now

    settings.SCHEDULER_INCIDENT_SETTLE_SECONDS = 0
    tenant = C.load_tenant("inc", "http://127.0.0.1:9/")
    t = time.perf_counter()
    s = C.load_schedules("inc", tenant, args.schedules, target_url="http://127.0.0.1:9/run",
                         next_run_at="now() + interval '10 days'")
    C.load_due_runs(s, args.runs, "date_trunc('second', now()) - interval '2 hours'")
    print(f"loaded {args.schedules} schedules and {args.runs} runs in {time.perf_counter() - t:.1f}s", flush=True)
    evaluator = IncidentEvaluator()
    evaluator.step(probe=False)  # the cursor starts after what was loaded
    for _ in range(args.rounds):
        for kind, payload in (("run.leased", "jsonb_build_object('generation', 1)"),
                              ("run.retry_scheduled", "jsonb_build_object('error', 'HTTP 500', 'state', 'ready')")):
            C.insert_series(OutboxEvent, args.runs, exprs={
                "event_id": "gen_random_uuid()", "tenant_id": f"'{tenant.id}'", "run_id": C.uid(s.tag, "r"),
                "kind": f"'{kind}'", "payload": payload, "created_at": "now() - interval '1 minute'"})
    C.vacuum_analyze("runs_outboxevent", "runs_run", "schedules_schedule")
    backlog = 2 * args.rounds * args.runs
    times, statements = [], []
    settings.DEBUG = True  # count the statements of each pass
    for _ in range(args.passes):
        reset_queries()
        started = time.perf_counter()
        full = evaluator.step(probe=False)
        times.append(time.perf_counter() - started)
        statements.append(len(connection.queries))
        if not full:
            break
    settings.DEBUG = False
    med = statistics.median(times)
    started = time.perf_counter()
    probe_missed(db_now())
    probe = time.perf_counter() - started
    print(f"\nincidents pass over a backlog of {backlog} events, {args.schedules} schedules:")
    print(f"  one pass of {evaluator.batch} events: median {med * 1000:.0f} ms "
          f"(passes: {', '.join(f'{x * 1000:.0f}' for x in times)} ms), {evaluator.batch / med:.0f} events/s")
    print(f"  statements per pass: {', '.join(map(str, statements))}")
    print(f"  missed-start probe over {args.runs} ready runs past their grace: {probe * 1000:.0f} ms")
    print(f"  incidents open: {Incident.objects.count()}")


if __name__ == "__main__":
    main()
