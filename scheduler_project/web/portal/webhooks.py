"""Whether a webhook URL leads somewhere the relay will call, asked when an operator saves it,
so a private address is refused then rather than at the first delivery. The address policy is
the outbound client's own (dispatch.safehttp.AddressPolicy with SCHEDULER_TARGET_ALLOWED_NETWORKS);
`schedules.tenants.update_tenant_settings` takes this check as an argument, since the schedules
app may not depend on dispatch."""

import ipaddress
import socket
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from django.conf import settings
from yarl import URL

from dispatch.safehttp import AddressPolicy, parse_networks

RESOLVE_SECONDS = 3.0
_resolver = ThreadPoolExecutor(2, thread_name_prefix="webhook-resolve")


def _addresses(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({info[4][0] for info in infos})


def webhook_address_check(url: str) -> tuple[str | None, str | None]:
    """(problem, warning): a problem when an address the URL's host leads to may not be called
    (the URL is refused); a warning when the name does not resolve now (it is kept: DNS may not
    be set up yet, and the relay checks the addresses again at every delivery)."""
    try:
        parsed = URL(url)
        host, port = parsed.raw_host or "", parsed.port or 443
    except (ValueError, TypeError):
        return "the URL does not parse", None
    policy = AddressPolicy(parse_networks(getattr(settings, "SCHEDULER_TARGET_ALLOWED_NETWORKS", [])))
    allow_hint = " (an operator can allow its network with SCHEDULER_TARGET_ALLOWED_NETWORKS)"
    try:
        ipaddress.ip_address(host.strip("[]"))
        literal = True
    except ValueError:
        literal = False
    if literal:
        reason = policy.refusal_for_host(host.strip("[]"))
        return (f"{reason}, which the relay refuses to call{allow_hint}" if reason else None), None
    try:
        addresses = _resolver.submit(_addresses, host, port).result(timeout=RESOLVE_SECONDS)
    except FutureTimeout:
        return None, f"{host} did not resolve within {RESOLVE_SECONDS:.0f} s, so its addresses were not checked"
    except OSError as e:
        return None, f"{host} does not resolve now ({e.strerror or e}), so its addresses were not checked"
    for address in addresses:
        reason = policy.refusal_for_host(address.split("%", 1)[0])
        if reason:
            return f"{host} resolves to {reason}, which the relay refuses to call{allow_hint}", None
    return None, None
