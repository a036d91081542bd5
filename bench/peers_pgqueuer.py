"""pgqueuer's side of bench/peers.py. Runs ONLY in bench/.venv-pgqueuer (pgqueuer is not a
dependency of the project); bench/peers.py calls it, it is not meant to be run by hand.

    python peers_pgqueuer.py DSN setup                      install pgqueuer's schema (fresh)
    python peers_pgqueuer.py DSN enqueue N                  enqueue N jobs (batches of 1000)
    python peers_pgqueuer.py DSN work KIND URL BATCH MANAGERS NAME
                                                            work until the queue is empty

KIND is `noop` (the job returns at once) or `http` (the job POSTs {} to URL through one aiohttp
session per process, as our worker's call does, and fails on a status >= 400; the session's pool
is aiohttp's default 100 connections, PEERS_HTTP_LIMIT to change it, 0 for no limit).
PEERS_MAX_TASKS sets pgqueuer's max_concurrent_tasks per queue manager (default: none). A worker process
runs MANAGERS queue managers in one event loop (uvloop when installed), each on its own asyncpg
connection, in drain mode (each returns once the queue is empty), dequeuing BATCH jobs at a time.

`work` connects, prints `ready` and waits for a line on stdin before it starts (so that
bench/peers.py can read its PostgreSQL backends' CPU before and after), then prints
`first=<epoch> last=<epoch> jobs=<n>` (its first job's start and its last job's end, on the
machine's clock) and waits for another line before closing its connections. The other modes
print `seconds=<elapsed>`. Every connection is named `peers-pgqueuer` (application_name).
"""

import asyncio
import os
import sys
import time
from datetime import timedelta

import asyncpg
from pgqueuer import AsyncpgDriver, Queries, QueueManager
from pgqueuer.domain.types import QueueExecutionMode

dsn, mode, *rest = sys.argv[1:]
APP = {"application_name": "peers-pgqueuer"}


async def connect():
    return await asyncpg.connect(dsn, server_settings=APP)


async def work(kind: str, url: str, batch: int, managers: int) -> None:
    import aiohttp

    seen = {"first": None, "last": None, "jobs": 0}
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=int(os.environ.get("PEERS_HTTP_LIMIT", "100")))) if kind == "http" else None
    timeout = aiohttp.ClientTimeout(total=30)

    async def job(_job) -> None:
        if seen["first"] is None:
            seen["first"] = time.time()
        if session is not None:
            async with session.post(url, json={}, timeout=timeout) as resp:
                await resp.read()
                resp.raise_for_status()
        seen["jobs"] += 1
        seen["last"] = time.time()

    conns = [await connect() for _ in range(managers)]
    qms = []
    for conn in conns:
        qm = QueueManager(Queries(AsyncpgDriver(conn)))
        qm.entrypoint("job")(job)
        qms.append(qm)
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    await asyncio.gather(*(qm.run(batch_size=batch, mode=QueueExecutionMode.drain,
                                  dequeue_timeout=timedelta(seconds=1),
                                  max_concurrent_tasks=int(os.environ.get("PEERS_MAX_TASKS", "0")) or None,
                                  log_aggregation_interval=timedelta(0)) for qm in qms))
    print(f"first={seen['first']} last={seen['last']} jobs={seen['jobs']}", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    if session is not None:
        await session.close()
    for conn in conns:
        await conn.close()


async def main():
    t = time.perf_counter()
    if mode == "work":
        await work(rest[0], rest[1], int(rest[2]), int(rest[3]))
        return
    conn = await connect()
    q = Queries(AsyncpgDriver(conn))
    if mode == "setup":
        try:
            await q.uninstall()
        except Exception:  # nothing installed yet
            pass
        await q.install()
    elif mode == "enqueue":
        n = int(rest[0])
        for i in range(0, n, 1000):
            k = min(1000, n - i)
            await q.enqueue(["job"] * k, [None] * k, [0] * k)
    else:
        raise SystemExit(f"unknown mode {mode}")
    await conn.close()
    print(f"seconds={time.perf_counter() - t:.6f}", flush=True)


try:
    import uvloop

    uvloop.install()
except ImportError:
    pass
asyncio.run(main())
