"""What retries cost, over HTTP: the tenant's ranking (GET /api/v1/retry-cost), and one
schedule's or owner's figures over both windows (GET /api/v1/schedules/{id}/retry-cost,
GET /api/v1/owners/{slug}/retry-cost). The figures come from dispatch.retry_cost; docs/incidents.md
("Retry cost") says what each one counts."""

from datetime import datetime

from drf_spectacular.utils import OpenApiParameter, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response

from dispatch import retry_cost
from dispatch.models import CostDimension
from scheduler_project.foundation.dbclock import db_now
from scheduler_project.foundation.errors import ValidationFailed
from scheduler_project.web.api.base import ApiView, operation
from scheduler_project.web.api.schedules import error_responses, tenant_schedule
from schedules.models import Owner, Schedule
from schedules.owners import get_owner

BY = {"schedule": CostDimension.SCHEDULE, "owner": CostDimension.OWNER, "target": CostDimension.TARGET}
MAX_LIMIT = 500


def _iso(dt: datetime) -> str:
    return dt.isoformat().replace("+00:00", "Z")


class CostOut(serializers.Serializer):
    attempts = serializers.IntegerField(help_text="attempts that ended in the window (succeeded, failed, unknown)")
    successes = serializers.IntegerField(help_text="succeeded attempts: one per run that succeeded")
    runs = serializers.IntegerField(help_text="attempts that were not a retry: runs whose first call ended")
    retries = serializers.IntegerField(help_text="attempts that followed a failed or unknown attempt of their run")
    retriedRuns = serializers.IntegerField(help_text="runs whose first retry ended in the window")
    failedAttempts = serializers.IntegerField()
    attemptsPerSuccess = serializers.FloatField(allow_null=True, help_text="attempts / successes")
    retryShare = serializers.FloatField(allow_null=True, help_text="retriedRuns / runs")
    failedSeconds = serializers.FloatField(help_text="time from start to end of the failed and unknown attempts")
    backoffSeconds = serializers.FloatField(help_text="time from the end of a failed attempt to the start of its retry")


def cost_json(c: retry_cost.RetryCost) -> dict:
    return {
        "attempts": c.attempts, "successes": c.successes, "runs": c.runs, "retries": c.retries,
        "retriedRuns": c.retried_runs, "failedAttempts": c.failed,
        "attemptsPerSuccess": round(c.attempts_per_success, 6) if c.attempts_per_success is not None else None,
        "retryShare": round(c.retry_share, 6) if c.retry_share is not None else None,
        "failedSeconds": round(c.failed_seconds, 6), "backoffSeconds": round(c.backoff_seconds, 6),
    }


def windows_json(tenant_id, dimension: str, key: str) -> dict:
    now = db_now()
    out = {}
    for window in retry_cost.WINDOWS:
        cost, complete = retry_cost.figures_for(tenant_id, dimension, key, window=window, now=now)
        out[window] = {"since": _iso(retry_cost.window_start(now, window)), "complete": complete, **cost_json(cost)}
    return {"asOf": _iso(now), **out}


WINDOW_OUT = inline_serializer("RetryCostWindow", {
    "since": serializers.DateTimeField(help_text="the start of the window's first hour"),
    "complete": serializers.BooleanField(help_text="false: more attempts were uncounted than one read adds"),
    **CostOut().fields,
})
WINDOWS_OUT = inline_serializer("RetryCostWindows", {"asOf": serializers.DateTimeField(), "24h": WINDOW_OUT,
                                                     "7d": WINDOW_OUT})


class RetryCostView(ApiView):
    @operation(
        operation_id="retry_cost_list",
        summary="What retries cost: this tenant's schedules, owners or target hosts, the costliest first",
        parameters=[
            OpenApiParameter("window", str, required=False, enum=list(retry_cost.WINDOWS), description="default 24h"),
            OpenApiParameter("by", str, required=False, enum=list(BY), description="default schedule"),
            OpenApiParameter("limit", int, required=False, description=f"1-{MAX_LIMIT}, default 50"),
        ],
        responses={200: inline_serializer("RetryCostPage", {
            "window": serializers.CharField(), "by": serializers.CharField(),
            "since": serializers.DateTimeField(), "asOf": serializers.DateTimeField(),
            "complete": serializers.BooleanField(),
            "results": inline_serializer("RetryCostRow", {
                "key": serializers.CharField(), "name": serializers.CharField(allow_blank=True), **CostOut().fields,
            }, many=True),
        }), **error_responses(400)},
    )
    def get(self, request):
        params = request.query_params
        window = params.get("window") or "24h"
        by = params.get("by") or "schedule"
        errors = {}
        if window not in retry_cost.WINDOWS:
            errors["window"] = [f"must be one of {', '.join(retry_cost.WINDOWS)}"]
        if by not in BY:
            errors["by"] = [f"must be one of {', '.join(BY)}"]
        raw = params.get("limit") or "50"
        limit = int(raw) if raw.isdigit() and len(raw) < 6 else 0
        if not 1 <= limit <= MAX_LIMIT:
            errors["limit"] = [f"must be an integer from 1 to {MAX_LIMIT}"]
        if errors:
            raise ValidationFailed(errors)
        tenant = request.user.tenant
        now = db_now()
        figures = retry_cost.ranking(tenant.id, BY[by], window=window, now=now, limit=limit)
        names = _names(tenant, by, [c.key for c in figures.rows])
        results = []
        for c in figures.rows:
            row = {"key": c.key, "name": names.get(c.key, ""), **cost_json(c)}
            if by == "schedule":
                row["scheduleId"] = c.key
            elif by == "owner":
                row["owner"] = names.get(c.key) or None
            else:
                row["targetHost"] = c.key
            results.append(row)
        return Response({"window": window, "by": by, "since": _iso(figures.since), "asOf": _iso(now),
                         "complete": figures.complete, "results": results})


def _names(tenant, by: str, keys: list) -> dict:
    """Readable names for the keys: schedules' names, owners' slugs, hosts as they are."""
    if by == "schedule":
        return {str(k): v for k, v in Schedule.objects.filter(tenant=tenant, id__in=keys).values_list("id", "name")}
    if by == "owner":
        ids = [k for k in keys if k]
        return {str(k): v for k, v in Owner.objects.filter(tenant=tenant, id__in=ids).values_list("id", "slug")}
    return {k: k for k in keys}


class ScheduleRetryCostView(ApiView):
    @operation(operation_id="schedules_retry_cost", summary="What this schedule's retries cost, 24h and 7d",
               responses={200: WINDOWS_OUT, **error_responses(404)})
    def get(self, request, pk):
        schedule = tenant_schedule(request, pk)
        return Response({"scheduleId": str(schedule.id),
                         **windows_json(schedule.tenant_id, CostDimension.SCHEDULE, str(schedule.id))})


class OwnerRetryCostView(ApiView):
    @operation(operation_id="owners_retry_cost", summary="What the retries of this owner's schedules cost, 24h and 7d",
               responses={200: WINDOWS_OUT, **error_responses(404)})
    def get(self, request, slug):
        owner = get_owner(request.user.tenant, slug)
        return Response({"owner": owner.slug, **windows_json(owner.tenant_id, CostDimension.OWNER, str(owner.id))})
