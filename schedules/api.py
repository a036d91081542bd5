"""Schedules over HTTP (api.md). Views only translate: every change is a service call."""

from datetime import timedelta

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from runs import schedule_actions
from runs.serializers import RunOut
from scheduler_project.dbclock import db_now
from schedules import timeexpr
from schedules.idempotency import idempotent
from schedules.models import Schedule
from schedules.serializers import ScheduleIn, ScheduleOut, SchedulePatchIn, schedule_json, to_fields
from schedules.services import Actor, create_schedule, rule_for


def actor(request) -> Actor:
    return Actor(str(request.user), request.META.get("REMOTE_ADDR", ""))


def tenant_schedule(request, pk) -> Schedule:
    """Another tenant's schedule is a 404, never a 403, so ids cannot be probed."""
    return get_object_or_404(Schedule.objects.select_related("current", "tenant"), id=pk, tenant=request.user.tenant)


class OccurrenceOut(serializers.Serializer):
    at = serializers.DateTimeField()
    local = serializers.CharField()
    note = serializers.CharField(allow_null=True)


class ScheduleListView(APIView):
    @extend_schema(request=ScheduleIn, responses={201: ScheduleOut}, parameters=[
        OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER, required=False)])
    def post(self, request):
        def create():
            body = ScheduleIn(data=request.data)
            body.is_valid(raise_exception=True)
            schedule = create_schedule(
                request.user.tenant,
                to_fields(body.validated_data),
                by=actor(request),
                enabled=body.validated_data.get("enabled", True),
                now=db_now(),
            )
            return Response(schedule_json(schedule), status=201)

        return idempotent(request, "schedules.create", create)


class ScheduleDetailView(APIView):
    @extend_schema(responses=ScheduleOut)
    def get(self, request, pk):
        return Response(schedule_json(tenant_schedule(request, pk)))

    @extend_schema(request=SchedulePatchIn, responses={200: ScheduleOut})
    def patch(self, request, pk):
        schedule = tenant_schedule(request, pk)
        body = SchedulePatchIn(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        schedule = schedule_actions.edit_schedule(
            schedule,
            expected_version=data["expectedVersion"],
            changes=to_fields(data),
            enabled=data.get("enabled"),
            by=actor(request),
        )
        return Response(schedule_json(Schedule.objects.select_related("current").get(id=schedule.id)))

    @extend_schema(responses={204: None})
    def delete(self, request, pk):
        schedule_actions.archive_schedule(tenant_schedule(request, pk), by=actor(request))
        return Response(status=204)


class ScheduleTriggerView(APIView):
    @extend_schema(request=None, responses={201: RunOut}, parameters=[
        OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER, required=False)])
    def post(self, request, pk):
        schedule = tenant_schedule(request, pk)

        def trigger():
            run = schedule_actions.trigger_schedule(schedule, by=actor(request))
            return Response(RunOut(run).data, status=201)

        return idempotent(request, f"schedules.trigger:{schedule.id}", trigger)


class BackfillIn(serializers.Serializer):
    # "from" is a Python keyword, hence the explicit field names.
    def get_fields(self):
        return {"from": serializers.DateTimeField(), "to": serializers.DateTimeField()}


class ScheduleBackfillView(APIView):
    @extend_schema(
        request=inline_serializer("BackfillRequest", {"from": serializers.DateTimeField(), "to": serializers.DateTimeField()}),
        responses={202: inline_serializer("BackfillResult", {"runs": serializers.IntegerField()})},
    )
    def post(self, request, pk):
        schedule = tenant_schedule(request, pk)
        body = BackfillIn(data=request.data)
        body.is_valid(raise_exception=True)
        made = schedule_actions.backfill_schedule(
            schedule, start=body.validated_data["from"], end=body.validated_data["to"], by=actor(request)
        )
        return Response({"runs": made}, status=202)


class ScheduleOccurrencesView(APIView):
    @extend_schema(
        parameters=[OpenApiParameter("count", int, required=False, description="1-100, default 10")],
        responses=inline_serializer("OccurrencePreview", {"occurrences": OccurrenceOut(many=True)}),
    )
    def get(self, request, pk):
        schedule = tenant_schedule(request, pk)
        count = parse_count(request.query_params.get("count"))
        rule = rule_for(schedule.current, schedule.anchor_at)
        # From the next instant still to be made: what is already materialised shows in the runs.
        start = schedule.next_run_at - timedelta(microseconds=1) if schedule.next_run_at else db_now()
        occs = timeexpr.preview(rule, start, count)
        end = schedule.current.end_at
        return Response({"occurrences": [timeexpr.to_wire(o) for o in occs if not end or o.at < end]})


def parse_count(raw, default=10, maximum=100) -> int:
    from scheduler_project.errors import ValidationFailed

    if raw in (None, ""):
        return default
    try:
        n = int(raw)
    except ValueError:
        raise ValidationFailed({"count": ["must be a whole number"]})
    if not 1 <= n <= maximum:
        raise ValidationFailed({"count": [f"must be between 1 and {maximum}"]})
    return n
