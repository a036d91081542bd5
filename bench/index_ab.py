"""What an index costs the dispatch hot path: claim + complete (runs.queue, in this process, no
HTTP, as bench/queue_profile.py runs them) over N ready runs, with the indexes that a migration
dropped made again ("before": runs/0011's two, or runs/0012's outbox_published_idx) and without
them ("after", the schema as migrated), in interleaved rounds in one command. Printed per round
and as medians: the PostgreSQL backend's CPU per run (from /proc), wall time per run, WAL per run.

    .venv/bin/python bench/index_ab.py [--runs 20000] [--batch 400] [--rounds 3] [--dropped-by 0012]

Database: scheduler_bench_index_ab (dropped and made again).
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402

# The indexes each migration dropped, as they were (runs/0007 made them on the partitioned tables).
DROPPED_BY = {
    "0011": [
        ("ALTER TABLE runs_outboxevent ADD CONSTRAINT outbox_event_id_unique UNIQUE (event_id, created_at)",
         "ALTER TABLE runs_outboxevent DROP CONSTRAINT outbox_event_id_unique"),
        ("CREATE INDEX runs_occurrence_version_id_af599233 ON runs_occurrence (version_id)",
         "DROP INDEX runs_occurrence_version_id_af599233"),
    ],
    "0012": [
        ("CREATE INDEX outbox_published_idx ON runs_outboxevent (published_at) WHERE published_at IS NOT NULL",
         "DROP INDEX outbox_published_idx"),
    ],
}


def one_round(s, n, batch, backend):
    from runs import queue
    from runs.decisions import Holding

    C.truncate_runs()
    C.load_due_runs(s, n, "date_trunc('second', now()) - interval '1 second'")
    C.vacuum_analyze("runs_run", "runs_occurrence", "runs_outboxevent", "runs_attempt")
    wal0 = C.sql("SELECT pg_current_wal_lsn()")[0][0]
    pg0, t0, done = C.proc_cpu(backend), time.perf_counter(), 0
    while True:
        claims = queue.claim("ab", batch, holding=Holding(batch, 1.0, 1.0))
        if not claims:
            break
        queue.complete([queue.Result(claimed=c, outcome="succeeded", http_status=200, latency_ms=1,
                                     remote_address="127.0.0.1", response_excerpt='{"ok":true}') for c in claims])
        done += len(claims)
    pg, wall = C.proc_cpu(backend) - pg0, time.perf_counter() - t0
    wal = float(C.sql("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", [wal0])[0][0])
    return {"done": done, "pg_us": pg / done * 1e6, "wall_us": wall / done * 1e6, "wal": wal / done}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20_000)
    ap.add_argument("--batch", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dropped-by", choices=sorted(DROPPED_BY), default="0012",
                    help="whose dropped indexes 'before' makes again")
    ap.add_argument("--database", default="scheduler_bench_index_ab")
    args = ap.parse_args()
    before = DROPPED_BY[args.dropped_by]

    print(C.machine_line(), flush=True)
    s = C.fresh_idle_schedules(args.database, "ab", args.runs)
    backend = C.sql("SELECT pg_backend_pid()")[0][0]
    res = {"before": [], "after": []}
    for rnd in range(args.rounds):
        for variant in ("before", "after"):
            if variant == "before":
                for make, _ in before:
                    C.sql(make, fetch=False)
            r = one_round(s, args.runs, args.batch, backend)
            if variant == "before":
                for _, drop in before:
                    C.sql(drop, fetch=False)
            res[variant].append(r)
            print(f"  [#{rnd + 1}] {variant:6s} {r['done']}/{args.runs} succeeded: PostgreSQL {r['pg_us']:.0f} µs/run, "
                  f"wall {r['wall_us']:.0f} µs/run, WAL {r['wal']:.0f} B/run", flush=True)
    print(f"\nclaim + complete in batches of {args.batch}, one connection, {args.runs} runs, median of {args.rounds} "
          f"interleaved rounds; before = with the indexes runs/{args.dropped_by} dropped:")
    for variant in ("before", "after"):
        rs = res[variant]
        print(f"  {variant:6s} PostgreSQL {C.spread([r['pg_us'] for r in rs], 0)} µs/run, WAL "
              f"{C.spread([r['wal'] for r in rs], 0)} B/run, wall {C.spread([r['wall_us'] for r in rs], 0)} µs/run")
    b, a = (C.median([r["pg_us"] for r in res[v]]) for v in ("before", "after"))
    print(f"  after / before: PostgreSQL CPU per run {a / b:.2f}x")


if __name__ == "__main__":
    main()
