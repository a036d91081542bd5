"""Reconciler misfire pass over a backlog: what one `skip_unclaimed_misfires()` pass costs when
N unclaimed runs are overdue (all workers down, or a burst still being worked off).

    .venv/bin/python bench/reconciler.py [--runs 200000] [--repeats 5]

Two cases, each loaded fresh: the backlog is overdue but within its misfire grace (eligible 10 s
ago, grace 60 s: a burst being dispatched; nothing to skip), and the backlog was missed (eligible
2 hours ago; each schedule's one run is its newest, so run_once keeps it: the pass ranks and
skips nothing). Then the same missed backlog under policy `skip`, drained the way the reconcile
loop does it (batch 500, straight back while a pass reports more): how fast it is skipped.
Printed: the median time of one pass, and the skip rate. The reconciler runs this every
SCHEDULER_RECONCILE_SECONDS (5 s) beside the workers, so its cost comes out of theirs.

Database: scheduler_bench_reconciler (dropped and made again).
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cap", type=float, default=120.0, help="seconds the skip-policy drain may take")
    ap.add_argument("--database", default="scheduler_bench_reconciler")
    args = ap.parse_args()
    print(C.machine_line(), flush=True)
    s = C.fresh_idle_schedules(args.database, "rec", args.runs)
    from runs.queue import skip_unclaimed_misfires

    results = {}
    for case, ago in (("within grace", "10 seconds"), ("missed", "2 hours")):
        C.truncate_runs()
        C.load_due_runs(s, args.runs, f"date_trunc('second', now()) - interval '{ago}'")
        C.vacuum_analyze("runs_run", "runs_occurrence", "runs_outboxevent", "runs_attempt")
        times, skipped = [], 0
        for _ in range(args.repeats):
            t = time.perf_counter()
            skipped += skip_unclaimed_misfires()
            times.append(time.perf_counter() - t)
        results[case] = (C.median(times), times, skipped)
        print(f"  [{case}] {args.runs} unclaimed overdue runs: one pass {C.median(times) * 1000:.1f} ms "
              f"(passes: {', '.join(f'{x * 1000:.1f}' for x in times)} ms), skipped {skipped}", flush=True)
    # Third case: the missed backlog's policy is `skip`, so every run must go. Passes as the
    # reconciler makes them (batch 500, straight back while a pass reports more), capped in time.
    from dispatch.loops import reconcile_step

    C.sql("UPDATE schedules_scheduleversion SET misfire_policy = 'skip'", fetch=False)
    t, passes, why = time.perf_counter(), 0, f"stopped at the {args.cap:.0f}s cap"
    while time.perf_counter() - t < args.cap:
        passes += 1
        if not reconcile_step(batch=500):
            why = "the step reported no more work, so the loop would sleep SCHEDULER_RECONCILE_SECONDS"
            break
    elapsed = time.perf_counter() - t
    gone = C.sql("SELECT count(*) FROM runs_run WHERE state = 'skipped'")[0][0]
    print(f"  [missed, skip policy] {gone} of {args.runs} skipped in {elapsed:.1f}s over {passes} reconcile passes", flush=True)
    print(f"\nreconciler misfire pass over {args.runs} unclaimed overdue runs, median of {args.repeats}:")
    for case, (med, _, skipped) in results.items():
        print(f"  {case:13s} {med * 1000:.1f} ms per pass (skipped {skipped})")
    print(f"  skip policy   {gone} skipped in {elapsed:.1f}s ({gone / elapsed:.0f} runs/s) over {passes} passes"
          + ("" if gone == args.runs else f" ({why})"))


if __name__ == "__main__":
    main()
