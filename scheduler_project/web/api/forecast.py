"""The forecast over HTTP: runs becoming eligible in each bucket ahead for the caller's tenant
(dispatch.forecast; docs/api.md, "Forecast")."""

from drf_spectacular.utils import OpenApiParameter, extend_schema_serializer
from rest_framework import serializers
from rest_framework.response import Response

from dispatch import forecast
from scheduler_project.foundation.errors import ValidationFailed
from scheduler_project.web.api.base import ApiView, operation
from scheduler_project.web.api.schedules import TEXT, error_responses


@extend_schema_serializer(component_name="ForecastBucket")
class BucketOut(serializers.Serializer):
    start = serializers.DateTimeField()
    due = serializers.FloatField(help_text="runs becoming eligible in the bucket (estimated when sampled)")


@extend_schema_serializer(component_name="ForecastTiers")
class TiersOut(serializers.Serializer):
    hour = BucketOut(many=True, help_text="the next hour, per minute")
    day = BucketOut(many=True, help_text="the next 24 hours, per 5 minutes")
    week = BucketOut(many=True, help_text="the next 7 days, per hour")


@extend_schema_serializer(component_name="ForecastCapacity")
class CapacityOut(serializers.Serializer):
    peakRunsPerSecond = serializers.FloatField(help_text="the busiest minute of the last 24 h, per second")
    peakMinute = serializers.DateTimeField(allow_null=True)
    workersAlive = serializers.IntegerField()
    meanLatencySeconds = serializers.FloatField(allow_null=True)
    targetBudgets = serializers.DictField(child=serializers.IntegerField(), help_text="host:port -> max in flight")


@extend_schema_serializer(component_name="Forecast")
class ForecastOut(serializers.Serializer):
    at = serializers.DateTimeField()
    method = serializers.ChoiceField(choices=["exact", "sampled"])
    sampledFraction = serializers.FloatField(help_text="of the schedules in scope counted; 1 when exact")
    schedulesCounted = serializers.IntegerField()
    schedulesEstimated = serializers.IntegerField()
    waitingNow = serializers.IntegerField(help_text="ready runs already eligible")
    truncatedRules = serializers.IntegerField()
    tiers = TiersOut()
    nextHourPeak = BucketOut(allow_null=True)
    capacity = CapacityOut()
    warnings = serializers.ListField(child=serializers.CharField())


class ForecastView(ApiView):
    @operation(
        operation_id="forecast",
        summary="Runs due ahead, per minute, 5 minutes and hour",
        description="From the tenant's schedules (spread applied) and the runs already made ahead, beside "
                    "the capacity the fleet showed. Exact up to a bounded number of schedules, sampled beyond.",
        parameters=[OpenApiParameter("host", TEXT, required=False, description="one target host:port")],
        responses={200: ForecastOut, **error_responses(400)},
    )
    def get(self, request):
        host = request.query_params.get("host")
        if host is not None and forecast.host_problem(host):
            raise ValidationFailed({"host": [forecast.host_problem(host)]})
        f = forecast.forecast(tenant_ids=[request.user.tenant.id], host=host)
        return Response(forecast.as_json(f))
