"""Where a worker's database thread spends its time: runs.queue.claim and runs.queue.complete in
this process, without HTTP: wall time, this process's CPU, and the CPU of its PostgreSQL backend
(from /proc), per run and per phase.

    .venv/bin/python bench/queue_profile.py [--runs 20000] [--batch 200] [--repeats 3]

N ready runs due now are bulk-loaded; then claim(batch) -> a succeeded Result per claim (as the
worker makes them) -> complete(results), until none is left. Printed per phase: ms per batch,
µs per run of wall time, of Python CPU and of PostgreSQL CPU, queries per batch through Django's
cursor (the PostgreSQL fast path's own statements are not among them); and the end-to-end ceiling of one
database thread (runs/s through claim + complete alone). The worker in dispatch/worker.py does
exactly these two calls per batch on its one database thread, so this ceiling bounds a worker
process whatever its HTTP concurrency.

Database: scheduler_bench_queue (dropped and made again).
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402


class QueryCounter:
    """A Django execute_wrapper counting the statements that go through Django's cursor."""

    def __init__(self):
        self.queries = 0

    def __call__(self, execute, sql, params, many, context):
        self.queries += 1
        return execute(sql, params, many, context)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20_000)
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--database", default="scheduler_bench_queue")
    args = ap.parse_args()

    print(C.machine_line(), flush=True)
    C.setup_database(args.database)
    from django.db import connection

    from runs import queue
    from runs.decisions import Holding

    tenant = C.load_tenant("prof", "http://127.0.0.1:9/")
    s = C.load_schedules("qp", tenant, args.runs, target_url="http://127.0.0.1:9/run", next_run_at="now() + interval '10 days'")
    connection.ensure_connection()
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        backend = cur.fetchone()[0]
    rows = []
    for rep in range(args.repeats):
        C.truncate_runs()
        C.load_due_runs(s, args.runs, "date_trunc('second', now()) - interval '1 second'")
        C.vacuum_analyze("runs_run", "runs_occurrence", "runs_outboxevent", "runs_attempt")
        ph = {k: {"wall": 0.0, "q": 0, "cpu": 0.0, "pg": 0.0} for k in ("claim", "complete")}
        batches = 0
        t_all = time.perf_counter()
        while True:
            for name in ("claim", "complete"):
                timer = QueryCounter()
                t, cpu, pg = time.perf_counter(), time.process_time(), C.proc_cpu(backend)
                with connection.execute_wrapper(timer):
                    if name == "claim":
                        # The claim of a worker with `batch` slots and the default shares off:
                        # one tenant's runs fill each batch, as before the shares existed.
                        claims = queue.claim("prof", args.batch, holding=Holding(args.batch, 1.0, 1.0))
                        out = claims
                    else:
                        out = queue.complete([
                            queue.Result(claimed=c, outcome="succeeded", http_status=200, latency_ms=1,
                                         remote_address="127.0.0.1", response_excerpt='{"ok":true}')
                            for c in claims])
                ph[name]["wall"] += time.perf_counter() - t
                ph[name]["cpu"] += time.process_time() - cpu
                ph[name]["pg"] += C.proc_cpu(backend) - pg
                ph[name]["q"] += timer.queries
                if name == "claim" and not out:
                    break
            if not claims:
                break
            batches += 1
        total = time.perf_counter() - t_all
        done = C.sql("SELECT count(*) FROM runs_run WHERE state = 'succeeded'")[0][0]
        rows.append({"ph": ph, "batches": batches, "total": total, "done": done})
        print(f"  [#{rep + 1}] {done}/{args.runs} succeeded in {batches} batches, {total:.2f}s: "
              + "; ".join(f"{k} {v['wall'] / batches * 1000:.1f} ms/batch ({v['q'] / batches:.1f} Django queries/batch)"
                            for k, v in ph.items()), flush=True)

    print(f"\nqueue profile: claim + complete in batches of {args.batch}, one connection, no HTTP, median of {args.repeats}:")
    for name in ("claim", "complete"):
        per_run = [r["ph"][name]["wall"] / r["done"] * 1e6 for r in rows]
        def med(key):
            return C.median([r["ph"][name][key] / r["done"] * 1e6 for r in rows])
        print(f"  {name:9s} wall {C.fmt(C.median(per_run), ' µs/run', 0)}, Python CPU {C.fmt(med('cpu'), ' µs/run', 0)}, "
              f"PostgreSQL CPU {C.fmt(med('pg'), ' µs/run', 0)}, "
              f"{C.fmt(C.median([r['ph'][name]['q'] / r['batches'] for r in rows]), ' Django queries/batch', 1)}")
    print(f"  ceiling of one database thread: {C.fmt(C.median([r['done'] / r['total'] for r in rows]), ' runs/s', 0)} "
          f"(claim + complete only)")


if __name__ == "__main__":
    main()
