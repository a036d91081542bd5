"""Hostile targets, and a fight between them and a healthy target through one SafeClient.

The hostile targets are raw TCP servers that answer a request with an answer that never ends,
each in its own way, served from a child process so that their sending costs the caller nothing:

    python -m tests.safehttp.hostile        # prints {"kind": port, ...} as one JSON line

It serves until its stdin closes (the parent exits or closes the pipe). Every listener is on
127.0.0.1. ``fight`` calls them and a healthy target (in the caller's process) at once, as the
worker would; tests/safehttp/test_hostile_targets.py asserts on what it returns and
bench/safehttp_bench.py --hostile prints it.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

HEAD_CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"

# kind -> (bytes sent once, bytes sent again and again until the caller hangs up, seconds
# between repeats (None: as fast as the caller reads)).
KINDS: dict[str, tuple[bytes, bytes, float | None]] = {
    # The target: a whole body, then a trailer value that never ends.
    "endless_trailer": (HEAD_CHUNKED + b"5\r\nhello\r\n0\r\nX-T: ", b"a" * 65536, None),
    "endless_trailer_lines": (HEAD_CHUNKED + b"5\r\nhello\r\n0\r\n", b"X-T: a\r\n" * 8192, None),
    "endless_chunk_extension": (HEAD_CHUNKED + b"5;ext=", b"a" * 65536, None),
    "endless_header": (b"HTTP/1.1 200 OK\r\nX-Long: ", b"a" * 65536, None),
    "endless_header_lines": (b"HTTP/1.1 200 OK\r\n", b"X-H: a\r\n" * 8192, None),
    "tiny_chunks": (HEAD_CHUNKED, b"1\r\na\r\n" * 10922, None),
    "informational_flood": (b"", b"HTTP/1.1 100 Continue\r\n\r\n" * 2520, None),
    "huge_content_length": (b"HTTP/1.1 200 OK\r\nContent-Length: " + b"1" + b"0" * 30 + b"\r\n\r\n", b"a" * 65536, None),
    "endless_body": (b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000000\r\n\r\n", b"a" * 65536, None),
    # Slow answers: one byte at a time, so only the call's deadline ends them.
    "slow_header": (b"HTTP/1.1 200 OK\r\nX-Slow: ", b"a", 0.1),
    "slow_trailer": (HEAD_CHUNKED + b"5\r\nhello\r\n0\r\nX-T: ", b"a", 0.05),
    # A trailer value in one-byte segments as fast as they go: the most reads, and the most
    # re-copying of the unfinished value by the parser, per byte.
    "byte_by_byte_trailer": (HEAD_CHUNKED + b"5\r\nhello\r\n0\r\nX-T: ", b"a", 0),
}


async def _read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            await reader.readexactly(int(line.split(b":", 1)[1]))


def _handler(first: bytes, again: bytes, pause: float):
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await _read_request(reader)
            writer.write(first)
            while True:
                writer.write(again)
                await writer.drain()  # waits while the caller is not reading: no buffer grows here
                if pause is not None:
                    await asyncio.sleep(pause)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.transport.abort()

    return handle


async def _serve() -> None:
    servers = {}
    for kind, (first, again, pause) in KINDS.items():
        servers[kind] = await asyncio.start_server(_handler(first, again, pause), "127.0.0.1", 0)
    ports = {kind: s.sockets[0].getsockname()[1] for kind, s in servers.items()}
    print(json.dumps(ports), flush=True)
    # Serve until the parent closes our stdin (or dies, which closes it too).
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.buffer.read)
    os._exit(0)  # nothing to clean up; cancelling handlers mid-write would only log noise


@contextmanager
def hostile_targets():
    """Start the hostile servers in a child process; yields {kind: base URL}."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.safehttp.hostile"], cwd=root, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )
    try:
        line = child.stdout.readline()
        if not line:
            raise RuntimeError("the hostile target process did not start")
        yield {kind: f"http://127.0.0.1:{port}" for kind, port in json.loads(line).items()}
    finally:
        child.stdin.close()
        try:
            child.wait(5)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


