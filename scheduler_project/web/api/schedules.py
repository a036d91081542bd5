"""Schedules, expressions, API keys and the audit log over HTTP (docs/api.md). Views only translate:
every change is a service call, and every object is looked up inside the caller's tenant."""

import re
from datetime import timedelta, timezone

from django.shortcuts import get_object_or_404
from django.utils.dateparse import parse_datetime
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response

from runs import actions
from scheduler_project.foundation.dbclock import db_now, request_now
from scheduler_project.foundation.errors import StaleVersion, ValidationFailed
from scheduler_project.web.api.base import ApiView, operation
from scheduler_project.web.api.idempotency import HEADER as IDEMPOTENCY_HEADER
from scheduler_project.web.api.idempotency import idempotent
from scheduler_project.web.api.run_serializers import RunOut
from scheduler_project.web.api.schedule_serializers import (
    EARLIEST,
    LATEST,
    ApiKeyCreatedOut,
    ApiKeyIn,
    ApiKeyOut,
    AuditEntryOut,
    BackfillIn,
    BackfillOut,
    BadRequestOut,
    ConflictOut,
    ErrorOut,
    ExpressionPreviewIn,
    OccurrencesOut,
    RateLimitedOut,
    ScheduleIn,
    ScheduleOut,
    SchedulePatchIn,
    changed_since_json,
    occurrence_json,
    schedule_json,
    to_fields,
    validate_schedule,
)
from scheduler_project.web.clientaddr import client_address
from scheduler_project.web.pagination import AUDIT_PAGES, KEY_PAGES, SCHEDULE_PAGES
from scheduler_project.web.params import parse_uuid
from schedules import timeexpr
from schedules.models import ApiKey, AuditEntry, Schedule, ScheduleStatus
from schedules.occurrences import upcoming
from schedules.owners import owner_for
from schedules.services import Actor, rule_for
from schedules.tenants import create_api_key, revoke_api_key
from schedules.timeexpr.types import DstRepeated, DstSkipped

# --- shared by every API view (the other API modules import these) ---------------------------


def actor(request) -> Actor:
    """The audit identity of an API call: the key's prefix and the client's address (behind a
    proxy listed in SCHEDULER_TRUSTED_PROXIES, the address it forwarded; never an address the
    client wrote itself)."""
    return Actor(str(request.user), client_address(request)[:64])


def owner_given(request, data: dict) -> dict:
    """The `owner` argument of create/edit when the body names one (a slug, or null for none)."""
    if "owner" not in data:
        return {}
    return {"owner": owner_for(request.user.tenant, data["owner"])}


def tenant_schedule(request, pk) -> Schedule:
    """Another tenant's schedule is a 404, never a 403, so ids cannot be probed."""
    return get_object_or_404(Schedule.objects.select_related("current", "tenant"), id=pk, tenant=request.user.tenant)


def require_empty_body(request) -> None:
    """Actions (trigger, retry, cancel, revoke) take no body; `{}` is accepted for clients that
    always send one. Anything else is refused, like an unknown field on any other endpoint."""
    if request.data not in ({}, None):
        raise ValidationFailed({"body": ["this endpoint takes no request body (send nothing or {})"]})


def error_responses(*codes: int) -> dict:
    """The error bodies an operation can answer, for the OpenAPI document. 401 and 429 apply to
    every authenticated operation and are always included."""
    described = {
        400: OpenApiResponse(BadRequestOut, "field errors, or a body that is not usable JSON"),
        401: OpenApiResponse(ErrorOut, "no API key, an unknown key, or a revoked key"),
        404: OpenApiResponse(ErrorOut, "no such object in this tenant"),
        409: OpenApiResponse(ConflictOut, "the object is not in a state that allows this"),
        413: OpenApiResponse(ErrorOut, "the request body or the payload is over the size limit"),
        415: OpenApiResponse(ErrorOut, "the body is not application/json"),
        422: OpenApiResponse(ErrorOut, "this Idempotency-Key was used with a different body"),
        429: OpenApiResponse(RateLimitedOut, "rate limit for this key exceeded; see the Retry-After header"),
    }
    return {code: described[code] for code in sorted({401, 429, *codes})}


BODY_ERRORS = (400, 413, 415)

IDEMPOTENCY_PARAM = OpenApiParameter(
    IDEMPOTENCY_HEADER, str, OpenApiParameter.HEADER, required=False,
    description="Makes a retried request return the first result. Reusing a key with a different body answers 422.",
)
# Query parameters are left out or given a value (scheduler_project.web.api.base).
TEXT = {"type": "string", "minLength": 1}
# What the audit log's actions look like (schedules.services.audit callers): object.verb.
ACTION_NAME = re.compile(r"^[a-z_]+\.[a-z_]+$")
PAGE_PARAMS = [
    OpenApiParameter("cursor", TEXT, required=False, description="the `next` value of the previous page"),
    OpenApiParameter("limit", int, required=False, description="1-200, default 50"),
]



