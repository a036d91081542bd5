"""The raw-SQL floor of a PostgreSQL queue: claim + complete in batches, nothing else, measured in
the same command as ours (bench/peers.py, bench/burst.py).

A job table with what any durable queue keeps per job while it is queued (state, due time, lease,
attempts, its outcome), one partial index on the due ready rows, and two statements:

    claim:     lock up to B due ready rows (SKIP LOCKED), mark them leased, return their ids
    complete:  mark those ids succeeded with their finish time

each its own transaction (autocommit), on `conns` connections in as many processes, until none is
left. No HTTP, no history, no events: the cost of the queue alone, written as tightly as SQL
allows. Throughput = N / (first claim -> last complete); the PostgreSQL backends' CPU is read from
/proc before their connections close.
"""

from __future__ import annotations

import multiprocessing
import time

FLOOR_TABLE = """
-- name: FloorTable
DROP TABLE IF EXISTS bench_floor_job;
CREATE TABLE bench_floor_job (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    state text NOT NULL,
    run_at timestamptz NOT NULL,
    lease_until timestamptz,
    attempts int NOT NULL DEFAULT 0,
    finished_at timestamptz
);
CREATE INDEX bench_floor_ready_idx ON bench_floor_job (run_at) WHERE state = 'ready';
"""

FLOOR_LOAD = """
-- name: FloorLoad
INSERT INTO bench_floor_job (state, run_at) SELECT 'ready', now() - interval '1 second' FROM generate_series(1, %s)
"""

FLOOR_CLAIM = """
-- name: FloorClaim
UPDATE bench_floor_job SET state = 'leased', lease_until = now() + interval '5 minutes', attempts = attempts + 1
WHERE id = ANY(ARRAY(SELECT id FROM bench_floor_job WHERE state = 'ready' AND run_at <= now()
                     ORDER BY run_at LIMIT %s FOR UPDATE SKIP LOCKED))
RETURNING id
"""

FLOOR_COMPLETE = """
-- name: FloorComplete
UPDATE bench_floor_job SET state = 'succeeded', finished_at = now(), lease_until = NULL
WHERE id = ANY(%s) AND state = 'leased'
"""


def _proc_cpu(pid) -> float:
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    import os

    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def _worker(dsn, batch, start, out):
    import psycopg

    with psycopg.connect(dsn, autocommit=True, application_name="peers-floor") as c:
        backend = c.execute("SELECT pg_backend_pid()").fetchone()[0]
        cpu0 = _proc_cpu(backend)
        start.wait()
        first = last = None
        done = 0
        while True:
            ids = [r[0] for r in c.execute(FLOOR_CLAIM, [batch], prepare=True).fetchall()]
            if not ids:
                break
            if first is None:
                first = time.time()
            c.execute(FLOOR_COMPLETE, [ids], prepare=True)
            done += len(ids)
            last = time.time()
        out.put((first, last, done, _proc_cpu(backend) - cpu0))


def floor_round(dsn: str, n: int, batch: int, conns: int = 2) -> dict:
    """One round of the floor: N ready jobs, `conns` processes claiming and completing in batches
    of `batch`. Returns jobs/s and the PostgreSQL CPU per job (µs)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(FLOOR_TABLE)
        c.execute(FLOOR_LOAD, [n])
        c.execute("VACUUM (ANALYZE) bench_floor_job")
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(dsn, batch, start, out)) for _ in range(conns)]
    for p in procs:
        p.start()
    time.sleep(0.5)
    start.set()
    got = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(10)
    firsts = [g[0] for g in got if g[0] is not None]
    span = max(g[1] for g in got if g[1] is not None) - min(firsts)
    done = sum(g[2] for g in got)
    pg = sum(g[3] for g in got)
    return {"done": done, "span": span, "rate": done / span, "pg_us": pg / max(done, 1) * 1e6}


if __name__ == "__main__":
    import sys

    dsn, n, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    print(floor_round(dsn, n, batch))
