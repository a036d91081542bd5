"""The one outbound HTTP layer: every call to a tenant target and every webhook goes through here.

What it guarantees, whatever the URL or DNS says (docs/dispatch.md explains each; docs/api.md, "On
the target side", is what a target sees):

- the URL is http(s), has no userinfo, and starts with one of the tenant's allowed prefixes,
  compared on parsed components (see ``url_allowed``);
- every address connected to was checked *after* resolution: the transport (dispatch/http1.py)
  keeps only the resolved addresses ``AddressPolicy`` allows, caches only those, and connects
  to exactly them (no DNS rebinding between check and connect). IP-literal hosts are never
  resolved, so ``SafeClient`` checks those itself;
- non-public addresses are refused unless an operator network (SCHEDULER_TARGET_ALLOWED_NETWORKS)
  contains them; cloud metadata addresses stay refused even then, unless the list names the
  metadata address itself (a /32 or /128), because "allow 169.254.0.0/16 for a sidecar" must not
  silently hand tenants the instance credentials;
- every header of every call passes the one header rule (``schedules.targets.header_problem``,
  the API's rule too), or the call is refused before connecting;
- redirects are returned, never followed; one total time limit per call; at most
  ``max_response_bytes`` of the body are read (then the connection is dropped, not drained) and
  ``excerpt_bytes`` kept, and at most 64 KiB of everything else in the answer (status line,
  headers, 1xx answers, chunk framing and trailers; see dispatch/http1.py);
- environment proxies are never used (the transport reads no proxy settings): a proxy would
  resolve the name itself and make the address check meaningless.

No maintained library does the address checking for an asyncio client (``advocate`` is
requests-only and unmaintained since 2020; the newer ones wrap httpx), so it is written here on
``ipaddress``. docs/dispatch.md says why the transport is httptools on asyncio, not aiohttp.
"""

from __future__ import annotations

import asyncio
import email.utils
import ipaddress
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Union

from dispatch import http1

# The allowlist lives with the tenants it belongs to; the API checks it at create time with the
# same code the workers use at call time.
# The header rule too: the API refuses a schedule's header with it, and every header of every call
# is checked with it again here, so a row stored before the rule was tightened is never sent.
from schedules.targets import (  # noqa: F401
    MAX_HEADER_VALUE,
    TargetRefused,
    _parse_url,
    _parsed_url_allowed,
    header_problem,
    url_allowed,
)

logger = logging.getLogger(__name__)

USER_AGENT = "durable-scheduler/1"

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
IPNetwork = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]

# Instance-metadata endpoints: AWS/GCP/Azure/OCI (169.254.169.254), AWS ECS task metadata
# (169.254.170.2), AWS IMDS over IPv6 (fd00:ec2::254), Alibaba (100.100.100.200), Azure
# WireServer (168.63.129.16, which looks public), Oracle legacy (192.0.0.192).
METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",
        "169.254.170.2",
        "fd00:ec2::254",
        "100.100.100.200",
        "168.63.129.16",
        "192.0.0.192",
    )
)

# NAT64 prefixes: a NAT64 gateway forwards 64:ff9b::a9fe:a9fe to 169.254.169.254.
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))

_RETRYABLE_4XX = frozenset({408, 429})


class HttpOutcome(StrEnum):
    """A call's outcome as the attempt records it (runs.models.AttemptOutcome has the same values;
    this module loads without Django's models, for the benchmarks)."""

    SUCCEEDED = "succeeded"  # a 2xx answer
    FAILED = "failed"


@dataclass(slots=True)
class HttpResult:
    status: int | None
    outcome: HttpOutcome
    retryable: bool
    retry_after: float | None
    error_class: str | None
    error: str | None
    body_excerpt: bytes
    latency_ms: int
    remote_address: str | None
    # Whether the request may have reached the target when no answer came (a time limit or a
    # disconnect after sending): the attempt's outcome is then unknown, not failed.
    sent: bool = False


