"""Scanner: the time of one scanner pass over 1,000,000 schedules, with none due and with 1% due.

    .venv/bin/python bench/scanner.py [--schedules 1000000] [--repeats 20] [--due-repeats 3] [--batch 500] [--processes 1]

Schedules are bulk-loaded (rate(1 minute), each with its own anchor, so the parsed-rule cache is no
help, as with a real fleet). The passes run in this process against the bench database through
dispatch.loops.scan_step (runs.queue.materialise_due), timed with perf_counter:

- none due: every next_run_at is a day or more ahead; time per pass (median, p90 of --repeats).
- 1% due: every 100th schedule has next_run_at one second ago (anchor one period before, so
  exactly one occurrence is due); the run side is emptied, the schedules are reset and vacuumed,
  and the parsed-rule cache is cleared before each repeat. Reported: time per batch of --batch
  schedules, and total time to materialise all 10,000 runs. With `--processes P`, P forked scanner
  processes drain together (each locks what the others have not, SKIP LOCKED, as several `scan`
  copies do); reported: the wall time until all have stopped.

The due query itself (as Django sends it, captured during a pass) is also run under EXPLAIN
(ANALYZE, BUFFERS) in a rolled-back transaction, and its plan and execution time are printed.
Goal (issue 7): a pass with none due <= 50 ms.

Database: scheduler_bench_scanner (dropped and made again).
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402


def capture_due_query(step):
    """Run one step and return the SQL of its due-schedules query, parameters inlined."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as ctx:
        step()
    for q in ctx.captured_queries:
        s = q["sql"]
        if "schedules_schedule" in s and "FOR UPDATE" in s and s.lstrip().upper().startswith("SELECT"):
            return s, len(ctx.captured_queries)
    return None, len(ctx.captured_queries)


def explain(query: str):
    from django.db import connection, transaction

    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + query)
            lines = [r[0] for r in cur.fetchall()]
        transaction.set_rollback(True)
    exec_ms = next((float(l.split(":")[1].split()[0]) for l in lines if l.startswith("Execution Time")), None)
    return lines, exec_ms


def reset_due(due_at_sql: str, period: int = 60):
    """Empty the run side and make every 100th schedule due again (one occurrence each)."""
    C.truncate_runs()
    C.sql(
        f"""UPDATE schedules_schedule SET next_run_at = {due_at_sql}, anchor_at = {due_at_sql} - make_interval(secs => {period}),
               status = 'active', completed_at = NULL, last_error = ''
            WHERE name LIKE 'due-%%'""",
        fetch=False,
    )
    C.vacuum_analyze("schedules_schedule")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--schedules", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=20, help="timed passes with none due")
    ap.add_argument("--due-repeats", type=int, default=3, help="timed drains with 1%% due")
    ap.add_argument("--batch", type=int, default=500, help="schedules per scanner transaction (SCHEDULER_SCAN_BATCH default)")
    ap.add_argument("--period", type=int, default=60,
                    help="the schedules' rate in seconds (whole minutes): a drain slower than this makes the due "
                         "schedules due again (the 10,000,000 form uses 3600)")
    ap.add_argument("--reuse", action="store_true",
                    help="keep the database when it already holds --schedules schedules from an earlier run (loading "
                         "10,000,000 takes ~15 min)")
    ap.add_argument("--processes", type=int, default=1,
                    help="scanner processes draining the 1%% due together (each locks what the others have not, "
                         "as several `scan` copies without shards do); 1: in this process")
    ap.add_argument("--database", default="scheduler_bench_scanner")
    args = ap.parse_args()

    print(C.machine_line(), flush=True)
    C.setup_database(args.database, fresh=not args.reuse)

    t0 = time.perf_counter()
    expression = f"rate({args.period // 60} minute{'s' if args.period > 60 else ''})"
    if args.reuse and C.sql("SELECT count(*) FROM schedules_schedule")[0][0] == args.schedules:
        # The schedules of an earlier run of this bench: the runs go, the 1% take this run's
        # period and are put a day ahead again, so that nothing is due.
        C.truncate_runs()
        C.sql("UPDATE schedules_scheduleversion SET expression = %s WHERE id IN "
              "(SELECT current_id FROM schedules_schedule WHERE name LIKE 'due-%%')", [expression], fetch=False)
        C.sql("UPDATE schedules_schedule SET next_run_at = date_trunc('second', now()) + interval '1 day' "
              "WHERE name LIKE 'due-%%'", fetch=False)
        C.vacuum_analyze("schedules_schedule", "schedules_scheduleversion")
        due_count = C.sql("SELECT count(*) FROM schedules_schedule WHERE name LIKE 'due-%%'")[0][0]
        print(f"reused the {args.schedules} schedules of the database ({due_count} marked for the 1% case, now "
              f"{expression}) in {time.perf_counter() - t0:.1f}s", flush=True)
        s = C.ScheduleSet("sc", None, args.schedules, 0)
    else:
        s, due_count = load(args, expression, t0)
    run_passes(args, s, due_count)


