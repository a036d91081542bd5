"""Fairness: tenant A with 50,000 due runs and tenant B with 10, all due at the same instant,
dispatched by real `manage.py work` processes to a local target answering 200 at once.

    .venv/bin/python bench/fairness.py [--big 50000 --small 10] [--repeats 3] [--config 2x256x200]

B's runs are loaded after A's (the worst case for a queue that takes ties in insertion order), so
the figure shows what claim does for a small tenant stuck behind a big one. Lag =
first_started_at - scheduled_time, from the database; reported for B and for A (p50/p99/max).
Goal (issue 7): B's p99 lag <= 2 s. This measures whatever runs.queue.claim does today.

Database: scheduler_bench_fairness (dropped and made again).
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402


def one_run(args, cfg, big, small, target, tag):
    C.truncate_runs()
    t = C.sql("SELECT date_trunc('second', statement_timestamp()) + make_interval(secs => %s)", [args.lead])[0][0]
    at = f"'{t.isoformat()}'::timestamptz"
    C.load_due_runs(big, args.big, at)  # A first: B's runs come last among equal due times
    C.load_due_runs(small, args.small, at)
    C.vacuum_analyze("runs_run", "runs_occurrence", "runs_outboxevent", "runs_attempt")
    procs = C.Procs(args.database, {"SCHEDULER_POLL_SECONDS": args.poll})
    procs.start_workers(cfg, tag=tag)
    procs.wait_connected("scheduler-work", cfg.workers)
    now = C.db_now()
    if now >= t:
        procs.stop()
        raise SystemExit("loading and starting took past the instant: raise --lead")
    time.sleep(max(0, (t - now).total_seconds() - 0.05))
    done = C.wait_drained(procs, timeout=args.timeout)
    procs.stop()
    a = C.run_outcome(t, "tenant_id = %s", [big.tenant.id])
    b = C.run_outcome(t, "tenant_id = %s", [small.tenant.id])
    return {"A": a, "B": b, "done": done}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--big", type=int, default=50_000)
    ap.add_argument("--small", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--config", default="2x256x200", help="WORKERSxCONCURRENCYxBATCH")
    ap.add_argument("--poll", type=float, default=1.0)
    ap.add_argument("--lead", type=float, default=15.0)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--database", default="scheduler_bench_fairness")
    args = ap.parse_args()
    cfg = C.WorkerConfig.parse(args.config)

    print(C.machine_line(), flush=True)
    C.ensure_out_dir()
    C.setup_database(args.database)
    target = C.Target(1)
    try:
        ta = C.load_tenant("tenant-a", target.prefix)
        tb = C.load_tenant("tenant-b", target.prefix)
        far = "now() + interval '10 days'"
        big = C.load_schedules("fa", ta, args.big, target_url=target.url, next_run_at=far)
        small = C.load_schedules("fb", tb, args.small, target_url=target.url, next_run_at=far)
        C.vacuum_analyze("schedules_schedule", "schedules_scheduleversion")
        rows = []
        for rep in range(args.repeats):
            r = one_run(args, cfg, big, small, target, tag=f"fair{rep}-")
            rows.append(r)
            print(f"  [#{rep + 1}] B: lag p50 {C.fmt(r['B']['lag_p50'], 's', 2)} p99 {C.fmt(r['B']['lag_p99'], 's', 2)} "
                  f"max {C.fmt(r['B']['lag_max'], 's', 2)} ({r['B']['succeeded']}/{r['B']['runs']} succeeded); "
                  f"A: lag p50 {C.fmt(r['A']['lag_p50'], 's', 2)} p99 {C.fmt(r['A']['lag_p99'], 's', 2)}, "
                  f"all A succeeded after {C.fmt(r['A']['all_succeeded'], 's', 2)}" + ("" if r["done"] else " [TIMED OUT]"),
                  flush=True)
        print(f"\nfairness: tenant A {args.big} due runs, tenant B {args.small} (loaded after A), same instant; "
              f"{cfg}, median of {args.repeats}:")
        for who in ("B", "A"):
            print(f"  tenant {who}: lag p50 {C.spread([r[who]['lag_p50'] for r in rows], 3, 's')}")
            print(f"            lag p99 {C.spread([r[who]['lag_p99'] for r in rows], 3, 's')}")
            print(f"            lag max {C.spread([r[who]['lag_max'] for r in rows], 3, 's')}")
        p99 = C.median([r["B"]["lag_p99"] for r in rows])
        print(f"goal tenant B p99 lag <= 2 s: {'met' if p99 is not None and p99 <= 2 else 'NOT met'} ({C.fmt(p99, 's', 2)})")
    finally:
        target.close()


if __name__ == "__main__":
    main()
