"""Request signatures for target calls and webhooks.

`X-Scheduler-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>." + body)>`: the target
recomputes the HMAC with the tenant's signing secret and refuses stale timestamps (replays).
The README has a copyable verification snippet.
"""

import hashlib
import hmac
import time

HEADER = "X-Scheduler-Signature"


def sign(secret: str, body: bytes, timestamp: int | None = None) -> str:
    t = int(time.time()) if timestamp is None else timestamp
    mac = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def verify(secret: str, header: str, body: bytes, *, tolerance: int = 300, now: float | None = None) -> bool:
    try:
        parts = dict(p.split("=", 1) for p in header.split(","))
        t = int(parts["t"])
    except (ValueError, KeyError):
        return False
    if abs((time.time() if now is None else now) - t) > tolerance:
        return False
    expected = sign(secret, body, t).split("v1=", 1)[1]
    return hmac.compare_digest(expected, parts.get("v1", ""))
