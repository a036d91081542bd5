"""Which URLs a tenant may call (its operator-managed allowlist of URL prefixes), and which
headers a call to them may carry.

Used when a schedule is created or edited (the API refuses a target off the list, or a header
the rule refuses) and by the outbound HTTP layer (dispatch.safehttp) on every call, so both parse
a URL and judge a header the same way. URLs are compared on parsed, normalised parts, never on
raw strings, so `https://api.example.com` does not allow `https://api.example.com.evil.net/` or
`https://api.example.com@evil.net/`.
"""

from __future__ import annotations

import functools
import ipaddress
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.db.models import CharField, Func
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


def url_shape_problem(url: str) -> str | None:
    """None when ``url`` is an absolute http(s) URL with a host, else what is wrong with it: the
    one shape check of a schedule's target (the allowlist is checked after it). A URL the
    standard library or yarl cannot split (an unbalanced IPv6 bracket, `http://[::1`) is a message
    here, not an exception for the caller (it was a 500 on create, edit and batch)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        URL(url)  # what the call is made with: stricter about what follows a bracket
    except (ValueError, TypeError) as exc:
        return (f"url does not parse ({exc}); an IPv6 address is written in matching brackets, "
                "e.g. http://[2001:db8::1]:8080/")
    if parts.scheme not in ("http", "https") or not host:
        return "url must be an absolute http:// or https:// URL"
    return None


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


def host_key(text: str) -> str | None:
    """The key target_host gives (`example.com:443`, `::1:9000`) for one a person typed as a
    filter (`Example.COM:443`, `[::1]:9000`, or the key itself), or None when it is not a host
    and a port: a filter that can match nothing is refused rather than answered with nothing."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if ":" not in host:
            return None
    elif "[" in host or "]" in host:
        return None
    if ":" in host:
        try:
            ipaddress.IPv6Address(host.split("%")[0])
        except ValueError:
            return None
    return f"{_norm_host(host)}:{int(port)}"


# --------------------------------------------------------------------------- headers

MAX_HEADER_NAME = 100
MAX_HEADER_VALUE = 2000
MAX_TARGET_HEADERS = 50

# RFC 9110 tchar: the only characters a field name may have.
_TCHAR = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")

# The connection's own headers (RFC 9110 7.6.1 and 7.8, RFC 9112 6 and 9.6), owned by the
# transport: a Content-Length or Transfer-Encoding that disagrees with the body it frames is
# request smuggling, Host would pick another virtual host on an allowed address, Connection,
# Keep-Alive, TE, Trailer and Upgrade change what the connection does after this call, and
# Expect asks for a 100-continue handshake the transport does not do. Exact names: `Hostname`
# or `Upgrade-Insecure-Requests` are ordinary headers.
CONNECTION_HEADERS = frozenset({
    "connection", "content-length", "expect", "host", "http2-settings", "keep-alive",
    "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
})
# Proxy-Authorization and the rest of the family are for a proxy, and calls never use one.
_PROXY_PREFIX = "proxy-"

# What the scheduler sets on every call (docs/api.md, "On the target side"): a schedule may not
# override them, or a target could no longer trust the run id, fencing token or signature.
# traceparent too: it carries the run's trace and the attempt's span (runs.tracecontext); a
# schedule's `tracestate` is sent with it as given.
SCHEDULER_HEADERS = frozenset({"content-type", "idempotency-key", "traceparent"})
SCHEDULER_PREFIX = "x-scheduler-"

# Value characters that end or split a header line somewhere: C0 controls but HTAB, DEL, the
# C1 controls (NEL, U+0085, is a line break to some parsers), Unicode's line and paragraph
# separators, and lone surrogates (they have no UTF-8 encoding, so they cannot be sent at all).
_BAD_VALUE_CATEGORIES = frozenset({"Cc", "Cs", "Zl", "Zp"})


def _value_problem(name: str, value: str) -> str | None:
    if len(value) > MAX_HEADER_VALUE:
        return f"the value of header {name!r} is over {MAX_HEADER_VALUE} characters"
    # isprintable() is one C pass that is true for nearly every real value; only values with a
    # tab, an unusual space or a control character are looked at one character at a time.
    if not value.isprintable():
        for ch in value:
            if ch != "\t" and unicodedata.category(ch) in _BAD_VALUE_CATEGORIES:
                return f"the value of header {name!r} contains the control character U+{ord(ch):04X}"
    return None