# --------------------------------------------------------------------------- networks


def parse_networks(values: Iterable[str]) -> list[IPNetwork]:
    """Parse operator network strings ('127.0.0.0/8', '::1', ...); blanks are skipped."""
    networks: list[IPNetwork] = []
    for raw in values:
        value = str(raw).strip()
        if not value:
            continue
        try:
            networks.append(ipaddress.ip_network(value, strict=True))
        except ValueError as exc:
            hint = ""
            try:
                # Strict parsing catches '10.0.0.1/8'; say what was probably meant rather than
                # silently widening or narrowing an operator's security setting.
                hint = f"; did you mean {ipaddress.ip_network(value, strict=False)}?"
            except ValueError:
                pass
            raise ValueError(f"allowed network {value!r} is not a valid IP network: {exc}{hint}") from None
    return networks


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address leads to, for the forms that reach IPv4 hosts."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    for net in _NAT64:
        if ip in net:
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    # IPv4-compatible (::a.b.c.d, deprecated); '::' and '::1' are handled as themselves.
    if int(ip) >> 32 == 0 and int(ip) > 1:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def _kind(ip: IPAddress) -> str:
    if ip in METADATA_ADDRESSES:
        return "a cloud metadata address"
    if ip.is_unspecified:
        return "an unspecified address"
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_multicast:
        return "a multicast address"
    if isinstance(ip, ipaddress.IPv4Address) and ip in _CGNAT:
        return "a carrier-grade NAT address"
    if ip.is_reserved:
        return "a reserved address"
    if ip.is_private:
        return "a private address"
    if isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local:
        return "a site-local address"
    return "not a public address"


_CGNAT = ipaddress.ip_network("100.64.0.0/10")


def _is_public(ip: IPAddress) -> bool:
    # is_global alone lets multicast (224/4, ff0e::) and some reserved IPv6 ranges through.
    if not ip.is_global or ip.is_multicast or ip.is_reserved:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local:
        return False
    return ip not in METADATA_ADDRESSES


class AddressPolicy:
    """Decides whether an address may be connected to. Immutable after construction."""

    __slots__ = ("networks", "_exact_metadata", "_cache")

    def __init__(self, networks: Iterable[IPNetwork | str] = ()):
        nets: list[IPNetwork] = []
        for n in networks:
            nets.extend(parse_networks([n]) if isinstance(n, str) else [n])
        self.networks: tuple[IPNetwork, ...] = tuple(nets)
        # A metadata address is allowed only when a network names exactly that address.
        self._exact_metadata = frozenset(
            n.network_address for n in nets if n.num_addresses == 1 and n.network_address in METADATA_ADDRESSES
        )
        # Literal hosts repeat on the hot path; the answer for a string never changes.
        self._cache: dict[str, str | None] = {}

    def _in_networks(self, ip: IPAddress) -> bool:
        for net in self.networks:
            if net.version == ip.version and ip in net:
                return True
        return False

    def _refusal_one(self, ip: IPAddress) -> str | None:
        if ip in METADATA_ADDRESSES:
            return None if ip in self._exact_metadata else f"{ip} is {_kind(ip)}"
        if self._in_networks(ip):
            return None
        if _is_public(ip):
            return None
        return f"{ip} is {_kind(ip)}"

    def refusal(self, ip: IPAddress) -> str | None:
        """None when ``ip`` may be connected to, else the reason it may not."""
        if isinstance(ip, ipaddress.IPv6Address):
            if ip.scope_id:
                ip = ipaddress.IPv6Address(str(ip).split("%", 1)[0])
            v4 = _embedded_ipv4(ip)
            if v4 is not None:
                # The IPv4 address is where the packets end up, so it decides; an operator
                # network covering it allows the IPv6 spelling too.
                reason = self._refusal_one(v4)
                if reason is not None:
                    return f"{ip} leads to {reason}"
                if ip.ipv4_mapped is not None or ip.sixtofour is not None or any(ip in n for n in _NAT64):
                    return None
                # Teredo and deprecated IPv4-compatible forms: judged as IPv6 (refused).
        return self._refusal_one(ip)

    def refusal_for_host(self, host: str) -> str | None:
        """Like ``refusal`` for an address string; cached because literal hosts repeat."""
        try:
            return self._cache[host]
        except KeyError:
            pass
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            reason: str | None = f"{host!r} is not an IP address"
        else:
            reason = self.refusal(ip)
        if len(self._cache) < 4096:
            self._cache[host] = reason
        return reason


