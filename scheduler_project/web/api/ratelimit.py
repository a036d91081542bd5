"""Per-key API rate limit: a fixed one-minute window counted in the database.

The count lives in the database, not in process memory, because the web tier is several gunicorn
workers on several machines: a per-process counter would let each of them allow the full limit.
Counting a request is one upsert: insert the (key, minute) row or add one to it, returning the new
count and the seconds left in the window. On PostgreSQL that upsert is part of the API's key
lookup (keylookup.find_key), on the database clock so every worker agrees on where a minute
starts, and costs no round trip of its own; on the embedded SQLite database the lookup calls `hit`.

A fixed window lets a client burst up to twice the limit across a window edge; that is the price
of one cheap row per key instead of a log of request times, and fine for a guard against runaway
clients (it is not a billing meter)."""

import math
from datetime import datetime, timezone

from django.conf import settings
from django.db import connection
from rest_framework.throttling import BaseThrottle

_PG_PRUNE = """
DELETE FROM schedules_apiratecounter
WHERE key_id = %s AND window_start < date_trunc('minute', statement_timestamp())
"""

# The embedded database has one machine, so its clock is the process's clock.
_HIT = """
INSERT INTO schedules_apiratecounter (key_id, window_start, count) VALUES (%s, %s, 1)
ON CONFLICT (key_id, window_start) DO UPDATE SET count = schedules_apiratecounter.count + 1
RETURNING count
"""
_PRUNE = "DELETE FROM schedules_apiratecounter WHERE key_id = %s AND window_start < %s"


def hit(key_id) -> tuple[int, float, datetime]:
    """Count one request for the key in a statement of its own, on this process's clock (the
    embedded database); returns (requests in this window, seconds until it ends, the time)."""
    now = datetime.now(timezone.utc)
    window = now.replace(second=0, microsecond=0)
    key = key_id.hex if connection.vendor == "sqlite" else key_id
    with connection.cursor() as cur:
        cur.execute(_HIT, [key, window])
        (count,) = cur.fetchone()
        if count == 1:
            # First request of a new window: the key's older windows are dead weight.
            cur.execute(_PRUNE, [key, window])
    return count, 60 - (now - window).total_seconds(), now


def prune(key_id) -> None:
    """On PostgreSQL, after the first request of a new window: the key's older windows are dead
    weight."""
    with connection.cursor() as cur:
        cur.execute(_PG_PRUNE, [key_id])


class PerKeyRateThrottle(BaseThrottle):
    """SCHEDULER_API_RATE_LIMIT_PER_MINUTE requests per API key per minute; 0 turns it off.
    Requests without a key are refused by authentication before this runs."""

    def __init__(self):
        self._wait = None

    def allow_request(self, request, view):
        limit = settings.SCHEDULER_API_RATE_LIMIT_PER_MINUTE
        # Counted by the key lookup (keylookup.find_key); None when the limit was off then.
        counted = getattr(request.user, "counted", None)
        if limit <= 0 or counted is None:
            return True
        count, left = counted
        if count <= limit:
            return True
        self._wait = max(1, math.ceil(left))
        return False

    def wait(self):
        return self._wait