def header_problem(name: object, value: object, *, by_scheduler: bool = False) -> str | None:
    """None when the header ``name: value`` may go out on a call to a target, else why not.

    The one rule for target headers: the API applies it to a schedule's headers and the
    outbound layer (dispatch.safehttp) to every header of every call, so a row stored before a
    rule tightened is refused at call time rather than sent. The name must be an RFC 9110 token
    of at most MAX_HEADER_NAME characters and not one of the connection's own headers
    (CONNECTION_HEADERS, Proxy-*); the value a string of at most MAX_HEADER_VALUE characters with
    no control character but HTAB. ``by_scheduler=False`` (a schedule's headers) also refuses the
    names the scheduler sets itself (Content-Type, Idempotency-Key, X-Scheduler-*);
    the outbound layer passes True because those headers are the scheduler's own."""
    if not isinstance(name, str):
        return f"header name {name!r} is not a string"
    shown = name[:MAX_HEADER_NAME]
    if not name or len(name) > MAX_HEADER_NAME or not _TCHAR.issuperset(name):
        return f"header name {shown!r} is not an HTTP token of 1 to {MAX_HEADER_NAME} characters"
    low = name.lower()
    if low in CONNECTION_HEADERS or low.startswith(_PROXY_PREFIX):
        return f"header {name!r} belongs to the connection and is set by the scheduler's HTTP client"
    if not by_scheduler and (low in SCHEDULER_HEADERS or low.startswith(SCHEDULER_PREFIX)):
        return f"header {name!r} is set by the scheduler and cannot be overridden"
    if not isinstance(value, str):
        return f"the value of header {name!r} is not a string"
    return _value_problem(name, value)


def target_header_problems(headers: object) -> list[str]:
    """Every reason a schedule's ``target_headers`` cannot be sent (empty when they can): each
    header by ``header_problem``, at most MAX_TARGET_HEADERS of them, no name given twice in
    different cases (both would go out, and targets read repeated headers differently)."""
    if headers is None:
        return []
    if not isinstance(headers, dict):
        return ["headers must be an object of header names to string values"]
    problems = []
    if len(headers) > MAX_TARGET_HEADERS:
        problems.append(f"at most {MAX_TARGET_HEADERS} headers")
    seen: set[str] = set()
    for name, value in headers.items():
        problem = header_problem(name, value)
        if problem is not None:
            problems.append(problem)
        elif name.lower() in seen:
            problems.append(f"header {name!r} is given more than once (names are case-insensitive)")
        else:
            seen.add(name.lower())
    return problems


# --------------------------------------------------------------------------- origins in SQL


def origin_sql(column: str, vendor: str) -> str:
    """SQL for the origin (`scheme://authority`) of the URL in `column`: the part target_host reads,
    so that target_host(origin) == target_host(url). Grouping by it instead of the whole URL makes
    schedules whose URLs differ only in their path one group (a fleet with an id in every URL is
    otherwise a group per schedule)."""
    if vendor == "postgresql":
        return f"coalesce(substring({column} from '^[^:/?#]+://[^/?#]*'), {column})"
    rest = f"substr({column}, instr({column}, '://') + 3)"
    slash, query, fragment = (f"instr({rest}, '{ch}')" for ch in "/?#")
    # The authority ends at the first of '/', '?' and '#' after '://' (SQLite has no regular expressions).
    length = (f"(CASE WHEN {slash} > 0 AND ({query} = 0 OR {slash} < {query}) AND ({fragment} = 0 OR {slash} < {fragment}) "
              f"THEN {slash} - 1 WHEN {query} > 0 AND ({fragment} = 0 OR {query} < {fragment}) THEN {query} - 1 "
              f"WHEN {fragment} > 0 THEN {fragment} - 1 ELSE length({rest}) END)")
    return f"(CASE WHEN instr({column}, '://') = 0 THEN {column} ELSE substr({column}, 1, instr({column}, '://') + 2 + {length}) END)"


class UrlOrigin(Func):
    """origin_sql as an ORM expression over a URL field."""

    output_field = CharField()

    def as_sql(self, compiler, connection, **extra):
        sql, params = compiler.compile(self.source_expressions[0])
        if params:
            raise ValueError("UrlOrigin takes a column, not a value")
        return origin_sql(sql, connection.vendor), []