# --------------------------------------------------------------------------- results


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a Retry-After value (delta-seconds or HTTP-date); None if absent/invalid."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(int(value))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _failure(error_class: str, error: str, started: float, *, retryable: bool, remote: str | None = None,
             sent: bool = False) -> HttpResult:
    return HttpResult(
        status=None,
        outcome=HttpOutcome.FAILED,
        retryable=retryable,
        retry_after=None,
        error_class=error_class,
        error=error,
        body_excerpt=b"",
        latency_ms=int((time.perf_counter() - started) * 1000),
        remote_address=remote,
        sent=sent,
    )


def _refused(reason: str, started: float) -> HttpResult:
    return _failure("TargetRefused", f"refused: {reason}", started, retryable=False)


# --------------------------------------------------------------------------- client


class _Prepared:
    """What a (method, URL, allowlist) needs on every call, computed once: the allowlist and
    literal-address decisions and the request line with its Host header."""

    __slots__ = ("scheme", "host", "port", "head", "refusal")

    def __init__(self, scheme="", host="", port=0, head=b"", refusal=None):
        self.scheme, self.host, self.port, self.head, self.refusal = scheme, host, port, head, refusal


_TOKEN = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_DEFAULT_UA = f"User-Agent: {USER_AGENT}\r\n"
_names: dict[str, str] = {}  # header names the rule allowed, lowercased (the worker sends the same few)


def _checked_name(name: Any, value: Any) -> str:
    """The lowercased name, once ``header_problem`` allows the header; raises TargetRefused."""
    problem = header_problem(name, value, by_scheduler=True)
    if problem is not None:
        raise TargetRefused(problem)
    low = name.lower()
    if len(_names) < 4096:
        _names[name] = low
    return low


