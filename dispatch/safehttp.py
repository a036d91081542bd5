"""The one outbound HTTP layer: every call to a tenant target and every webhook goes through here.

What it guarantees, whatever the URL or DNS says (runs.md, "Calling the target"):

- the URL is http(s), has no userinfo, and starts with one of the tenant's allowed prefixes,
  compared on parsed components (see ``url_allowed``);
- every address connected to was checked *after* resolution: ``CheckingResolver`` sits inside
  aiohttp's connector and returns only addresses that pass ``address_refusal``, so aiohttp
  connects to exactly what was checked (no DNS rebinding between check and connect). aiohttp
  skips the resolver for IP-literal hosts, so ``SafeClient.request`` checks those itself;
- non-public addresses are refused unless an operator network (SCHEDULER_TARGET_ALLOWED_NETWORKS)
  contains them; cloud metadata addresses stay refused even then, unless the list names the
  metadata address itself (a /32 or /128), because "allow 169.254.0.0/16 for a sidecar" must not
  silently hand tenants the instance credentials;
- redirects are returned, never followed; one total time limit per call; at most
  ``max_response_bytes`` of the body are read (then the connection is dropped, not drained) and
  ``excerpt_bytes`` kept;
- environment proxies are ignored (``trust_env=False``): a proxy would resolve the name itself
  and make the address check meaningless.

No maintained library does the address checking for aiohttp (``advocate`` is requests-only and
unmaintained since 2020; the newer ones wrap httpx), so it is written here on ``ipaddress``.
"""

from __future__ import annotations

import asyncio
import email.utils
import functools
import ipaddress
import logging
import os
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Union

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.client_proto import ResponseHandler
from aiohttp.helpers import is_ip_address
from aiohttp.resolver import DefaultResolver

# The allowlist lives with the tenants it belongs to; the API checks it at create time with the
# same code the workers use at call time.
from schedules.targets import TargetRefused, _parse_url, _parsed_url_allowed, url_allowed  # noqa: F401

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

# Headers whose value the layer owns: a caller-supplied Host would pick another virtual host on
# an allowed address, and framing headers that disagree with the body invite request smuggling.
_FORBIDDEN_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection"})

_RETRYABLE_4XX = frozenset({408, 429})


class _AddressRefused(OSError):
    # Raised inside the resolver. It must be an OSError: aiohttp wraps OSErrors from resolution
    # in ClientConnectorDNSError (anything else would escape as an unexpected exception).
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(slots=True)
class HttpResult:
    status: int | None
    outcome: str  # 'succeeded' (2xx) | 'failed'
    retryable: bool
    retry_after: float | None
    error_class: str | None
    error: str | None
    body_excerpt: bytes
    latency_ms: int
    remote_address: str | None


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


# --------------------------------------------------------------------------- resolver


class CheckingResolver(AbstractResolver):
    """Resolves with aiohttp's default resolver and returns only allowed addresses.

    aiohttp connects to exactly the list returned here (and caches that filtered list for the
    connector's DNS TTL), so the addresses checked are the addresses connected to."""

    def __init__(self, policy: AddressPolicy, inner: AbstractResolver | None = None):
        self._policy = policy
        self._inner = inner if inner is not None else DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        infos = await self._inner.resolve(host, port, family)
        allowed: list[ResolveResult] = []
        first_reason = None
        for info in infos:
            reason = self._policy.refusal_for_host(info["host"])
            if reason is None:
                allowed.append(info)
            elif first_reason is None:
                first_reason = reason
        if not allowed:
            # An empty list would trip an assertion inside aiohttp; refuse explicitly.
            raise _AddressRefused(f"{host} resolves only to refused addresses: {first_reason or 'no addresses'}")
        return allowed

    async def close(self) -> None:
        await self._inner.close()


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


def _os_error_text(err: OSError) -> str:
    # asyncio's "Connect call failed (...)" hides the reason; errno says "Connection refused".
    if err.errno:
        return os.strerror(err.errno)
    return str(err) or type(err).__name__


