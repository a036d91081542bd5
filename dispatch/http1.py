"""The HTTP/1.1 transport under SafeClient: kept-alive connections to checked addresses, one call
at a time per connection, responses parsed by httptools (llhttp, the parser Node.js and uvicorn
use).

Why not aiohttp here: in a burst its client was the largest single CPU cost of the worker, several
times what this transport costs per call (bench/safehttp_bench.py measures both; the figures are
in docs/dispatch.md). A call here is one write of pre-joined bytes, one parse and one future, with
no per-call session, tracing, cookie or stream-reader objects.

What stays with SafeClient (dispatch/safehttp.py): the URL allowlist, header rules, the address
policy, result classification. What is here: resolution through the caller's resolver with only
*checked* addresses kept and cached, connecting to exactly those addresses, the connection limit,
the byte budget of each answer (the body against the cap, everything else against
MAX_HEAD_BYTES; the connection is dropped, never drained, once either is passed), framing, and
closing connections that go stale or are told to close.
"""

from __future__ import annotations

import asyncio
import collections
import ipaddress
import os
import socket
import ssl as ssl_module
import time
from typing import Any, Callable

import httptools


class CallError(Exception):
    """A call that did not produce an answer. ``name`` is the error class recorded on the
    attempt (the names aiohttp used, so the evidence of older attempts reads the same);
    ``sent`` says whether the request may have reached the target."""

    def __init__(self, name: str, message: str, *, sent: bool):
        super().__init__(message)
        self.name = name
        self.message = message
        self.sent = sent


