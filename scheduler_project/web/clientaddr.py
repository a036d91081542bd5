"""The address a request came from, for the audit log and the /metrics allowlist.

Behind a load balancer REMOTE_ADDR is the balancer's. X-Forwarded-For is believed only as far as
it was written by proxies the operator listed in SCHEDULER_TRUSTED_PROXIES: the header is read
from the right (each proxy appends the address it saw), skipping trusted proxies, and the first
address that is not one is the client. Anything to its left is whatever the client sent, so it
is never used. With no trusted proxies the header is ignored.
"""

import ipaddress
from functools import lru_cache

from django.conf import settings


@lru_cache(maxsize=8)
def _networks(spec: tuple) -> tuple:
    return tuple(ipaddress.ip_network(n, strict=False) for n in spec)


def _trusted(addr, networks) -> bool:
    return any(addr in n for n in networks)


def client_address(request) -> str:
    remote = request.META.get("REMOTE_ADDR", "")
    networks = _networks(tuple(settings.SCHEDULER_TRUSTED_PROXIES))
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
    if not networks or not forwarded:
        return remote
    try:
        current = ipaddress.ip_address(remote)
    except ValueError:
        return remote
    for hop in reversed([h.strip() for h in forwarded.split(",")]):
        if not _trusted(current, networks):
            break
        try:
            current = ipaddress.ip_address(hop)
        except ValueError:
            break  # a garbled entry: the last proxy we trust is as far as we can see
    return str(current)
