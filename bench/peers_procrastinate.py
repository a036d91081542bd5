"""Procrastinate's side of bench/peers.py. Runs ONLY in bench/.venv-peers (Procrastinate is not a
dependency of the project); bench/peers.py calls it, it is not meant to be run by hand.

    python peers_procrastinate.py DSN setup                  apply Procrastinate's schema
    python peers_procrastinate.py DSN defer N                defer N no-op jobs (batches of 1000)
    python peers_procrastinate.py DSN work CONCURRENCY NAME  work until the queue is empty

Each prints one line `seconds=<elapsed>`.
"""

import asyncio
import logging
import sys
import time

import procrastinate

logging.basicConfig(level=logging.WARNING)
dsn, mode, *rest = sys.argv[1:]
app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))


@app.task(name="noop", queue="bench")
async def noop():
    return None


async def main():
    async with app.open_async():
        t = time.perf_counter()
        if mode == "setup":
            await app.schema_manager.apply_schema_async()
        elif mode == "defer":
            n = int(rest[0])
            for i in range(0, n, 1000):
                await noop.batch_defer_async(*({} for _ in range(min(1000, n - i))))
        elif mode == "work":
            await app.run_worker_async(
                queues=["bench"], concurrency=int(rest[0]), name=rest[1], wait=False,
                install_signal_handlers=False, delete_jobs="never",
            )
        else:
            raise SystemExit(f"unknown mode {mode}")
        print(f"seconds={time.perf_counter() - t:.6f}", flush=True)


asyncio.run(main())