class SafeClient:
    """One pool of kept-alive connections (dispatch/http1.py); create one per event loop and
    share it: connection reuse is most of the throughput. The pool is made on first use and
    belongs to that loop, so do not carry one client across ``asyncio.run`` calls. A caller's
    User-Agent header replaces the default one."""

    def __init__(
        self,
        *,
        allowed_networks: Iterable[IPNetwork | str] = (),
        max_response_bytes: int = 65536,
        excerpt_bytes: int = 1024,
        limit: int = 1000,
        dns_ttl: float = 10.0,
        resolver: Any = None,
        ssl_context: Any = None,
    ):
        if max_response_bytes < 0 or excerpt_bytes < 0:
            raise ValueError("byte limits must not be negative")
        self.policy = AddressPolicy(allowed_networks)
        self.max_response_bytes = max_response_bytes
        self.excerpt_bytes = min(excerpt_bytes, max_response_bytes)
        self._limit = limit
        self._dns_ttl = dns_ttl
        # The resolver (tests put a stub here): anything with ``async resolve(host, port,
        # family)`` returning dicts with a "host" address, as aiohttp's resolvers do.
        self._resolver = resolver
        # TLS verification: the system's trust store unless a context is given (a private CA).
        self._ssl_context = ssl_context
        self._pool: http1.Pool | None = None
        self._prepared: dict[tuple, _Prepared] = {}

    def _make_pool(self) -> http1.Pool:
        # Built lazily inside the running loop: the pool's connections belong to it.
        self._pool = http1.Pool(
            allow=self.policy.refusal_for_host,
            resolver=self._resolver,
            limit=self._limit,
            dns_ttl=self._dns_ttl,
            ssl_context=self._ssl_context,
        )
        return self._pool

    async def __aenter__(self) -> SafeClient:
        if self._pool is None:
            self._make_pool()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()

    def _prepare(self, method: str, url: str, prefixes: tuple | None) -> _Prepared:
        key = (method, url, prefixes)
        p = self._prepared.get(key)
        if p is not None:
            return p
        try:
            parsed = _parse_url(url)
            if prefixes is not None and not _parsed_url_allowed(parsed, prefixes):
                raise TargetRefused(f"{url} is not on the tenant's allowlist")
            host = parsed.raw_host or ""
            if http1.is_ip_literal(host):
                # A literal is never resolved, so it is checked here, once (the policy is fixed).
                reason = self.policy.refusal_for_host(host)
                if reason is not None:
                    raise TargetRefused(reason)
            if not method or not _TOKEN.issuperset(method):
                raise TargetRefused(f"method {method!r} is not an HTTP method")
            head = f"{method} {parsed.raw_path_qs or '/'} HTTP/1.1\r\nHost: {parsed.host_port_subcomponent}\r\n"
            p = _Prepared(parsed.scheme, host, parsed.port, head.encode("ascii"))
        except TargetRefused as exc:
            p = _Prepared(refusal=exc.reason)
        if len(self._prepared) > 4096:
            self._prepared.clear()
        self._prepared[key] = p
        return p

    @staticmethod
    def _header_lines(headers: dict[str, str], body: bytes | None, method: str) -> bytes:
        lines = []
        lows = []
        for name, value in headers.items():
            # A known name with a printable value of allowed length is all the rule would check,
            # so that is decided here without calling it: this runs for every header of every call.
            low = _names.get(name)
            if low is None or value.__class__ is not str or len(value) > MAX_HEADER_VALUE or not value.isprintable():
                low = _checked_name(name, value)
            lows.append(low)
            lines.append(f"{name}: {value}\r\n")
        names = set(lows)
        if len(names) < len(lows):
            # {"X-A": .., "x-a": ..} would go out as two lines that targets read differently.
            twice = next(name for name, low in zip(headers, lows) if lows.count(low) > 1)
            raise TargetRefused(f"header {twice!r} is given more than once (names are case-insensitive)")
        if "user-agent" not in names:
            lines.append(_DEFAULT_UA)
        if "accept-encoding" not in names:
            lines.append("Accept-Encoding: identity\r\n")  # the byte cap counts wire bytes
        if body is not None or method in _BODY_METHODS:
            lines.append(f"Content-Length: {len(body) if body else 0}\r\n")
        lines.append("\r\n")
        return "".join(lines).encode("utf-8")

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: dict[str, str],
        body: bytes | None,
        timeout: float,
        allowed_prefixes: Iterable[str] | None,
    ) -> HttpResult:
        """Make one call. Never raises for target problems (refusals and network errors come
        back as a failed HttpResult); only asyncio.CancelledError propagates.

        ``allowed_prefixes=None`` skips the prefix allowlist (for callers whose URLs are not
        tenant-chosen); the scheme, userinfo and address checks apply regardless."""
        started = time.perf_counter()
        prefixes = None if allowed_prefixes is None else (
            allowed_prefixes if isinstance(allowed_prefixes, tuple) else tuple(allowed_prefixes))
        p = self._prepare(method, url, prefixes)
        if p.refusal is not None:
            return _refused(p.refusal, started)
        try:
            data = p.head + self._header_lines(headers, body, method) + (body or b"")
        except TargetRefused as exc:
            return _refused(exc.reason, started)

        if not timeout > 0:
            # A caller whose lease has run out gets a timeout without a call.
            return _failure("TimeoutError", f"no time left for the call (timeout {timeout:g}s)", started, retryable=True)

        pool = self._pool or self._make_pool()
        conn = None
        try:
            # One total limit over resolving, connecting, sending and reading. The usual call
            # takes a kept-alive connection without waiting and pays for one timer only.
            deadline = pool.loop.time() + timeout
            conn = pool.take_idle(p.scheme, p.host, p.port)
            if conn is None:
                async with asyncio.timeout_at(deadline):
                    conn = await pool.acquire(p.scheme, p.host, p.port)
            waiter = conn.send(data, cap=self.max_response_bytes, keep=self.excerpt_bytes, head=method == "HEAD")
            timer = pool.loop.call_at(deadline, conn.expire)
            try:
                answer = await waiter
            finally:
                timer.cancel()
        except asyncio.CancelledError:
            if conn is not None:
                conn.close()  # a half-done call's connection is never reused
            raise
        except TimeoutError:
            if conn is not None:
                conn.close()
            return _failure("TimeoutError", f"timed out after {timeout:g}s", started, retryable=True,
                            remote=conn.remote if conn is not None else None, sent=conn is not None)
        except http1.AddressRefused as exc:
            return _refused(exc.reason, started)
        except http1.CallError as exc:
            # Connection failures, and disconnects or malformed answers after the request may
            # have been sent (outcome unknown, so retryable: the target dedupes on the key).
            return _failure(exc.name, exc.message, started, retryable=True, remote=conn.remote if conn else None,
                            sent=exc.sent)
        except Exception as exc:  # a bug here must not kill a worker loop; surface it as permanent
            if conn is not None:
                conn.close()
            logger.exception("unexpected error calling %s", url)
            return _failure(type(exc).__name__, str(exc) or type(exc).__name__, started, retryable=False,
                            remote=conn.remote if conn is not None else None, sent=conn is not None)
        pool.release(conn)  # a no-op when the answer left the connection unusable

        latency_ms = int((time.perf_counter() - started) * 1000)
        status = answer.status
        if 200 <= status < 300:
            return HttpResult(status, HttpOutcome.SUCCEEDED, False, None, None, None, answer.excerpt, latency_ms, answer.remote)
        retryable = status >= 500 or status in _RETRYABLE_4XX
        return HttpResult(
            status,
            HttpOutcome.FAILED,
            retryable,
            parse_retry_after(answer.retry_after) if answer.retry_after else None,
            "HTTPStatus",
            f"HTTP {status}",
            answer.excerpt,
            latency_ms,
            answer.remote,
        )