def page_of(out_serializer, name: str):
    return inline_serializer(name, {
        "results": out_serializer(many=True),
        "next": serializers.CharField(allow_null=True, help_text="cursor for the next page; null on the last"),
    })


def text_param(raw, name: str, max_length: int = 200) -> str | None:
    """A free-text query parameter, refused if PostgreSQL could not compare it (NUL)."""
    if raw in (None, ""):
        return None
    if "\x00" in raw or len(raw) > max_length:
        raise ValidationFailed({name: [f"must be at most {max_length} characters, without NUL"]})
    return raw


def parse_bool(raw, name: str) -> bool | None:
    if raw in (None, ""):
        return None
    if raw in ("true", "false"):
        return raw == "true"
    raise ValidationFailed({name: ["must be true or false"]})


def parse_choices(raw, name: str, allowed) -> list[str]:
    """`state=dead,canceled` -> ["dead", "canceled"], each checked."""
    if raw in (None, ""):
        return []
    values = [v.strip() for v in raw.split(",") if v.strip()]
    wrong = [v for v in values if v not in allowed]
    if wrong:
        raise ValidationFailed({name: [f"{wrong[0][:50]!r} is not one of {', '.join(allowed)}"]})
    return values


def parse_instant(raw, name: str):
    if raw in (None, ""):
        return None
    try:
        value = parse_datetime(raw.strip().replace(" ", "+"))  # a '+' in a query string arrives as ' '
    except ValueError:
        value = None
    if value is None or value.tzinfo is None:
        raise ValidationFailed({name: ["must be an ISO 8601 date-time with an offset, e.g. 2026-03-08T07:00:00Z"]})
    try:
        # PostgreSQL refuses offsets past ±15:59 that ISO 8601 parsers accept; UTC it always takes.
        value = value.astimezone(timezone.utc)
    except OverflowError:
        value = None
    if value is None or not EARLIEST <= value < LATEST:
        raise ValidationFailed({name: ["must be between 1970-01-01T00:00:00Z and 3000-01-01T00:00:00Z"]})
    return value


def parse_count(raw, default=10, maximum=100) -> int:
    if raw in (None, ""):
        return default
    try:
        n = int(raw)
    except ValueError:
        raise ValidationFailed({"count": ["must be a whole number"]})
    if not 1 <= n <= maximum:
        raise ValidationFailed({"count": [f"must be between 1 and {maximum}"]})
    return n


# --- schedules ------------------------------------------------------------------------------


class ScheduleListView(ApiView):
    @operation(
        operation_id="schedules_list",
        summary="List schedules",
        description="Newest first. Archived schedules are left out unless `status` asks for them.",
        parameters=[
            OpenApiParameter("enabled", bool, required=False, description="true: running; false: paused"),
            OpenApiParameter("owner", TEXT, required=False, description="an owner's slug; `-`: schedules without one"),
            OpenApiParameter("status", TEXT, required=False,
                             description="comma-separated: active, completed, archived (default active,completed)"),
            *PAGE_PARAMS,
        ],
        responses={200: page_of(ScheduleOut, "SchedulePage"), **error_responses(400)},
    )
    def get(self, request):
        params = request.query_params
        qs = Schedule.objects.filter(tenant=request.user.tenant).select_related("current", "owner")
        owner = text_param(params.get("owner"), "owner", 64)
        if owner is not None:
            qs = qs.filter(owner__isnull=True) if owner == "-" else qs.filter(owner__slug=owner)
        enabled = parse_bool(params.get("enabled"), "enabled")
        if enabled is not None:
            qs = qs.filter(enabled=enabled)
        statuses = parse_choices(params.get("status"), "status", ScheduleStatus.values)
        if statuses:
            qs = qs.filter(status__in=statuses)
        else:
            qs = qs.exclude(status=ScheduleStatus.ARCHIVED)
        page = SCHEDULE_PAGES.page_from_params(qs, params)
        return Response({"results": [schedule_json(s) for s in page.items], "next": page.next})

    @operation(
        operation_id="schedules_create",
        summary="Create a schedule",
        request=ScheduleIn,
        parameters=[IDEMPOTENCY_PARAM],
        responses={201: ScheduleOut, **error_responses(*BODY_ERRORS, 422)},
    )
    def post(self, request):
        def create():
            data = validate_schedule(request.data)
            schedule = actions.create_schedule(
                request.user.tenant,
                to_fields(data),
                by=actor(request),
                enabled=data.get("enabled", True),
                now=request_now(request),
                **owner_given(request, data),
            )
            return Response(schedule_json(schedule), status=201)

        return idempotent(request, "schedules.create", create)


