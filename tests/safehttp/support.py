"""Local servers (aiohttp ones, and raw ones that write whatever bytes a test wants) and a stub
resolver for the safehttp tests."""

from __future__ import annotations

import asyncio
import socket
from contextlib import asynccontextmanager

from aiohttp import web
from aiohttp.abc import AbstractResolver

from dispatch.safehttp import SafeClient

LOCAL = ["127.0.0.0/8"]


@asynccontextmanager
async def serve(handler, host: str = "127.0.0.1"):
    """An aiohttp server answering every path with ``handler``; yields its base URL."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    # A short shutdown so handlers left sleeping by timeout tests do not hold cleanup up.
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.2)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


class Listener:
    """A bare TCP listener that records each connection made to it and closes it."""

    def __init__(self) -> None:
        self.accepted: list[tuple[str, int]] = []
        self.port = 0
        self._server: asyncio.base_events.Server | None = None

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> "Listener":
        async def on_connect(reader, writer):
            self.accepted.append(writer.get_extra_info("peername")[:2])
            writer.close()

        self._server = await asyncio.start_server(on_connect, host, port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


class StubResolver(AbstractResolver):
    """Answers from a script: ``answers[host]`` is a list of address lists, one per lookup
    (the last repeats), so a test can make a name change its answer between lookups."""

    def __init__(self, answers: dict[str, list[list[str]]]):
        self.answers = answers
        self.lookups: list[str] = []

    async def resolve(self, host, port=0, family=socket.AF_INET):
        self.lookups.append(host)
        script = self.answers.get(host)
        if not script:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        n = sum(1 for h in self.lookups if h == host) - 1
        addrs = script[min(n, len(script) - 1)]
        return [
            {
                "hostname": host,
                "host": a,
                "port": port,
                "family": socket.AF_INET6 if ":" in a else socket.AF_INET,
                "proto": 0,
                "flags": 0,
            }
            for a in addrs
        ]

    async def close(self) -> None:
        pass


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RawServer:
    """A TCP server whose handler writes whatever bytes a test wants; counts connections."""

    def __init__(self, handler, ssl_context=None):
        self.handler = handler
        self.ssl_context = ssl_context
        self.connections = 0
        self.open = 0
        self.max_open = 0

    async def __aenter__(self):
        async def on_connect(reader, writer):
            self.connections += 1
            self.open += 1
            self.max_open = max(self.max_open, self.open)
            try:
                await self.handler(reader, writer)
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                self.open -= 1
                writer.close()

        self.server = await asyncio.start_server(on_connect, "127.0.0.1", 0, ssl=self.ssl_context)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc):
        self.server.close()


async def read_request(reader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    body = await reader.readexactly(length) if length else b""
    return head, body


def serving(handler, *calls, client_kwargs=None, scheme="http", ssl_context=None):
    """Run ``calls`` (each: client, base URL -> awaitable) against a RawServer; returns the
    results and the server."""

    async def main():
        async with RawServer(handler, ssl_context) as server:
            base = f"{scheme}://127.0.0.1:{server.port}"
            async with SafeClient(allowed_networks=LOCAL, **(client_kwargs or {})) as client:
                results = [await call(client, base) for call in calls]
            return results, server

    return asyncio.run(main())


def post(client, base, *, method="POST", headers=None, timeout=2):
    return client.request(method, base + "/run", headers=headers or {}, body=b"{}", timeout=timeout, allowed_prefixes=None)


def answering_ok(delay=0.0):
    """A keep-alive handler answering each request with 200 "ok", after ``delay`` seconds."""

    async def handler(reader, writer):
        while True:
            await read_request(reader)
            if delay:
                await asyncio.sleep(delay)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()

    return handler


keep_alive_ok = answering_ok()


def answering_once(raw: bytes, *, hold: float = 0.0):
    """A handler that reads one request, writes ``raw`` as is, and keeps the connection open for
    ``hold`` seconds (so the client cannot take the end of the connection as the end of the
    answer), then closes it."""

    async def handler(reader, writer):
        await read_request(reader)
        writer.write(raw)
        await writer.drain()
        if hold:
            await asyncio.sleep(hold)

    return handler


def answering_forever(first: bytes, again: bytes, *, pause: float | None = None):
    """A handler that reads one request, writes ``first``, then ``again`` over and over until the
    caller hangs up (``pause`` seconds apart; None: as fast as the caller reads)."""

    async def handler(reader, writer):
        await read_request(reader)
        writer.write(first)
        try:
            while True:
                writer.write(again)
                await writer.drain()
                if pause is not None:
                    await asyncio.sleep(pause)
        except ConnectionError:
            pass

    return handler
