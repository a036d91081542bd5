"""/healthz (process up) and /readyz (database reachable, migrations applied)."""

from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.http import JsonResponse


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