class ScheduleDetailView(ApiView):
    @operation(operation_id="schedules_retrieve", summary="Read a schedule",
               responses={200: ScheduleOut, **error_responses(404)})
    def get(self, request, pk):
        return Response(schedule_json(tenant_schedule(request, pk)))

    @operation(
        operation_id="schedules_update",
        summary="Edit, pause or resume a schedule",
        description="Send `expectedVersion` and only the fields to change. A changed field makes a new "
                    "version; `enabled: false` pauses and `enabled: true` resumes.",
        request=SchedulePatchIn,
        responses={200: ScheduleOut, **error_responses(*BODY_ERRORS, 404, 409)},
    )
    def patch(self, request, pk):
        schedule = tenant_schedule(request, pk)
        body = SchedulePatchIn(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        try:
            schedule = actions.edit_schedule(
                schedule,
                expected_version=data["expectedVersion"],
                changes=to_fields(data),
                enabled=data.get("enabled"),
                by=actor(request),
                **owner_given(request, data),
            )
        except StaleVersion as e:
            # Field by field what changed since the version the client read, so it can re-apply
            # its change on purpose instead of overwriting a colleague's.
            return Response({"error": e.message, "currentVersion": e.current_version,
                             "expectedVersion": e.expected_version,
                             "changedSince": changed_since_json(e.changed_since)}, status=409)
        return Response(schedule_json(Schedule.objects.select_related("current", "owner").get(id=schedule.id)))

    @operation(
        operation_id="schedules_archive",
        summary="Archive a schedule",
        description="No new occurrences; runs that have not started are canceled; history is kept. "
                    "Archiving an archived schedule is a no-op.",
        responses={204: None, **error_responses(404)},
    )
    def delete(self, request, pk):
        actions.archive_schedule(tenant_schedule(request, pk), by=actor(request))
        return Response(status=204)


class ScheduleTriggerView(ApiView):
    @operation(
        operation_id="schedules_trigger",
        summary="Run a schedule now",
        request=None,
        parameters=[IDEMPOTENCY_PARAM],
        responses={201: RunOut, **error_responses(*BODY_ERRORS, 404, 409, 422)},
    )
    def post(self, request, pk):
        schedule = tenant_schedule(request, pk)
        require_empty_body(request)

        def trigger():
            run = actions.trigger_schedule(schedule, by=actor(request))
            return Response(RunOut(run).data, status=201)

        return idempotent(request, f"schedules.trigger:{schedule.id}", trigger)


class ScheduleBackfillView(ApiView):
    @operation(
        operation_id="schedules_backfill",
        summary="Make runs for a past range",
        request=BackfillIn,
        responses={202: BackfillOut, **error_responses(*BODY_ERRORS, 404, 409)},
    )
    def post(self, request, pk):
        schedule = tenant_schedule(request, pk)
        body = BackfillIn(data=request.data)
        body.is_valid(raise_exception=True)
        made = actions.backfill_schedule(
            schedule, start=body.validated_data["from"], end=body.validated_data["to"], by=actor(request)
        )
        return Response({"runs": made}, status=202)


class ScheduleOccurrencesView(ApiView):
    @operation(
        operation_id="schedules_occurrences",
        summary="Preview a schedule's next instants",
        description="Nothing is stored. A paused, completed or archived schedule has none.",
        parameters=[OpenApiParameter("count", int, required=False, description="1-100, default 10")],
        responses={200: OccurrencesOut, **error_responses(400, 404)},
    )
    def get(self, request, pk):
        schedule = tenant_schedule(request, pk)
        count = parse_count(request.query_params.get("count"))
        try:
            occs = upcoming(schedule, rule_for(schedule.current, schedule.anchor_at), count)
        except timeexpr.ExpressionError as e:  # a stored rule the engine now refuses, or over budget
            raise ValidationFailed({e.field: [str(e)]})
        offset = schedule.current.spread_offset_seconds
        return Response({"occurrences": [occurrence_json(timeexpr.to_wire(o), offset_seconds=offset) for o in occs]})


class ExpressionPreviewView(ApiView):
    @operation(
        operation_id="expressions_preview",
        summary="Preview an expression",
        description="The next instants of an expression in a zone, with DST notes; nothing is stored. "
                    "With `from`, instants at or after it (and rate() counts from it); else after now.",
        request=ExpressionPreviewIn,
        responses={200: OccurrencesOut, **error_responses(*BODY_ERRORS)},
    )
    def post(self, request):
        body = ExpressionPreviewIn(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        given_from = data.get("from")
        anchor = given_from or db_now()
        policy = data.get("dstPolicy") or {}
        # Same rule as a new schedule's first run: startAt itself counts, "now" does not.
        after = anchor - timedelta(microseconds=1) if given_from else anchor
        try:
            rule = timeexpr.parse(
                data["expression"], data["timeZone"], anchor=anchor,
                dst_policy=timeexpr.DstPolicy(policy.get("skipped", DstSkipped.NEXT_VALID),
                                              policy.get("repeated", DstRepeated.EARLIER)),
            )
            occs = timeexpr.preview(rule, after, data.get("count", 10))  # bounded: over budget is a 400
        except timeexpr.ExpressionError as e:
            raise ValidationFailed({e.field: [str(e)]})
        return Response({"occurrences": [occurrence_json(timeexpr.to_wire(o)) for o in occs]})


# --- API keys -------------------------------------------------------------------------------


def tenant_key(request, pk) -> ApiKey:
    return get_object_or_404(ApiKey, id=pk, tenant=request.user.tenant)


class ApiKeyListView(ApiView):
    @operation(
        operation_id="keys_list",
        summary="List this tenant's API keys",
        description="Prefix and label only: a key's secret is never shown again after creation.",
        parameters=PAGE_PARAMS,
        responses={200: page_of(ApiKeyOut, "ApiKeyPage"), **error_responses(400)},
    )
    def get(self, request):
        page = KEY_PAGES.page_from_params(ApiKey.objects.filter(tenant=request.user.tenant), request.query_params)
        return Response({"results": ApiKeyOut(page.items, many=True).data, "next": page.next})

    @operation(
        operation_id="keys_create",
        summary="Create an API key",
        description="The response carries the key itself, this once; it is stored only as a hash.",
        request=ApiKeyIn,
        responses={201: ApiKeyCreatedOut, **error_responses(*BODY_ERRORS)},
    )
    def post(self, request):
        if not request.body.strip():
            raise ValidationFailed({"body": ['send a JSON object: {} for a key without a label, or {"label": "..."}']})
        body = ApiKeyIn(data=request.data)
        body.is_valid(raise_exception=True)
        key, raw = create_api_key(request.user.tenant, label=body.validated_data.get("label", ""), by=actor(request))
        data = ApiKeyOut(key).data
        data["key"] = raw
        return Response(data, status=201)


class ApiKeyDetailView(ApiView):
    @operation(operation_id="keys_retrieve", summary="Read an API key (without its secret)",
               responses={200: ApiKeyOut, **error_responses(404)})
    def get(self, request, pk):
        return Response(ApiKeyOut(tenant_key(request, pk)).data)


class ApiKeyRevokeView(ApiView):
    @operation(
        operation_id="keys_revoke",
        summary="Revoke an API key",
        description="Takes effect at once: the next request with the key answers 401. A key may revoke itself.",
        request=None,
        responses={200: ApiKeyOut, **error_responses(*BODY_ERRORS, 404, 409)},
    )
    def post(self, request, pk):
        key = tenant_key(request, pk)
        require_empty_body(request)
        return Response(ApiKeyOut(revoke_api_key(key, by=actor(request))).data)


# --- audit log ------------------------------------------------------------------------------


class AuditListView(ApiView):
    @operation(
        operation_id="audit_list",
        summary="This tenant's audit log",
        description="Every change: who (key:<prefix> or user:<name>), what, when, from where, and "
                    "before/after. Newest first.",
        parameters=[
            OpenApiParameter("objectId", {"type": "string", "format": "uuid"}, required=False,
                             description="only entries about this object (its id)"),
            OpenApiParameter("action", {"type": "string", "pattern": ACTION_NAME.pattern, "maxLength": 64},
                             required=False, description="e.g. schedule.edit"),
            *PAGE_PARAMS,
        ],
        responses={200: page_of(AuditEntryOut, "AuditPage"), **error_responses(400)},
    )
    def get(self, request):
        params = request.query_params
        qs = AuditEntry.objects.filter(tenant=request.user.tenant)
        object_id = parse_uuid(params.get("objectId"), field="objectId")
        if object_id:
            qs = qs.filter(object_id=str(object_id))
        action = text_param(params.get("action"), "action", 64)
        if action and not ACTION_NAME.match(action):
            raise ValidationFailed({"action": ["must be an action name such as schedule.edit or apikey.revoke"]})
        if action:
            qs = qs.filter(action=action)
        page = AUDIT_PAGES.page_from_params(qs, params)
        return Response({"results": AuditEntryOut(page.items, many=True).data, "next": page.next})
