"""Request signatures for target calls and webhooks.

Target calls carry `X-Scheduler-Signature: t=<unix seconds>,v1=<hex>,v2=<hex>`.

- `v2` binds the call: HMAC-SHA256(secret, the lines "v2", t, the method, the target URL, the
  values of SIGNED_HEADERS in that order, and the hex SHA-256 of the body, joined by "\\n"). A call
  captured on its way to a target cannot be re-sent as another run, under another
  `Idempotency-Key`, with another generation or to another URL: each changes the signed string.
- `v1` is HMAC-SHA256(secret, "<t>." + body): the body and the time only, so a captured call can
  be re-sent with other headers inside the tolerance window. It is still sent alongside v2 (unless
  SCHEDULER_SIGNATURE_V1 is off) so targets written against it keep working while they move to v2.

Webhooks carry `t=...,v1=...` only: their signed body holds the event's id, kind and run, so v1
binds them already.

docs/api.md has the copyable verification snippet; tests run it against what this module signs.
"""

import hashlib
import hmac
import time

HEADER = "X-Scheduler-Signature"

# The call's headers that v2 signs, in the signed order (their names are in the docs' snippet).
SIGNED_HEADERS = (
    "Idempotency-Key",
    "X-Scheduler-Run-Id",
    "X-Scheduler-Generation",
    "X-Scheduler-Scheduled-Time",
    "X-Scheduler-Schedule-Id",
    "X-Scheduler-Schedule-Version",
)


def _mac(secret: str, message: bytes) -> str:
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def _v1(secret: str, body: bytes, t: int) -> str:
    return _mac(secret, f"{t}.".encode() + body)


def body_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def call_string(t: int, method: str, url: str, headers, digest: str) -> bytes:
    """What v2 signs. HTTP header values, methods and URLs hold no line breaks, so the lines are
    unambiguous."""
    values = [headers.get(name, "") for name in SIGNED_HEADERS]
    return "\n".join(["v2", str(t), method.upper(), url, *values, digest]).encode()


def sign(secret: str, body: bytes, timestamp: int | None = None) -> str:
    """`t=...,v1=...`: a webhook's signature (its body names the event)."""
    t = int(time.time()) if timestamp is None else timestamp
    return f"t={t},v1={_v1(secret, body, t)}"


def sign_call(secret: str, *, method: str, url: str, headers, body: bytes, timestamp: int | None = None,
              with_v1: bool = True, digest: str | None = None) -> str:
    """A target call's signature: `t=...,v1=...,v2=...` (v1 only when `with_v1`). `headers` holds
    the call's SIGNED_HEADERS; `digest` is body_digest(body) when the caller has it already."""
    t = int(time.time()) if timestamp is None else timestamp
    v2 = _mac(secret, call_string(t, method, url, headers, digest or body_digest(body)))
    return f"t={t},v1={_v1(secret, body, t)},v2={v2}" if with_v1 else f"t={t},v2={v2}"


def _parts(header: str) -> tuple[int, dict] | None:
    try:
        parts = dict(p.split("=", 1) for p in header.split(","))
        return int(parts["t"]), parts
    except (ValueError, KeyError):
        return None


def _recent(t: int, tolerance: int, now: float | None) -> bool:
    return abs((time.time() if now is None else now) - t) <= tolerance


def verify(secret: str, header: str, body: bytes, *, tolerance: int = 300, now: float | None = None) -> bool:
    """The v1 check (body and time only): right for webhooks; for target calls use verify_call."""
    parsed = _parts(header)
    if parsed is None or not _recent(parsed[0], tolerance, now):
        return False
    return hmac.compare_digest(_v1(secret, body, parsed[0]), parsed[1].get("v1", ""))


def verify_call(secret: str, *, method: str, url: str, headers, body: bytes, tolerance: int = 300,
                now: float | None = None) -> bool:
    """The v2 check of a target call, as a target does it: `headers` is the request's headers."""
    parsed = _parts(headers.get(HEADER, ""))
    if parsed is None or not _recent(parsed[0], tolerance, now):
        return False
    t, parts = parsed
    expected = _mac(secret, call_string(t, method, url, headers, body_digest(body)))
    return hmac.compare_digest(expected, parts.get("v2", ""))
