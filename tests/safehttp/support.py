"""Local servers and a stub resolver for the safehttp tests."""

from __future__ import annotations

import asyncio
import socket
from contextlib import asynccontextmanager

from aiohttp import web
from aiohttp.abc import AbstractResolver


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
