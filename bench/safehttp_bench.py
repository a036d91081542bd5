"""Micro-benchmark: calls/s and client CPU per call through SafeClient to a local target.

The target is an aiohttp server in a child process answering 200 at once, so the client's CPU
(time.process_time of this process, resolver threads included) is measured apart from the
server's. A plain aiohttp ClientSession (no safety checks; the client SafeClient used before its
own transport, dispatch/http1.py) runs the same load as a baseline, measured in the same run
(this machine is noisy). 2026-11-30: SafeClient 125 µs of client CPU per call, plain aiohttp
373 µs (calls/s 3,989 vs 2,596; the aiohttp server is the limit on calls/s here).

    .venv/bin/python bench/safehttp_bench.py [--calls 20000] [--concurrency 200] [--rounds 3]

With --hostile it measures what hostile targets cost instead (tests/safehttp/hostile.py: answers
that never end, each in its own way, sent from a child process): each kind alone (outcome, wall
time, client CPU and bytes read per call), then a healthy target's calls with and without all the
hostile kinds being called beside them through the same client (latency, calls/s, client CPU,
peak RSS growth).

    .venv/bin/python bench/safehttp_bench.py --hostile [--seconds 5] [--hostile-timeout 5] [--uvloop]

Traffic goes to 127.0.0.1 only; every loop is bounded by --calls or --seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import aiohttp  # noqa: E402
from aiohttp import web  # noqa: E402

from dispatch.safehttp import SafeClient  # noqa: E402


def run_target(port_queue: multiprocessing.Queue, stop: multiprocessing.Event) -> None:
    async def ok(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=b'{"ok":true}', content_type="application/json")

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/run", ok)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        port_queue.put(runner.addresses[0][1])
        while not stop.is_set():
            await asyncio.sleep(0.1)
        await runner.cleanup()

    asyncio.run(main())


async def drive(call, calls: int, concurrency: int) -> tuple[float, float, int]:
    """Run ``calls`` calls with ``concurrency`` in flight; returns (wall s, cpu s, failures)."""
    remaining = calls
    failures = 0

    async def worker() -> None:
        nonlocal remaining, failures
        while remaining > 0:
            remaining -= 1
            if not await call():
                failures += 1

    wall0, cpu0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - wall0, time.process_time() - cpu0, failures


async def bench(url: str, calls: int, concurrency: int, rounds: int) -> None:
    body = b'{"run_id":"00000000-0000-0000-0000-000000000000","payload":{}}'
    headers = {"Content-Type": "application/json", "Idempotency-Key": "bench", "X-Scheduler-Signature": "v1=abc"}
    prefixes = [url.rsplit("/", 1)[0] + "/"]

    async with SafeClient(allowed_networks=["127.0.0.0/8"], limit=concurrency) as client:

        async def safe_call() -> bool:
            r = await client.request("POST", url, headers=headers, body=body, timeout=10, allowed_prefixes=prefixes)
            return r.outcome == "succeeded"

        connector = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=connector, trust_env=False) as session:
            timeout = aiohttp.ClientTimeout(total=10)

            async def raw_call() -> bool:
                async with session.post(url, data=body, headers=headers, timeout=timeout, allow_redirects=False) as r:
                    await r.read()
                    return r.status == 200

            await drive(safe_call, 2000, concurrency)  # warm both pools and caches
            await drive(raw_call, 2000, concurrency)
            results: dict[str, list[tuple[float, float]]] = {"SafeClient": [], "raw aiohttp": []}
            for _ in range(rounds):
                for name, call in (("SafeClient", safe_call), ("raw aiohttp", raw_call)):
                    wall, cpu, failures = await drive(call, calls, concurrency)
                    if failures:
                        raise SystemExit(f"{name}: {failures} failed calls")
                    results[name].append((calls / wall, cpu / calls * 1e6))

    print(f"{calls} calls x {rounds} rounds, {concurrency} in flight, target in another process")
    for name, rows in results.items():
        rate = statistics.median(r for r, _ in rows)
        cpu = statistics.median(c for _, c in rows)
        print(f"  {name:12s} median {rate:8.0f} calls/s   {cpu:6.0f} us client CPU per call   "
              f"(rounds: {', '.join(f'{r:.0f}' for r, _ in rows)})")


async def hostile_bench(urls: dict[str, str], seconds: float, timeout: float) -> None:
    from dispatch import http1
    from tests.safehttp.hostile import fight

    # Bytes handed to the transport, as read from the socket (the parser may be given fewer).
    received = [0]
    real = http1._Connection.data_received

    def counting(self, data):
        received[0] += len(data)
        return real(self, data)

    http1._Connection.data_received = counting
    print(f"each hostile kind alone, 3 calls in a row, deadline {timeout:g}s:")
    print(f"  {'kind':24s} {'outcome':24s} {'wall/call':>10s} {'CPU/call':>10s} {'read/call':>10s}")
    async with SafeClient(allowed_networks=["127.0.0.0/8"]) as client:
        for kind, url in urls.items():
            cpu0, wall0, received[0] = time.process_time(), time.perf_counter(), 0
            for _ in range(3):
                r = await client.request("POST", url + "/run", headers={}, body=b"{}", timeout=timeout,
                                         allowed_prefixes=None)
            wall, cpu = (time.perf_counter() - wall0) / 3, (time.process_time() - cpu0) / 3
            outcome = r.error_class or f"HTTP {r.status}"
            print(f"  {kind:24s} {outcome:24s} {wall * 1e3:8.1f}ms {cpu * 1e3:8.1f}ms {received[0] / 3 / 1024:7.0f}KiB")
    http1._Connection.data_received = real

    def healthy_figures(got) -> str:
        lat = sorted(ended - started for _, started, ended, _ in got.healthy)
        bad = sum(1 for n, _, _, r in got.healthy if (r.status, r.body_excerpt) != (200, n.encode()))
        return (f"{len(lat) / got.seconds:6.0f} healthy calls/s, latency p50 {lat[len(lat) // 2] * 1e3:.1f} ms "
                f"p99 {lat[int(len(lat) * 0.99)] * 1e3:.1f} ms max {lat[-1] * 1e3:.1f} ms, {bad} wrong; "
                f"client CPU {got.cpu_seconds / got.seconds * 100:.0f}%, peak RSS +{got.rss_growth / 2**20:.1f} MiB")

    alone = await fight(urls, kinds=[], seconds=seconds, hostile_timeout=timeout, hostile_callers=0,
                        healthy_callers=20)
    print(f"healthy target alone, 20 callers, {seconds:g}s:")
    print(f"  {healthy_figures(alone)}")
    beside = await fight(urls, kinds=list(urls), seconds=seconds, hostile_timeout=timeout, hostile_callers=3,
                         healthy_callers=20)
    hostile_calls = len(beside.hostile)
    print(f"healthy target beside {len(urls)} hostile kinds x 3 callers ({hostile_calls} hostile calls), {seconds:g}s:")
    print(f"  {healthy_figures(beside)}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hostile", action="store_true", help="measure what hostile targets cost instead")
    parser.add_argument("--seconds", type=float, default=5.0, help="--hostile: length of each fight")
    parser.add_argument("--hostile-timeout", type=float, default=5.0, help="--hostile: each hostile call's deadline")
    parser.add_argument("--uvloop", action="store_true", help="run the client on uvloop, as the worker does")
    args = parser.parse_args()
    if args.uvloop:
        import uvloop

        uvloop.install()

    if args.hostile:
        from tests.safehttp.hostile import hostile_targets

        with hostile_targets() as urls:
            asyncio.run(hostile_bench(urls, args.seconds, args.hostile_timeout))
        return

    port_queue: multiprocessing.Queue = multiprocessing.Queue()
    stop = multiprocessing.Event()
    target = multiprocessing.Process(target=run_target, args=(port_queue, stop), daemon=True)
    target.start()
    try:
        port = port_queue.get(timeout=10)
        asyncio.run(bench(f"http://127.0.0.1:{port}/run", args.calls, args.concurrency, args.rounds))
    finally:
        stop.set()
        target.join(5)
        if target.is_alive():
            target.terminate()


if __name__ == "__main__":
    main()