# --------------------------------------------------------------------------- the fight


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRss(threading.Thread):
    """The process's peak resident size, sampled from a thread so that a busy event loop cannot
    hide a peak from it."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak = rss_bytes()
        self.done = threading.Event()

    def run(self):
        while not self.done.wait(0.005):
            self.peak = max(self.peak, rss_bytes())

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.join()


@dataclass
class Fight:
    # (n, started, ended, HttpResult) per healthy call; the answer to call n is n.
    healthy: list = field(default_factory=list)
    # (kind, started, ended, HttpResult) per hostile call.
    hostile: list = field(default_factory=list)
    rss_growth: int = 0  # peak resident bytes while fighting, over the level before it
    cpu_seconds: float = 0.0  # this process's CPU while fighting
    seconds: float = 0.0
    # The longest time, within one tick of the event loop's probe, that this process was not
    # running at all: a busy host's preemption, which no client code can make up for. A loop
    # held by this process's own work shows as CPU time, not here.
    off_cpu_stall: float = 0.0


async def _probe_stalls(out: Fight, done: asyncio.Event, tick: float = 0.02) -> None:
    wall, cpu = time.monotonic(), time.process_time()
    while not done.is_set():
        await asyncio.sleep(tick)
        now_wall, now_cpu = time.monotonic(), time.process_time()
        out.off_cpu_stall = max(out.off_cpu_stall, (now_wall - wall) - (now_cpu - cpu) - tick)
        wall, cpu = now_wall, now_cpu


async def _echo(reader, writer, handlers):
    """The healthy target: answers each request at once with its X-N header's value."""
    handlers[asyncio.current_task()] = writer
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            n = b""
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.lower() == b"content-length":
                    await reader.readexactly(int(value))
                elif name.lower() == b"x-n":
                    n = value.strip()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(n), n))
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def fight(hostile: dict[str, str], *, kinds, seconds: float, hostile_timeout: float, hostile_callers: int,
                healthy_callers: int, client_kwargs=None) -> Fight:
    """For ``seconds``, ``hostile_callers`` callers per hostile kind and ``healthy_callers``
    callers of a healthy target each make call after call through one SafeClient."""
    from dispatch.safehttp import SafeClient

    loop = asyncio.get_running_loop()
    handlers: dict = {}
    server = await asyncio.start_server(lambda r, w: _echo(r, w, handlers), "127.0.0.1", 0)
    healthy = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    out = Fight()
    kwargs = {"allowed_networks": ["127.0.0.0/8"], "limit": 1000, **(client_kwargs or {})}
    async with SafeClient(**kwargs) as client:

        async def call(url, headers, timeout):
            started = time.monotonic()
            result = await client.request("POST", url + "/run", headers=headers, body=b"{}", timeout=timeout,
                                          allowed_prefixes=[url + "/"])
            return started, time.monotonic(), result

        # Warm-up: the healthy target's connections and this process's allocations come before
        # the baseline, so that what grows after it is the fight's.
        await asyncio.gather(*(call(healthy, {"X-N": "warm"}, 5) for _ in range(healthy_callers)))
        baseline = rss_bytes()
        stop = loop.time() + seconds

        async def healthy_caller(w):
            i = 0
            while loop.time() < stop:
                n = f"{w}-{i}"
                out.healthy.append((n, *await call(healthy, {"X-N": n}, 5)))
                i += 1

        async def hostile_caller(kind):
            while loop.time() < stop:
                out.hostile.append((kind, *await call(hostile[kind], {}, hostile_timeout)))

        cpu, wall = time.process_time(), time.monotonic()
        fought = asyncio.Event()
        probe = asyncio.create_task(_probe_stalls(out, fought))
        with PeakRss() as rss:
            # Hostile callers first: every healthy call starts while they are at work.
            await asyncio.gather(
                *(hostile_caller(kind) for kind in kinds for _ in range(hostile_callers)),
                *(healthy_caller(w) for w in range(healthy_callers)),
            )
        fought.set()
        await probe
        out.cpu_seconds, out.seconds = time.process_time() - cpu, time.monotonic() - wall
        out.rss_growth = rss.peak - baseline
    server.close()
    for writer in handlers.values():
        writer.transport.abort()  # each handler then sees the end of its stream and returns
    await asyncio.gather(*handlers, return_exceptions=True)
    return out


if __name__ == "__main__":
    asyncio.run(_serve())