# --------------------------------------------------------------------------- helpers


def client_from_settings(**overrides: Any) -> SafeClient:
    """A SafeClient configured from Django settings; keyword arguments override them."""
    # Read when called, not at import: this module loads without Django's configuration (the
    # benchmarks, the tests that hand it settings of their own).
    from django.conf import settings

    kwargs: dict[str, Any] = {
        "allowed_networks": parse_networks(getattr(settings, "SCHEDULER_TARGET_ALLOWED_NETWORKS", [])),
        "max_response_bytes": getattr(settings, "SCHEDULER_MAX_RESPONSE_BYTES", 65536),
        "excerpt_bytes": getattr(settings, "SCHEDULER_RESPONSE_EXCERPT_BYTES", 1024),
    }
    kwargs.update(overrides)
    return SafeClient(**kwargs)


def request_sync(
    method: str,
    url: str,
    *,
    headers: dict[str, str],
    body: bytes | None,
    timeout: float,
    allowed_prefixes: Iterable[str] | None,
    **client_kwargs: Any,
) -> HttpResult:
    """One call on a fresh client, for non-hot paths (admin "test target" buttons, commands).
    Not for use inside a running event loop."""

    async def run() -> HttpResult:
        async with SafeClient(**client_kwargs) as client:
            return await client.request(
                method, url, headers=headers, body=body, timeout=timeout, allowed_prefixes=allowed_prefixes
            )

    return asyncio.run(run())
