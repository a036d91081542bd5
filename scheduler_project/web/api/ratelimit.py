"""Per-key API rate limit: a fixed one-minute window counted in the database.

The count lives in PostgreSQL, not in process memory, because the web tier is several gunicorn
workers on several machines: a per-process counter would let each of them allow the full limit.
One statement per request does the work: insert the (key, minute) row or add one to it, and return
the new count and the seconds left in the window, both from the database clock so every worker
agrees on where a minute starts. On PostgreSQL that statement is part of the API's key lookup
(keylookup.find_key), so counting costs no round trip of its own; on SQLite the lookup calls `hit`.

A fixed window lets a client burst up to twice the limit across a window edge; that is the price
of one cheap row per key instead of a log of request times, and fine for a guard against runaway
clients (it is not a billing meter)."""

import math
from datetime import datetime, timezone

from django.conf import settings
from django.db import connection
from rest_framework.throttling import BaseThrottle

# The count of one request: the key's row for this minute inserted, or one added to it. Formatted
# with `key` (the key id's expression) and `source` (what it is selected from), so the API's key
# lookup (keylookup.py) counts inside its own statement with this same text.
PG_COUNT_INTO_WINDOW = """INSERT INTO schedules_apiratecounter (key_id, window_start, count)
    SELECT {key}, date_trunc('minute', statement_timestamp()), 1 FROM {source}
    ON CONFLICT (key_id, window_start) DO UPDATE SET count = schedules_apiratecounter.count + 1
    RETURNING count, EXTRACT(EPOCH FROM (window_start + interval '1 minute' - statement_timestamp())) AS left_seconds"""

_PG_HIT = ("WITH counted AS (" + PG_COUNT_INTO_WINDOW.format(key="%s::uuid", source="(VALUES (1)) AS one")
           + ") SELECT count, left_seconds, statement_timestamp() FROM counted")

_PG_PRUNE = """
DELETE FROM schedules_apiratecounter
WHERE key_id = %s AND window_start < date_trunc('minute', statement_timestamp())
"""

# The embedded SQLite quickstart has one machine, so its clock is the process's clock.
_SQLITE_HIT = """
INSERT INTO schedules_apiratecounter (key_id, window_start, count) VALUES (%s, %s, 1)
ON CONFLICT (key_id, window_start) DO UPDATE SET count = schedules_apiratecounter.count + 1
RETURNING count
"""
_SQLITE_PRUNE = "DELETE FROM schedules_apiratecounter WHERE key_id = %s AND window_start < %s"


def hit(key_id) -> tuple[int, float, datetime]:
    """Count one request for the key; returns (requests in this window, seconds until it ends, the
    database clock when it was counted)."""
    with connection.cursor() as cur:
        if connection.vendor == "postgresql":
            cur.execute(_PG_HIT, [key_id])
            count, left, now = cur.fetchone()
            if count == 1:
                prune(key_id)
            return count, float(left), now
        now = datetime.now(timezone.utc)
        window = now.replace(second=0, microsecond=0)
        key = key_id.hex if connection.vendor == "sqlite" else key_id
        cur.execute(_SQLITE_HIT, [key, window])
        (count,) = cur.fetchone()
        if count == 1:
            cur.execute(_SQLITE_PRUNE, [key, window])
        return count, 60 - (now - window).total_seconds(), now


def prune(key_id) -> None:
    """After the first request of a new window: the key's older windows are dead weight."""
    with connection.cursor() as cur:
        cur.execute(_PG_PRUNE, [key_id])


class PerKeyRateThrottle(BaseThrottle):
    """SCHEDULER_API_RATE_LIMIT_PER_MINUTE requests per API key per minute; 0 turns it off.
    Requests without a key are refused by authentication before this runs."""

    def __init__(self):
        self._wait = None

    def allow_request(self, request, view):
        limit = settings.SCHEDULER_API_RATE_LIMIT_PER_MINUTE
        key = getattr(request.user, "key", None)
        if limit <= 0 or key is None:
            return True
        counted = getattr(request.user, "counted", None)
        if counted is None:
            count, left, now = hit(key.id)
            # The clock was read anyway: the view takes it as the request's time (dbclock.request_now).
            request.db_now = now
        else:
            count, left = counted  # by the key lookup itself (keylookup.find_key)
        if count <= limit:
            return True
        self._wait = max(1, math.ceil(left))
        return False

    def wait(self):
        return self._wait