def _failure(error_class: str, error: str, started: float, *, retryable: bool, remote: str | None = None) -> HttpResult:
    return HttpResult(
        status=None,
        outcome="failed",
        retryable=retryable,
        retry_after=None,
        error_class=error_class,
        error=error,
        body_excerpt=b"",
        latency_ms=int((time.perf_counter() - started) * 1000),
        remote_address=remote,
    )


def _refused(reason: str, started: float) -> HttpResult:
    return _failure("TargetRefused", f"refused: {reason}", started, retryable=False)


# --------------------------------------------------------------------------- client


class _PeerRecordingHandler(ResponseHandler):
    peer_address: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer_address = peer[0]


class _Connector(aiohttp.TCPConnector):
    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        # Once per connection, not per call: remember the address the socket really reached.
        self._factory = functools.partial(_PeerRecordingHandler, loop=self._loop)


class SafeClient:
    """One ClientSession with a kept-alive connector; create one per event loop and share it:
    connection reuse is most of the throughput. The session is made on first use and belongs to
    that loop, so do not carry one client across ``asyncio.run`` calls. A caller's User-Agent
    header replaces the default one."""

    def __init__(
        self,
        *,
        allowed_networks: Iterable[IPNetwork | str] = (),
        max_response_bytes: int = 65536,
        excerpt_bytes: int = 1024,
        limit: int = 1000,
        limit_per_host: int = 0,
        dns_ttl: float = 10.0,
        resolver: AbstractResolver | None = None,
    ):
        if max_response_bytes < 0 or excerpt_bytes < 0:
            raise ValueError("byte limits must not be negative")
        self.policy = AddressPolicy(allowed_networks)
        self.max_response_bytes = max_response_bytes
        self.excerpt_bytes = min(excerpt_bytes, max_response_bytes)
        self._limit = limit
        self._limit_per_host = limit_per_host
        self._dns_ttl = dns_ttl
        # The inner resolver (tests put a stub here); wrapped by CheckingResolver either way.
        self._inner_resolver = resolver
        self._session: aiohttp.ClientSession | None = None
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}

    def _make_session(self) -> aiohttp.ClientSession:
        # Built lazily inside the running loop: aiohttp binds the resolver and connector to it.
        connector = _Connector(
            limit=self._limit,
            limit_per_host=self._limit_per_host,
            resolver=CheckingResolver(self.policy, self._inner_resolver),
            use_dns_cache=True,
            ttl_dns_cache=self._dns_ttl,
        )
        return aiohttp.ClientSession(
            connector=connector,
            trust_env=False,
            auto_decompress=False,  # the byte cap counts wire bytes; no decompression bombs
            headers={"User-Agent": USER_AGENT, "Accept-Encoding": "identity"},
            cookie_jar=aiohttp.DummyCookieJar(),  # tenants must not see each other's cookies
            raise_for_status=False,
        )

    async def __aenter__(self) -> SafeClient:
        if self._session is None:
            self._session = self._make_session()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    def _timeout(self, seconds: float) -> aiohttp.ClientTimeout:
        t = self._timeouts.get(seconds)
        if t is None:
            # ceil_threshold above any sane timeout: aiohttp otherwise rounds timeouts >= 5 s up
            # to the next whole second, which could push a call past its lease.
            t = aiohttp.ClientTimeout(total=seconds, ceil_threshold=1e9)
            if len(self._timeouts) < 256:
                self._timeouts[seconds] = t
        return t

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
        try:
            parsed = _parse_url(url)
            if allowed_prefixes is not None and not _parsed_url_allowed(parsed, allowed_prefixes):
                raise TargetRefused(f"{url} is not on the tenant's allowlist")
            host = parsed.raw_host or ""
            # aiohttp does not consult the resolver for what its own is_ip_address() calls an
            # IP literal, so check exactly those here (same function, so no gap between them).
            if is_ip_address(host):
                reason = self.policy.refusal_for_host(host)
                if reason is not None:
                    raise TargetRefused(reason)
            for name in headers:
                if name.lower() in _FORBIDDEN_HEADERS:
                    raise TargetRefused(f"header {name!r} may not be set by the caller")
        except TargetRefused as exc:
            return _refused(exc.reason, started)

        if not timeout > 0:
            # aiohttp reads total=0 as "no limit"; a caller whose lease has run out gets a
            # timeout without a call instead.
            return _failure("TimeoutError", f"no time left for the call (timeout {timeout:g}s)", started, retryable=True)

        session = self._session
        if session is None:
            session = self._session = self._make_session()

        remote: str | None = None
        try:
            async with session.request(
                method,
                parsed,
                headers=headers,
                data=body,
                allow_redirects=False,
                timeout=self._timeout(timeout),
            ) as resp:
                # resp.connection is already None when the whole body came with the headers,
                # and the transport is gone when the target closed, so the protocol records
                # its peer at connect time. Private attribute: a future aiohttp without it
                # leaves remote_address None (a test would say so).
                remote = getattr(getattr(resp, "_protocol", None), "peer_address", None)
                excerpt, complete = await self._read_capped(resp.content)
                if not complete:
                    # Drop the connection rather than drain an oversized body. aiohttp's release
                    # would also close a half-read connection; saying it here keeps that explicit.
                    resp.close()
                status = resp.status
                retry_after_header = resp.headers.get("Retry-After")
        except asyncio.CancelledError:
            raise
        except aiohttp.ClientConnectorDNSError as exc:
            os_error = exc.os_error
            if isinstance(os_error, _AddressRefused):
                return _refused(os_error.reason, started)
            return _failure(type(exc).__name__, f"cannot resolve {parsed.raw_host}: {os_error}", started, retryable=True)
        except aiohttp.InvalidURL as exc:
            return _refused(f"invalid URL: {exc}", started)
        except TimeoutError:
            # aiohttp's ServerTimeoutError variants and the total limit all land here.
            return _failure("TimeoutError", f"timed out after {timeout:g}s", started, retryable=True, remote=remote)
        except aiohttp.ClientConnectorError as exc:
            return _failure(
                type(exc).__name__,
                f"cannot connect to {exc.host}:{exc.port}: {_os_error_text(exc.os_error)}",
                started,
                retryable=True,
            )
        except (aiohttp.ClientError, OSError) as exc:
            # Disconnects and malformed answers after the request may have been sent: outcome
            # unknown, so retryable (the target dedupes on the Idempotency-Key).
            return _failure(type(exc).__name__, str(exc) or type(exc).__name__, started, retryable=True, remote=remote)
        except Exception as exc:  # a bug here must not kill a worker loop; surface it as permanent
            logger.exception("unexpected error calling %s", url)
            return _failure(type(exc).__name__, str(exc) or type(exc).__name__, started, retryable=False, remote=remote)

        latency_ms = int((time.perf_counter() - started) * 1000)
        if 200 <= status < 300:
            return HttpResult(status, "succeeded", False, None, None, None, excerpt, latency_ms, remote)
        retryable = status >= 500 or status in _RETRYABLE_4XX
        return HttpResult(
            status,
            "failed",
            retryable,
            parse_retry_after(retry_after_header) if retry_after_header else None,
            "HTTPStatus",
            f"HTTP {status}",
            excerpt,
            latency_ms,
            remote,
        )

    async def _read_capped(self, content: aiohttp.StreamReader) -> tuple[bytes, bool]:
        """Read at most max_response_bytes, keep excerpt_bytes. Returns (excerpt, read_to_end)."""
        cap = self.max_response_bytes
        keep = self.excerpt_bytes
        # Fast path: a small body that is already fully buffered costs one call.
        first = await content.read(cap) if cap else b""
        if not first:
            return b"", content.at_eof()
        excerpt = first[:keep] if len(first) > keep else first
        if content.at_eof():
            return excerpt, True  # the usual case: the whole small body came in one read
        got = len(first)
        while got < cap:
            chunk = await content.read(cap - got)
            if not chunk:
                return excerpt, True
            if len(excerpt) < keep:
                excerpt += chunk[: keep - len(excerpt)]
            got += len(chunk)
        return excerpt, content.at_eof()


# --------------------------------------------------------------------------- helpers


def client_from_settings(**overrides: Any) -> SafeClient:
    """A SafeClient configured from Django settings; keyword arguments override them."""
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