class AddressRefused(Exception):
    """Resolution found no address the policy allows."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class SystemResolver:
    """The operating system's resolver (getaddrinfo on the loop's executor)."""

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_UNSPEC) -> list[dict]:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, family=family, type=socket.SOCK_STREAM)
        return [{"hostname": host, "host": info[4][0], "port": port, "family": info[0]} for info in infos]

    async def close(self) -> None:
        pass


async def open_connection(loop, factory, ip: str, port: int, *, ssl, server_hostname):
    """Every connection the transport makes goes through here (tests hook it to see each address
    connected to)."""
    return await loop.create_connection(factory, ip, port, ssl=ssl, server_hostname=server_hostname)


# Everything of an answer that is not its body: status line, headers, informational (1xx) answers,
# chunk-size lines, chunk extensions and trailers. aiohttp allowed 8 KiB per line; a real answer's
# head and framing are a few hundred bytes.
MAX_HEAD_BYTES = 65536

# A read costs about the same CPU whether it brings one byte or 64 KiB, so a peer sending one-byte
# segments as fast as it can would make one call's byte budget cost tens of thousands of reads.
# After SMALL_READS_FREE reads of under SMALL_READ bytes in one call, reading pauses for
# SMALL_READ_PAUSE after each small read, letting the kernel gather what the peer sends into
# fewer reads: at most ~100 reads a second for such a call. Real answers arrive in a few reads.
SMALL_READ = 1024
SMALL_READS_FREE = 32
SMALL_READ_PAUSE = 0.01


class Answer:
    __slots__ = ("status", "excerpt", "complete", "retry_after", "remote")

    def __init__(self, status, excerpt, complete, retry_after, remote):
        self.status = status
        self.excerpt = excerpt
        self.complete = complete  # False: the body passed the cap and the connection was dropped
        self.retry_after = retry_after
        self.remote = remote


class _Connection(asyncio.Protocol):
    """One connection; at most one request on it at a time. Idle between calls; a byte arriving
    while idle means the peer is confused, so the connection is closed."""

    def __init__(self, pool: "Pool", key: tuple, remote: str):
        self.pool = pool
        self.key = key
        self.remote = remote
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future | None = None
        self.closed = False
        self.paused = False
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.fed = 0  # bytes of this call's answer given to the parser
        self.small_reads = 0
        self.status = None
        self.headers_done = False
        self.informational = False
        self.retry_after: bytes | None = None
        self.framed = False  # a Content-Length or chunked answer ends by itself; others at EOF
        self.excerpt = b""
        self.got = 0

    # -- a call ---------------------------------------------------------------------------

    def send(self, data: bytes, *, cap: int, keep: int, head: bool) -> asyncio.Future:
        self._reset()
        self.cap, self.keep, self.head = cap, keep, head
        self.waiter = self.pool.loop.create_future()
        self.transport.write(data)
        return self.waiter

    def _finish(self, complete: bool, reusable: bool) -> None:
        waiter, self.waiter = self.waiter, None
        if not reusable:
            self.close()
        if waiter is not None and not waiter.done():
            retry_after = self.retry_after.decode("latin-1") if self.retry_after is not None else None
            waiter.set_result(Answer(self.status, self.excerpt, complete, retry_after, self.remote))

    def expire(self) -> None:
        """The call's time is up: the connection goes (a late answer must not reach the next call)."""
        self._fail(TimeoutError())

    def _fail(self, error: Exception) -> None:
        waiter, self.waiter = self.waiter, None
        self.close()
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                # abort, not close: nothing of a half-read answer is drained or waited for.
                self.transport.abort()

    # -- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        """Every byte received for a call counts: body bytes against the cap (``on_body``), all
        the others against MAX_HEAD_BYTES. The parser is never given more than both budgets
        have left (plus one byte, to see one of them pass), so a peer that sends chunk
        extensions, trailers or 1xx answers forever costs one bounded parse, and its stream is
        cut off there. The parser keeps a header or trailer it has not seen the end of, growing
        it by a copy per read: this bound is also what bounds that memory and copying."""
        if self.waiter is None:
            self.close()
            return
        room = self.cap - self.got + MAX_HEAD_BYTES - (self.fed - self.got) + 1
        if len(data) > room:
            data = data[:room]
        self.fed += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(CallError("ClientResponseError", "the target switched protocols", sent=True))
            return
        except httptools.HttpParserError as exc:
            self._fail(CallError("ClientResponseError", f"malformed answer: {exc}", sent=True))
            return
        if self.waiter is None:
            return
        if len(data) < SMALL_READ:
            self.small_reads += 1
            if self.small_reads > SMALL_READS_FREE and not self.paused:
                self.paused = True
                self.transport.pause_reading()
                self.pool.loop.call_later(SMALL_READ_PAUSE, self._resume_reading)
        if self.fed - self.got > MAX_HEAD_BYTES:
            if not self.headers_done:
                message = f"answer headers over {MAX_HEAD_BYTES} bytes (status line, headers and any 1xx answers)"
            else:
                message = (f"HTTP {self.status} answer over its byte budget: more than {MAX_HEAD_BYTES} bytes of "
                           "headers, chunk framing and trailers besides the body")
            self._fail(CallError("ResponseTooLarge", message, sent=True))

    def _resume_reading(self) -> None:
        self.paused = False
        if not self.closed:
            self.transport.resume_reading()

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.pool._lost(self)
        if self.waiter is None:
            return
        if self.headers_done and not self.framed and not self.informational:
            self._finish(True, False)  # an answer that ends when the connection does
        elif self.status is None:
            self._fail(CallError("ServerDisconnectedError", "Server disconnected", sent=True))
        else:
            self._fail(CallError("ClientPayloadError", "Response payload is not completed", sent=True))

    # -- httptools callbacks --------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.waiter is None:
            # A second answer to one request: the stream can no longer be trusted to pair
            # answers with requests, so the connection is not reused.
            self.close()

    def on_header(self, name: bytes, value: bytes) -> None:
        n = name.lower()
        if n == b"retry-after":
            self.retry_after = value
        elif n == b"content-length" or (n == b"transfer-encoding" and b"chunked" in value.lower()):
            self.framed = True

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:
            # 100 Continue and friends: a final answer follows on the same connection.
            self.informational = True
            return
        self.status = status
        self.headers_done = True
        if status in (204, 304):
            self.framed = True
        if self.head:
            # An answer to HEAD has no body whatever its headers say; the parser cannot know
            # that, so the call ends here and the connection is not reused.
            self._finish(True, False)

    def on_body(self, chunk: bytes) -> None:
        if self.waiter is None or self.informational:
            return
        if len(self.excerpt) < self.keep:
            self.excerpt += chunk[: self.keep - len(self.excerpt)]
        self.got += len(chunk)
        if self.got > self.cap:
            self._finish(False, False)

    def on_message_complete(self) -> None:
        if self.informational:
            self.informational = False
            return
        if self.waiter is not None:
            self._finish(True, self.parser.should_keep_alive())


class Pool:
    """Idle connections per (scheme, host, port), at most ``limit`` open in all (0: no limit;
    per-target budgets are the claim's business, see runs.queue). Addresses are resolved through ``resolver`` and filtered by
    ``allow`` (a callable returning None or the reason an address is refused); only allowed
    ones are cached (``dns_ttl``) and connected to."""

    KEEPALIVE = 15.0  # idle connections older than this are closed instead of reused

    def __init__(
        self,
        *,
        allow: Callable[[str], str | None],
        resolver: Any = None,
        limit: int = 1000,
        dns_ttl: float = 10.0,
        ssl_context: ssl_module.SSLContext | None = None,
    ):
        self.loop = asyncio.get_running_loop()
        self.allow = allow
        self.resolver = resolver if resolver is not None else SystemResolver()
        self.limit = limit
        self.dns_ttl = dns_ttl
        self.ssl_context = ssl_context
        self.idle: dict[tuple, list[_Connection]] = {}
        self.total = 0
        self.waiters: collections.deque[asyncio.Future] = collections.deque()
        self.addresses: dict[tuple, tuple[float, list[str]]] = {}
        self.all: set[_Connection] = set()
        self._sweep_at = time.monotonic() + self.KEEPALIVE / 3

    def take_idle(self, scheme: str, host: str, port: int) -> _Connection | None:
        """A kept-alive connection to this origin, if one is idle."""
        idle = self.idle.get((scheme, host, port))
        if idle:
            now = time.monotonic()
            while idle:
                conn = idle.pop()  # the most recently used: the likeliest to be alive
                if not conn.closed and now - conn.idle_since < self.KEEPALIVE:
                    return conn
                conn.close()
        return None

    async def acquire(self, scheme: str, host: str, port: int) -> _Connection:
        """An idle connection to this origin or a new one, within the limits (waits for a slot)."""
        key = (scheme, host, port)
        while True:
            conn = self.take_idle(scheme, host, port)
            if conn is not None:
                return conn
            if not (self.limit and self.total >= self.limit):
                break
            self._close_one_idle()  # its slot comes back when its connection_lost runs
            waiter = self.loop.create_future()
            self.waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self.waiters:
                    self.waiters.remove(waiter)
        self.total += 1
        try:
            return await self._connect(key, scheme, host, port)
        except BaseException:
            self._forget()
            raise

    def release(self, conn: _Connection) -> None:
        if conn.closed:
            return
        conn.idle_since = now = time.monotonic()
        self.idle.setdefault(conn.key, []).append(conn)
        self._wake()
        if now >= self._sweep_at:
            self._sweep(now)

    def _sweep(self, now: float) -> None:
        """Close connections idle past KEEPALIVE, so origins no longer called do not keep
        sockets open (a reused connection is checked when taken; this is for the rest)."""
        self._sweep_at = now + self.KEEPALIVE / 3
        for key, conns in list(self.idle.items()):
            keep = [c for c in conns if not c.closed and now - c.idle_since < self.KEEPALIVE]
            for c in conns:
                if c not in keep:
                    c.close()
            if keep:
                self.idle[key] = keep
            else:
                del self.idle[key]

    def _wake(self) -> None:
        # Every waiter re-checks (a freed slot may suit only some of them). Waiters exist only
        # when more calls are in flight than the limit allows, which the worker never asks for.
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)

    def _close_one_idle(self) -> None:
        for conns in self.idle.values():
            while conns:
                conn = conns.pop(0)  # the longest idle
                if not conn.closed:
                    conn.close()  # connection_lost frees its slot
                    return

    def _forget(self) -> None:
        self.total -= 1
        if self.waiters:
            self._wake()

    def _lost(self, conn: _Connection) -> None:
        if conn in self.all:
            self.all.discard(conn)
            idle = self.idle.get(conn.key)
            if idle and conn in idle:
                idle.remove(conn)
            self._forget()

    async def _addresses(self, host: str, port: int) -> list[str]:
        cached = self.addresses.get((host, port))
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        if is_ip_literal(host):
            ips = [host.strip("[]")]
        else:
            try:
                infos = await self.resolver.resolve(host, port, family=socket.AF_UNSPEC)
            except OSError as exc:
                raise CallError("ClientConnectorDNSError", f"cannot resolve {host}: {exc}", sent=False) from None
            ips, first_reason = [], None
            for info in infos:
                reason = self.allow(info["host"])
                if reason is None:
                    if info["host"] not in ips:
                        ips.append(info["host"])
                elif first_reason is None:
                    first_reason = reason
            if not ips:
                raise AddressRefused(f"{host} resolves only to refused addresses: {first_reason or 'no addresses'}")
        if self.dns_ttl > 0:
            if len(self.addresses) > 4096:
                self.addresses.clear()
            self.addresses[(host, port)] = (time.monotonic() + self.dns_ttl, ips)
        return ips

    async def _connect(self, key, scheme: str, host: str, port: int) -> _Connection:
        ips = await self._addresses(host, port)
        tls = None
        if scheme == "https":
            if self.ssl_context is None:
                self.ssl_context = ssl_module.create_default_context()
            tls = self.ssl_context
        last: OSError | None = None
        for ip in ips:
            try:
                _, conn = await open_connection(
                    self.loop, lambda ip=ip: _Connection(self, key, ip), ip, port,
                    ssl=tls, server_hostname=host.strip("[]") if tls else None,
                )
            except ssl_module.SSLError as exc:
                raise CallError("ClientConnectorCertificateError" if isinstance(exc, ssl_module.SSLCertVerificationError)
                                else "ClientConnectorSSLError", f"TLS with {host}:{port} failed: {exc}", sent=False) from None
            except OSError as exc:
                last = exc
                continue
            self.all.add(conn)
            return conn
        raise CallError("ClientConnectorError", f"cannot connect to {host}:{port}: {_os_error_text(last)}", sent=False)

    async def close(self) -> None:
        for conn in list(self.all):
            conn.close()
        for waiter in self.waiters:
            if not waiter.done():
                waiter.cancel()
        self.waiters.clear()
        self.idle.clear()
        await self.resolver.close()


def is_ip_literal(host: str) -> bool:
    """Whether a URL's host is an address (IPv6 with or without brackets and a zone), which is
    connected to as written, never resolved."""
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def _os_error_text(err: OSError | None) -> str:
    if err is None:
        return "no addresses"
    # asyncio's "Connect call failed (...)" hides the reason; errno says "Connection refused".
    if err.errno:
        return os.strerror(err.errno)
    return str(err) or type(err).__name__
