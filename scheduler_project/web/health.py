"""/healthz (process up), /readyz (database reachable, migrations applied) and /metrics
(Prometheus text, optionally restricted to SCHEDULER_METRICS_ALLOWED_NETWORKS)."""

import ipaddress

from django.conf import settings
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpResponse, HttpResponseForbidden, JsonResponse
from prometheus_client import CONTENT_TYPE_LATEST

from dispatch.metrics import exposition
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


def _allowed(request) -> bool:
    networks = settings.SCHEDULER_METRICS_ALLOWED_NETWORKS
    if not networks:
        return True
    try:
        addr = ipaddress.ip_address(client_address(request))
    except ValueError:
        return False
    return any(addr in ipaddress.ip_network(n, strict=False) for n in networks)


def metrics_view(request):
    if not _allowed(request):
        return HttpResponseForbidden("metrics are restricted to SCHEDULER_METRICS_ALLOWED_NETWORKS\n")
    return HttpResponse(exposition(), content_type=CONTENT_TYPE_LATEST)
