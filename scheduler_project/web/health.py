"""/healthz (process up), /readyz (database reachable, migrations applied) and /metrics
(Prometheus text).

/metrics names tenants and their backlogs, so it is not open to everyone by default: it answers
a client on SCHEDULER_METRICS_ALLOWED_NETWORKS (default: loopback only, so a Prometheus or a curl on
the same host, and the quickstart, need nothing), a request carrying
`Authorization: Bearer <SCHEDULER_METRICS_TOKEN>` from anywhere (Prometheus' `authorization`
scrape setting), and a signed-in operator; anyone else gets 403 saying how to get in.
"""

import hmac
import ipaddress

from django.conf import settings
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpResponse, HttpResponseForbidden, JsonResponse
from prometheus_client import CONTENT_TYPE_LATEST

from dispatch.metrics import exposition
from scheduler_project.web.access import is_operator
from scheduler_project.web.clientaddr import client_address


def healthz(request):
    return JsonResponse({"status": "ok"})


def readyz(request):
    try:
        executor = MigrationExecutor(connection)
        pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except Exception as exc:
        return JsonResponse({"status": "unavailable", "error": f"database: {type(exc).__name__}"}, status=503)
    if pending:
        return JsonResponse({"status": "unavailable", "error": f"{len(pending)} migrations not applied"}, status=503)
    return JsonResponse({"status": "ok"})


def _token_ok(request) -> bool:
    token = settings.SCHEDULER_METRICS_TOKEN
    given = request.META.get("HTTP_AUTHORIZATION", "")
    return bool(token) and given.startswith("Bearer ") and hmac.compare_digest(given[7:].strip().encode(), token.encode())


def _allowed(request) -> bool:
    if _token_ok(request) or is_operator(getattr(request, "user", None)):
        return True
    networks = settings.SCHEDULER_METRICS_ALLOWED_NETWORKS
    try:
        addr = ipaddress.ip_address(client_address(request))
    except ValueError:
        return False
    if addr.version == 6 and addr.ipv4_mapped:  # a dual-stack bind reports IPv4 peers so
        addr = addr.ipv4_mapped
    return any(addr in ipaddress.ip_network(n, strict=False) for n in networks)


def metrics_view(request):
    if not _allowed(request):
        return HttpResponseForbidden("metrics are for SCHEDULER_METRICS_ALLOWED_NETWORKS (default: loopback), a "
                                     "bearer SCHEDULER_METRICS_TOKEN, or a signed-in operator\n")
    return HttpResponse(exposition(), content_type=CONTENT_TYPE_LATEST)
