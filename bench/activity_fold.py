"""What the reconcile process's two folding loops cost per run, in this process: N runs of N
schedules claimed and completed for real (runs.queue), then (1) the activity loop's passes
(dispatch.activity.ActivityAggregator: the portal's per-minute, per-target, per-schedule and
retry-cost figures) until it has folded every attempt, and (2) the incidents loop's passes
(dispatch.incidents.IncidentEvaluator) until it has read every event of those runs, each timed in
Python (this thread's CPU) and in PostgreSQL (its backend's, from /proc). Every schedule's summary
starts with a full sparkline (ScheduleActivity.RECENT entries), as every schedule that fires often
has in steady operation.

    .venv/bin/python bench/activity_fold.py [--runs 20000] [--rounds 3] [--compare] [--profile]

Database: scheduler_bench_activity (dropped and made again).
"""

import argparse
import sys
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402


def finished_attempts(s, n, failing_every: int):
    """N runs due now, claimed and completed: every `failing_every`-th one failed (retryable)."""
    from runs import queue
    from runs.decisions import Holding

    C.truncate_runs()
    C.load_due_runs(s, n, "date_trunc('second', now()) - interval '30 seconds'")
    done = 0
    while True:
        claims = queue.claim("fold", 500, holding=Holding(500, 1.0, 1.0))
        if not claims:
            break
        queue.complete([
            queue.Result(claimed=c, outcome="failed" if (done + i) % failing_every == 0 else "succeeded",
                         http_status=500 if (done + i) % failing_every == 0 else 200, latency_ms=3,
                         remote_address="127.0.0.1", response_excerpt="")
            for i, c in enumerate(claims)])
        done += len(claims)
    return done


def fold_all(backend):
    """Passes of the loop until nothing is left after the watermark; (passes, Python s, PG s)."""
    from datetime import timedelta

    from dispatch.activity import ActivityAggregator

    agg = ActivityAggregator(settle=timedelta(0))
    py0, pg0, passes = time.thread_time(), C.proc_cpu(backend), 0
    while agg.step():
        passes += 1
    passes += 1
    return passes, time.thread_time() - py0, C.proc_cpu(backend) - pg0


def evaluate_all(backend, after_event: int):
    """The incidents loop's passes over the events after `after_event`; (passes, Python s, PG s)."""
    from dispatch.incidents import IncidentEvaluator
    from dispatch.models import IncidentCursor

    IncidentCursor.objects.update_or_create(id=1, defaults={"watermark": after_event})
    ev = IncidentEvaluator()
    py0, pg0, passes = time.thread_time(), C.proc_cpu(backend), 0
    while ev.step(probe=False):
        passes += 1
    passes += 1
    return passes, time.thread_time() - py0, C.proc_cpu(backend) - pg0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--failing-every", type=int, default=25, help="every K-th attempt fails (retry cost rows)")
    ap.add_argument("--profile", action="store_true", help="cProfile the last round's passes (top 30 by own time)")
    ap.add_argument("--compare", action="store_true",
                    help="interleave rounds of the writes and reads as they were (the ORM's read-modify-write, IN "
                         "lists) with the code as it is, and print the ratio")
    ap.add_argument("--database", default="scheduler_bench_activity")
    args = ap.parse_args()

    print(C.machine_line(), flush=True)
    s = C.fresh_idle_schedules(args.database, "fold", args.runs)
    backend = C.sql("SELECT pg_backend_pid()")[0][0]
    # A first round makes every schedule's summary row; then each gets a full sparkline.
    finished_attempts(s, args.runs, args.failing_every)
    fold_all(backend)
    from dispatch.models import ScheduleActivity

    full = [[1.7e9 + i, "s", 3] for i in range(ScheduleActivity.RECENT)]
    ScheduleActivity.objects.update(recent=full)
    from django.conf import settings

    settings.SCHEDULER_INCIDENT_SETTLE_SECONDS = 0
    variants = ("orm", "sql") if args.compare else ("sql",)
    res = {v: {"py": [], "pg": [], "ipy": [], "ipg": []} for v in variants}
    for rnd in range(args.rounds):
        for variant in variants:
            last_event = C.sql("SELECT coalesce(max(id), 0) FROM runs_outboxevent")[0][0]
            n = finished_attempts(s, args.runs, args.failing_every)
            C.vacuum_analyze("runs_run", "runs_attempt")
            with written_by(variant):
                if args.profile and rnd == args.rounds - 1:
                    import cProfile
                    import pstats

                    prof = cProfile.Profile()
                    prof.enable()
                    passes, p, g = fold_all(backend)
                    prof.disable()
                    pstats.Stats(prof).sort_stats("tottime").print_stats(30)
                else:
                    passes, p, g = fold_all(backend)
                events = C.sql("SELECT count(*) FROM runs_outboxevent WHERE id > %s", [last_event])[0][0]
                ipasses, ip, ig = evaluate_all(backend, last_event)
            r = res[variant]
            for k, v in (("py", p), ("pg", g), ("ipy", ip), ("ipg", ig)):
                r[k].append(v / n * 1e6)
            print(f"  [#{rnd + 1}] {variant}: {n} attempts folded in {passes} passes: Python {r['py'][-1]:.0f} µs, "
                  f"PostgreSQL {r['pg'][-1]:.0f} µs per attempt; their {events} events evaluated in {ipasses} passes: "
                  f"Python {r['ipy'][-1]:.0f} µs, PostgreSQL {r['ipg'][-1]:.0f} µs per run", flush=True)
    print(f"\n{args.runs} schedules with a full sparkline, one run each, every {args.failing_every}th failed, median "
          f"of {args.rounds}{' interleaved rounds' if args.compare else ''}:")
    for variant in variants:
        r = res[variant]
        print(f"  {variant}: activity fold  Python {C.spread(r['py'], 0)} µs, PostgreSQL {C.spread(r['pg'], 0)} µs "
              f"per attempt\n  {variant}: incidents      Python {C.spread(r['ipy'], 0)} µs, PostgreSQL "
              f"{C.spread(r['ipg'], 0)} µs per run")
    if args.compare:
        m = {v: {k: C.median(x) for k, x in res[v].items()} for v in variants}
        fold = (m["sql"]["py"] + m["sql"]["pg"]) / (m["orm"]["py"] + m["orm"]["pg"])
        inc = (m["sql"]["ipy"] + m["sql"]["ipg"]) / (m["orm"]["ipy"] + m["orm"]["ipg"])
        print(f"  sql / orm, Python + PostgreSQL CPU: activity fold {fold:.2f}x, incidents {inc:.2f}x")


@contextmanager
def written_by(variant: str):
    """'sql': the code as it is. 'orm': the activity loop's writes by the ORM's read-modify-write
    on PostgreSQL too (SQLite's path; what the loop did before its SQL upserts) and the incidents
    loop's reads by key as `IN` lists (what `__anyof` replaced)."""
    from django.db.models.lookups import In

    from dispatch import activity_store as st
    from scheduler_project.foundation.anyof import AnyOf

    if variant == "sql":
        yield
        return
    names = ("_schedule_batches_sql", "_target_minutes_sql", "_retry_cost_hours_sql")
    saved = {n: getattr(st, n) for n in names} | {"anyof": AnyOf.as_postgresql}
    for n in names:
        setattr(st, n, getattr(st, n.replace("_sql", "_orm")))
    AnyOf.as_postgresql = In.as_sql
    try:
        yield
    finally:
        for n in names:
            setattr(st, n, saved[n])
        AnyOf.as_postgresql = saved["anyof"]

if __name__ == "__main__":
    main()