def load(args, expression, t0):
    tenant = C.load_tenant("scan", "http://127.0.0.1:9/")
    # n mod 100 = 0 -> the 1% that will be made due ("due-<n>"); all start a day or more ahead.
    s = C.load_schedules("sc", tenant, args.schedules, target_url="http://127.0.0.1:9/run",
                         expression=expression,
                         next_run_at="date_trunc('second', now()) + interval '1 day' + make_interval(secs => mod(n, 86400))",
                         anchor_at=f"date_trunc('second', now()) + make_interval(secs => mod(n, 86400) - {args.period})")
    C.sql("UPDATE schedules_schedule SET name = 'due-' || name WHERE mod(current_id, 100) = 0", fetch=False)
    C.vacuum_analyze("schedules_schedule", "schedules_scheduleversion")
    due_count = C.sql("SELECT count(*) FROM schedules_schedule WHERE name LIKE 'due-%%'")[0][0]
    size = C.sql("SELECT pg_size_pretty(pg_total_relation_size('schedules_schedule'))")[0][0]
    print(f"loaded {s.count} schedules ({due_count} marked for the 1% case) in {time.perf_counter() - t0:.1f}s; "
          f"schedules table {size} with indexes", flush=True)
    return s, due_count


def drain_child(batch: int) -> None:
    """A scanner process of the 1%-due drain: passes until one finds nothing more to lock."""
    from django.db import connections

    from dispatch.loops import scan_step

    connections.close_all()  # the parent's connection is not this process's to use
    while scan_step(batch=batch):
        pass
    connections.close_all()


def drain_in_processes(args) -> float:
    """--processes scanner processes draining together; the wall time until all have stopped."""
    import multiprocessing

    from django.db import connections

    connections.close_all()
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=drain_child, args=(args.batch,)) for _ in range(args.processes)]
    t = time.perf_counter()
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    total = time.perf_counter() - t
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return total


def run_passes(args, s, due_count):
    from dispatch.loops import scan_step
    from schedules.services import _rule

    step = lambda: scan_step(batch=args.batch)  # noqa: E731
    # --- none due
    step()  # warm the connection and caches
    query, nq = capture_due_query(step)
    times = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        more = step()
        times.append((time.perf_counter() - t) * 1000)
        assert not more
    made = C.sql("SELECT count(*) FROM runs_run")[0][0]
    plan, exec_ms = explain(query) if query else ([], None)
    print(f"\nnone due ({s.count} schedules): one pass (scan_step, {nq} queries) median {C.fmt(C.median(times), ' ms', 2)}, "
          f"p90 {C.fmt(C.percentile(times, 90), ' ms', 2)}, min {C.fmt(min(times), ' ms', 2)} over {args.repeats}; runs made {made}")
    print(f"  due query EXPLAIN ANALYZE execution time {C.fmt(exec_ms, ' ms', 3)}; plan:")
    for line in plan:
        print("    " + line)
    med = C.median(times)
    print(f"goal none-due pass <= 50 ms: {'met' if med is not None and med <= 50 else 'NOT met'} ({C.fmt(med, ' ms', 2)})", flush=True)

    # --- 1% due
    due_sql = "date_trunc('second', statement_timestamp()) - interval '1 second'"
    # The due query with 1% due, as sent by the first pass (its `now` inlined), then explained
    # while the other 99% of the due schedules are still due. Not timed.
    reset_due(due_sql, args.period)
    query_due, _ = capture_due_query(step)
    plan_due, exec_due = explain(query_due) if query_due else ([], None)
    drains = []
    for rep in range(args.due_repeats):
        reset_due(due_sql, args.period)
        _rule.cache_clear()
        if args.processes > 1:
            total = drain_in_processes(args)
            runs = C.sql("SELECT count(*) FROM runs_run")[0][0]
            events = C.sql("SELECT count(*) FROM runs_outboxevent")[0][0]
            drains.append({"total": total, "batch_ms": None, "batches": None, "runs": runs, "events": events})
            print(f"  [1% due #{rep + 1}] {runs} runs ({events} events) by {args.processes} scanner processes in "
                  f"{total:.2f}s, {runs / total:.0f} runs/s", flush=True)
            continue
        batches = []
        t = time.perf_counter()
        while True:
            b = time.perf_counter()
            more = step()
            batches.append((time.perf_counter() - b) * 1000)
            if not more:
                break
        total = time.perf_counter() - t
        runs = C.sql("SELECT count(*) FROM runs_run")[0][0]
        events = C.sql("SELECT count(*) FROM runs_outboxevent")[0][0]
        full = batches[:-1] or batches
        drains.append({"total": total, "batch_ms": C.median(full), "batches": len(batches), "runs": runs, "events": events})
        print(f"  [1% due #{rep + 1}] {runs} runs ({events} events) in {len(batches)} passes, {total:.2f}s total, "
              f"{runs / total:.0f} runs/s; per full batch of {args.batch}: median {C.fmt(C.median(full), ' ms', 1)}, "
              f"max {C.fmt(max(full), ' ms', 1)}", flush=True)
    print(f"\n1% due ({due_count} of {s.count} schedules), batch {args.batch}, {args.processes} scanner "
          f"process{'es' if args.processes > 1 else ''}, median of {args.due_repeats}:")
    if args.processes == 1:
        print(f"  time per batch      {C.spread([d['batch_ms'] for d in drains], 1, ' ms')}")
    print(f"  total (all {due_count}) {C.spread([d['total'] for d in drains], 2, ' s')}")
    print(f"  runs/s materialised {C.fmt(C.median([d['runs'] / d['total'] for d in drains]), '', 0)}")
    ok = all(d["runs"] == due_count for d in drains)
    print(f"  completeness        {'OK: one run per due schedule' if ok else 'MISMATCH'}")
    print(f"  due query EXPLAIN ANALYZE with 1% due (LIMIT {args.batch}): execution time {C.fmt(exec_due, ' ms', 3)}; plan:")
    for line in plan_due:
        print("    " + line)


if __name__ == "__main__":
    main()
