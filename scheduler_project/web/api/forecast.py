"""The forecast over HTTP: runs becoming eligible in each bucket ahead for the caller's tenant
(dispatch.forecast; docs/api.md, "Forecast"), and shaping a surge: preview and apply a spread window
over a selection of the tenant's schedules (runs.actions.spread_schedules, the portal's
entry point)."""

from drf_spectacular.utils import OpenApiParameter, extend_schema_serializer
from rest_framework import serializers
from rest_framework.response import Response

from dispatch import forecast
from runs import actions
from scheduler_project.foundation.errors import ValidationFailed
from scheduler_project.web.api.base import ApiView, operation
from scheduler_project.web.api.schedule_serializers import StrictCharField, StrictIntegerField, StrictSerializer
from scheduler_project.web.api.schedules import TEXT, actor, error_responses
from schedules.spread import MAX_SPREAD_SECONDS


@extend_schema_serializer(component_name="ForecastBucket")
class BucketOut(serializers.Serializer):
    start = serializers.DateTimeField()
    due = serializers.FloatField(help_text="runs becoming eligible in the bucket (estimated when sampled)")
    error = serializers.FloatField(help_text="half the 95% interval of `due` when sampled; 0 when exact")


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
    measured = serializers.BooleanField(help_text="true when the fleet was behind (runs waiting over 5 s) in some "
                                                  "minute of the last 24 h, so the peak is its rate under more work "
                                                  "than it could start; false: the peak is only a lower bound, and "
                                                  "no warning is made from it")


@extend_schema_serializer(component_name="Forecast")
class ForecastOut(serializers.Serializer):
    at = serializers.DateTimeField()
    method = serializers.ChoiceField(choices=["exact", "sampled"])
    source = serializers.ChoiceField(choices=["summary", "schedules"],
                                     help_text="summary: the schedules' group counts the database keeps as they "
                                               "change (the incremental forecast); schedules: grouped again for "
                                               "this answer (a spread's preview, or sampled past the work budget)")
    sampledFraction = serializers.FloatField(help_text="of the schedules in scope counted; 1 when exact")
    statedError = serializers.CharField(help_text="the method and what the counts are worth, in words")
    schedulesCounted = serializers.IntegerField()
    schedulesEstimated = serializers.IntegerField()
    waitingNow = serializers.IntegerField(help_text="ready runs already eligible")
    truncatedRules = serializers.IntegerField()
    tiers = TiersOut()
    nextHourPeak = BucketOut(allow_null=True)
    capacity = CapacityOut()
    warnings = serializers.ListField(child=serializers.CharField())
    notes = serializers.ListField(child=serializers.CharField(),
                                  help_text="what the forecast cannot tell, e.g. minutes busier than a capacity "
                                            "never measured")


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


# --- shaping a surge over the API: the portal's "Shape a surge", the same selection and entry point --


@extend_schema_serializer(component_name="BulkSpreadSelection")
class BulkSpreadIn(StrictSerializer):
    spreadSeconds = StrictIntegerField(min_value=0, max_value=MAX_SPREAD_SECONDS,
                                       help_text="the window to give every selected schedule")
    targetHost = StrictCharField(required=False, max_length=300,
                                 help_text="only schedules calling this target host:port")
    expression = StrictCharField(required=False, max_length=2000, trim_whitespace=False,
                                 help_text="only schedules with this expression, as written")

    def validate_targetHost(self, value):
        if forecast.host_problem(value):
            raise serializers.ValidationError(forecast.host_problem(value))
        return value

    def validate_expression(self, value):
        if "\x00" in value:
            raise serializers.ValidationError("an expression cannot contain NUL")
        return value


@extend_schema_serializer(component_name="BulkSpreadPreview")
class BulkSpreadPreviewOut(serializers.Serializer):
    selected = serializers.IntegerField(help_text="schedules of the selection without this window yet (counted "
                                                  f"up to {actions.MAX_BULK_SPREAD + 1})")
    more = serializers.BooleanField(help_text=f"over {actions.MAX_BULK_SPREAD}: one apply changes that "
                                              "many, the next apply the next ones")
    spreadSeconds = serializers.IntegerField()
    before = ForecastOut(help_text="the tenant's forecast as it is")
    after = ForecastOut(help_text="the tenant's forecast with the window applied to the whole selection")


@extend_schema_serializer(component_name="BulkSpreadResult")
class BulkSpreadOut(serializers.Serializer):
    changed = serializers.ListField(child=serializers.UUIDField(), help_text="each given a new version")
    unchanged = serializers.IntegerField(help_text="had the window already")
    refused = serializers.DictField(child=serializers.CharField(),
                                    help_text="schedule id -> why it was left as it was (the window does not fit "
                                              "its rule, or it changed meanwhile)")
    more = serializers.BooleanField(help_text="more of the selection remain without the window: apply again")


def _selection(request):
    """The request's window, host and expression, and the tenant's active schedules they select
    that do not have the window yet."""
    body = BulkSpreadIn(data=request.data)
    body.is_valid(raise_exception=True)
    d = body.validated_data
    window, host, expression = d["spreadSeconds"], d.get("targetHost") or None, d.get("expression") or None
    selected = actions.schedules_for_spread(request.user.tenant, host=host, expression=expression,
                                            without_window=window)
    return window, host, expression, selected


class BulkSpreadPreviewView(ApiView):
    @operation(
        operation_id="forecast_spread_preview",
        summary="Preview a spread over a selection of schedules",
        description="Selects the tenant's active schedules (optionally of one target host and one expression, as "
                    "written) and answers the forecast before and as it would be with the window applied: counts "
                    "from the schedules, not a guess. Changes nothing.",
        request=BulkSpreadIn,
        responses={200: BulkSpreadPreviewOut, **error_responses(400, 413, 415)},
    )
    def post(self, request):
        window, host, expression, selected = _selection(request)
        tenant = request.user.tenant
        before = forecast.forecast(tenant_ids=[tenant.id])
        after = forecast.forecast(tenant_ids=[tenant.id],
                                  respread=forecast.Respread(tenant.id, window, host, expression))
        return Response({"selected": len(selected), "more": len(selected) > actions.MAX_BULK_SPREAD,
                         "spreadSeconds": window, "before": forecast.as_json(before),
                         "after": forecast.as_json(after)})


class BulkSpreadView(ApiView):
    @operation(
        operation_id="forecast_spread_apply",
        summary="Give a selection of schedules a spread window",
        description="The selection of the preview, without the schedules that have the window already, at most "
                    f"{actions.MAX_BULK_SPREAD} of them in id order: one change, audited "
                    "(schedule.bulk_spread), each schedule edited as a PATCH would (a new version). A schedule whose "
                    "rule the window does not fit is left as it was and listed; `more` says to apply again.",
        request=BulkSpreadIn,
        responses={200: BulkSpreadOut, **error_responses(400, 413, 415)},
    )
    def post(self, request):
        window, host, expression, selected = _selection(request)
        tenant = request.user.tenant
        part = selected[:actions.MAX_BULK_SPREAD]
        out = actions.spread_schedules(tenant, part, window, by=actor(request),
                                       selection={"host": host, "expression": expression})
        return Response({"changed": out["changed"], "unchanged": out["unchanged"], "refused": out["refused"],
                         "more": len(selected) > len(part)})
