"""Per-key API rate limit: a fixed one-minute window counted in the database.

The count lives in the database, not in process memory, because the web tier is several gunicorn
workers on several machines: a per-process counter would let each of them allow the full limit.
The web's store counts each request (scheduler_project.web.store: on PostgreSQL within the key
lookup, on the database clock, at no round trip of its own); this throttle only reads the count.

A fixed window lets a client burst up to twice the limit across a window edge; that is the price
of one cheap row per key instead of a log of request times, and fine for a guard against runaway
clients (it is not a billing meter)."""

import math

from django.conf import settings
from rest_framework.throttling import BaseThrottle


class PerKeyRateThrottle(BaseThrottle):
    """SCHEDULER_API_RATE_LIMIT_PER_MINUTE requests per API key per minute; 0 turns it off.
    Requests without a key are refused by authentication before this runs."""

    def __init__(self):
        self._wait = None

    def allow_request(self, request, view):
        limit = settings.SCHEDULER_API_RATE_LIMIT_PER_MINUTE
        # Counted by the key lookup (store.find_key); None when the limit was off then.
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
