"""Which URLs a tenant may call: its operator-managed allowlist of URL prefixes.

Comparison is on parsed, normalised parts, never on raw strings, so `https://api.example.com`
does not allow `https://api.example.com.evil.net/` or `https://api.example.com@evil.net/`.
"""

from collections.abc import Iterable
from urllib.parse import urlsplit

_DEFAULT_PORTS = {"http": 80, "https": 443}


def _parts(url: str):
    p = urlsplit(url.strip())
    scheme = p.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not p.hostname or p.username is not None or p.password is not None:
        return None
    try:
        port = p.port or _DEFAULT_PORTS[scheme]
    except ValueError:
        return None
    return scheme, p.hostname.lower().rstrip("."), port, p.path or "/"


def url_allowed(url: str, prefixes: Iterable[str]) -> bool:
    target = _parts(url)
    if target is None:
        return False
    for prefix in prefixes:
        allowed = _parts(prefix)
        if allowed is None or allowed[:3] != target[:3]:
            continue
        path, want = target[3], allowed[3]
        # A prefix path ending in "/" matches below it; otherwise it must match a whole segment
        # ("/hooks" allows "/hooks" and "/hooks/x", not "/hooksmith").
        if want.endswith("/"):
            if path.startswith(want) or path + "/" == want:
                return True
        elif path == want or path.startswith(want + "/"):
            return True
    return False
