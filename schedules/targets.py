"""Which URLs a tenant may call: its operator-managed allowlist of URL prefixes.

Used when a schedule is created or edited (the API refuses a target off the list) and by the
outbound HTTP layer (dispatch.safehttp) on every call, so both parse a URL the same way.
Comparison is on parsed, normalised parts, never on raw strings, so `https://api.example.com`
does not allow `https://api.example.com.evil.net/` or `https://api.example.com@evil.net/`.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from yarl import URL


class TargetRefused(Exception):
    """Permanent: the URL or the address is not allowed. ``reason`` says why."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason



# --------------------------------------------------------------------------- URLs


@dataclass(frozen=True, slots=True)
class _Prefix:
    scheme: str
    host: str
    port: int
    path: str


def _norm_host(raw_host: str) -> str:
    host = raw_host.lower()
    if host.endswith("."):
        host = host[:-1]
    if ":" in host:
        try:
            host = ipaddress.IPv6Address(host.split("%")[0]).compressed
        except ValueError:
            pass
    return host


_BAD_URL_CHARS = frozenset(chr(c) for c in range(0x21)) | {"\x7f", "\\"}


def _raw_authority(url: str) -> str:
    start = url.find("//")
    if start < 0:
        return ""
    start += 2
    end = len(url)
    for sep in "/?#":
        i = url.find(sep, start)
        if 0 <= i < end:
            end = i
    return url[start:end]


def _parse_url(url: str) -> URL:
    """Parse a target URL strictly; raises TargetRefused. The returned URL object is the one
    the request line is built from, so the check and the request can never parse the string differently."""
    if not url or len(url) > 8192:
        raise TargetRefused("URL is empty or too long")
    if not _BAD_URL_CHARS.isdisjoint(url):
        raise TargetRefused("URL contains whitespace, control characters or backslashes")
    try:
        parsed = URL(url)
    except (ValueError, TypeError) as exc:
        raise TargetRefused(f"URL does not parse: {exc}") from None
    scheme = parsed.scheme
    if scheme not in ("http", "https"):
        raise TargetRefused(f"scheme {scheme!r} is not allowed (only http and https)")
    # yarl drops an empty userinfo ('https://@host/'), so look at the string as written too.
    if "@" in _raw_authority(url) or parsed.raw_user is not None or parsed.raw_password is not None:
        raise TargetRefused("URLs with userinfo are not allowed")
    if not parsed.raw_host:
        raise TargetRefused("URL has no host")
    if parsed.port is None:
        raise TargetRefused("URL has no port")
    return parsed


@functools.lru_cache(maxsize=4096)
def _parse_prefix(prefix: str) -> _Prefix | None:
    """A tenant prefix, or None when it can never match (malformed, userinfo, query...)."""
    try:
        parsed = _parse_url(prefix)
    except TargetRefused:
        return None
    if parsed.raw_query_string or parsed.raw_fragment or "?" in prefix or "#" in prefix:
        return None
    path = parsed.path
    if _has_dot_segments(path):
        return None
    return _Prefix(parsed.scheme, _norm_host(parsed.raw_host or ""), parsed.port or 0, path)


def _has_dot_segments(path: str) -> bool:
    # yarl removes literal dot segments; any left came from percent-encoding (%2e%2e), which a
    # server may decode and resolve, escaping the prefix.
    if "." not in path:
        return False
    return any(seg in (".", "..") for seg in path.split("/"))


def _path_within(path: str, prefix_path: str) -> bool:
    if prefix_path in ("", "/"):
        return True
    if prefix_path.endswith("/"):
        return path.startswith(prefix_path)
    # '/hooks' allows '/hooks' and '/hooks/x', not '/hooksevil'.
    return path == prefix_path or path.startswith(prefix_path + "/")


def _parsed_url_allowed(parsed: URL, prefixes: Iterable[str]) -> bool:
    path = parsed.path  # decoded: '%2F' becomes '/', so an encoded slash cannot fake a segment
    if _has_dot_segments(path):
        return False
    scheme = parsed.scheme
    host = _norm_host(parsed.raw_host or "")
    port = parsed.port
    for raw in prefixes:
        p = _parse_prefix(raw)
        if p is None:
            continue
        if p.scheme == scheme and p.host == host and p.port == port and _path_within(path, p.path):
            return True
    return False


def url_allowed(url: str, prefixes: Iterable[str]) -> bool:
    """Whether ``url`` starts with one of ``prefixes``, compared on normalised components:
    scheme, lowercase host (trailing dot and IPv6 spelling normalised), port with defaults
    filled, and the path on a segment boundary (a prefix path ending in '/' matches as written).
    URLs with userinfo, non-http(s) schemes, or encoded dot segments are never allowed; prefixes
    with a query or fragment match nothing."""
    try:
        parsed = _parse_url(url)
    except TargetRefused:
        return False
    return _parsed_url_allowed(parsed, prefixes)


@functools.lru_cache(maxsize=20_000)
def target_host(url: str) -> str:
    """host:port of a target URL, the key of per-target concurrency budgets."""
    try:
        parsed = _parse_url(url)
    except TargetRefused:
        return ""
    return f"{_norm_host(parsed.raw_host or '')}:{parsed.port}"
