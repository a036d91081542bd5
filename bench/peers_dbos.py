"""DBOS's side of bench/peers.py. Runs ONLY in bench/.venv-dbos (DBOS is not a dependency of the
project); bench/peers.py calls it, it is not meant to be run by hand.

    python peers_dbos.py DSN setup                           make DBOS's system schema (fresh)
    python peers_dbos.py DSN enqueue N                       enqueue N workflows on the queue
    python peers_dbos.py DSN work KIND URL CONCURRENCY NAME  work until the queue is empty

Each job is an async workflow on a DBOS queue (worker_concurrency CONCURRENCY per process, polled
every 0.1 s). KIND `noop`: the workflow returns at once; `http`: the workflow runs one step that
POSTs {} to URL through one aiohttp session per process, as our worker's call does (a step is how
DBOS makes an outside call durable: its result is recorded before the workflow goes on).

`work` prints `first=<epoch> last=<epoch> jobs=<n>` (its first workflow's start and its last one's
end, on the machine's clock) once no workflow of the queue is enqueued or pending, then waits for
a line on stdin before shutting DBOS down, so that bench/peers.py can read its PostgreSQL backends'
CPU first. The other modes print `seconds=<elapsed>`. Connections are named `peers-dbos`.
"""

import asyncio
import logging
import sys
import time

from dbos import DBOS, DBOSClient

dsn, mode, *rest = sys.argv[1:]
QUEUE = "bench"
SA_URL = dsn.replace("postgres://", "postgresql+psycopg://", 1) if dsn.startswith("postgres://") else dsn
ENGINE = {"connect_args": {"application_name": "peers-dbos"}}
seen = {"first": None, "last": None, "jobs": 0}
session = None


def config(name: str) -> dict:
    return {"name": "peers-bench", "system_database_url": SA_URL, "executor_id": name, "application_version": "bench",
            "log_level": "WARNING", "db_engine_kwargs": ENGINE, "run_admin_server": False}


@DBOS.step(name="call")
async def call(url: str) -> None:
    async with session.post(url, json={}) as resp:
        await resp.read()
        resp.raise_for_status()


@DBOS.workflow(name="job")
async def job(kind: str, url: str) -> None:
    if seen["first"] is None:
        seen["first"] = time.time()
    if kind == "http":
        await call(url)
    seen["jobs"] += 1
    seen["last"] = time.time()


def open_count() -> int:
    import psycopg

    with psycopg.connect(dsn, application_name="peers-dbos-poll") as c:
        return c.execute("SELECT count(*) FROM dbos.workflow_status WHERE queue_name = %s "
                         "AND status IN ('ENQUEUED', 'PENDING')", [QUEUE]).fetchone()[0]


async def work(kind: str, url: str, concurrency: int, name: str) -> None:
    global session
    import aiohttp

    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=30))
    DBOS(config=config(name))
    DBOS.launch()
    await DBOS.register_queue_async(QUEUE, worker_concurrency=concurrency, polling_interval_sec=0.1,
                                    on_conflict="always_update")
    loop = asyncio.get_running_loop()
    while await loop.run_in_executor(None, open_count):
        await asyncio.sleep(0.25)
    print(f"first={seen['first']} last={seen['last']} jobs={seen['jobs']}", flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)
    await session.close()
    DBOS.destroy()


def main():
    logging.basicConfig(level=logging.WARNING)
    t = time.perf_counter()
    if mode == "work":
        asyncio.run(work(rest[0], rest[1], int(rest[2]), rest[3]))
        return
    if mode == "setup":
        import psycopg

        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("DROP SCHEMA IF EXISTS dbos CASCADE")
        DBOS(config=config("setup"))
        DBOS.launch()
        DBOS.destroy()
    elif mode == "enqueue":
        n, kind, url = int(rest[0]), rest[1], rest[2]
        client = DBOSClient(system_database_url=SA_URL)
        options = {"queue_name": QUEUE, "workflow_name": "job", "app_version": "bench"}
        for _ in range(n):
            client.enqueue(options, kind, url)
        client.destroy()
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(f"seconds={time.perf_counter() - t:.6f}", flush=True)


main()
