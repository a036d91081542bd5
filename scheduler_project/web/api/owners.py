"""Owners, incident rules and incidents over HTTP (docs/api.md, docs/incidents.md). Views only
translate: every change is a call to schedules.owners or dispatch.incidents, and every object is
looked up inside the caller's tenant."""

from django.http import Http404
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response

from dispatch import incidents
from dispatch.models import Incident, IncidentPolicy, IncidentRule, IncidentState
from scheduler_project.foundation.errors import ValidationFailed
from scheduler_project.web.api.base import ApiView, operation
from scheduler_project.web.api.schedule_serializers import (
    StrictBooleanField,
    StrictCharField,
    StrictIntegerField,
    StrictSerializer,
)
from scheduler_project.web.api.schedules import (
    BODY_ERRORS,
    PAGE_PARAMS,
    TEXT,
    actor,
    error_responses,
    page_of,
    parse_choices,
    require_empty_body,
    text_param,
)
from scheduler_project.web.pagination import INCIDENT_PAGES
from scheduler_project.web.params import parse_uuid
from schedules.models import Schedule, WebhookFormat
from schedules.owners import create_owner, edit_owner, get_owner, owner_json, set_default_owner

OWNER_FIELDS = {"slug": "slug", "name": "name", "email": "email", "webhookUrl": "webhook_url",
                "webhookFormat": "webhook_format", "timeZone": "time_zone", "quietStart": "quiet_start",
                "quietEnd": "quiet_end", "maxPerHour": "max_per_hour"}


class OwnerIn(StrictSerializer):
    slug = StrictCharField(max_length=64)
    name = StrictCharField(max_length=200)
    email = StrictCharField(max_length=254, required=False, allow_blank=True)
    webhookUrl = StrictCharField(max_length=2000, required=False, allow_blank=True,
                                 help_text="called with each incident notification, signed like run events")
    webhookFormat = serializers.ChoiceField(choices=WebhookFormat.choices, required=False,
                                            help_text="json (the event), slack or teams ({\"text\": ...})")
    timeZone = StrictCharField(max_length=64, required=False, help_text="IANA zone of the quiet hours (default UTC)")
    quietStart = StrictCharField(max_length=5, required=False, allow_null=True,
                                 help_text="HH:MM: notifications are held from here to quietEnd, then sent")
    quietEnd = StrictCharField(max_length=5, required=False, allow_null=True)
    maxPerHour = StrictIntegerField(required=False, allow_null=True,
                                    help_text="messages an hour on each channel; more are held and sent as one "
                                              "summary (default 30; null: no limit)")
    default = StrictBooleanField(required=False, help_text="the owner of schedules created without one")


class OwnerPatchIn(OwnerIn):
    def __init__(self, *args, **kwargs):
        kwargs["partial"] = True
        super().__init__(*args, **kwargs)


class OwnerOut(serializers.Serializer):
    slug = serializers.CharField()
    name = serializers.CharField()
    email = serializers.CharField(allow_blank=True)
    webhookUrl = serializers.CharField(allow_blank=True)
    webhookFormat = serializers.CharField()
    timeZone = serializers.CharField()
    quietStart = serializers.CharField(allow_null=True)
    quietEnd = serializers.CharField(allow_null=True)
    maxPerHour = serializers.IntegerField(allow_null=True)
    default = serializers.BooleanField()


def owner_out(owner, tenant) -> dict:
    j = owner_json(owner)
    return {"slug": owner.slug, "name": owner.name, "email": owner.email, "webhookUrl": owner.webhook_url,
            "webhookFormat": owner.webhook_format, "timeZone": owner.time_zone, "quietStart": j["quiet_start"],
            "quietEnd": j["quiet_end"], "maxPerHour": owner.max_per_hour, "default": tenant.default_owner_id == owner.id}


def _owner_fields(data: dict) -> dict:
    return {OWNER_FIELDS[k]: v for k, v in data.items() if k in OWNER_FIELDS}


def _api_names(call):
    """The service's field errors under the API's field names (webhook_url -> webhookUrl)."""
    camel = {v: k for k, v in OWNER_FIELDS.items()}
    try:
        return call()
    except ValidationFailed as exc:
        raise ValidationFailed({camel.get(k, k): v for k, v in exc.errors.items()}) from None


class OwnerListView(ApiView):
    @operation(operation_id="owners_list", summary="This tenant's owners",
               responses={200: OwnerOut(many=True), **error_responses()})
    def get(self, request):
        tenant = request.user.tenant
        return Response([owner_out(o, tenant) for o in tenant.owners.all()])

    @operation(operation_id="owners_create", summary="Create an owner", request=OwnerIn,
               responses={201: OwnerOut, **error_responses(*BODY_ERRORS, 409)})
    def post(self, request):
        body = OwnerIn(data=request.data)
        body.is_valid(raise_exception=True)
        tenant = request.user.tenant
        owner = _api_names(lambda: create_owner(tenant, _owner_fields(body.validated_data), by=actor(request),
                                                default=body.validated_data.get("default", False)))
        return Response(owner_out(owner, tenant), status=201)


class OwnerDetailView(ApiView):
    @operation(operation_id="owners_retrieve", summary="Read an owner", responses={200: OwnerOut, **error_responses(404)})
    def get(self, request, slug):
        tenant = request.user.tenant
        return Response(owner_out(get_owner(tenant, slug), tenant))

    @operation(operation_id="owners_update", summary="Edit an owner (only the fields given)", request=OwnerPatchIn,
               responses={200: OwnerOut, **error_responses(*BODY_ERRORS, 404, 409)})
    def patch(self, request, slug):
        tenant = request.user.tenant
        owner = get_owner(tenant, slug)
        body = OwnerPatchIn(data=request.data)
        body.is_valid(raise_exception=True)
        owner = _api_names(lambda: edit_owner(owner, _owner_fields(body.validated_data), by=actor(request)))
        default = body.validated_data.get("default")
        if default is True and tenant.default_owner_id != owner.id:
            set_default_owner(tenant, owner, by=actor(request))
        elif default is False and tenant.default_owner_id == owner.id:
            set_default_owner(tenant, None, by=actor(request))
        return Response(owner_out(owner, tenant))


class OwnerTestView(ApiView):
    @operation(operation_id="owners_test_notification", summary="Send a test notification to the owner's channels",
               request=None, responses={202: inline_serializer("TestNotification", {
                   "channels": serializers.ListField(child=serializers.CharField())}),
                   **error_responses(*BODY_ERRORS, 404)})
    def post(self, request, slug):
        owner = get_owner(request.user.tenant, slug)
        require_empty_body(request)
        notes = incidents.send_test_notification(owner, by=actor(request))
        return Response({"channels": [n.channel for n in notes]}, status=202)


# --- incident rules ---------------------------------------------------------------------------


class RuleIn(StrictSerializer):
    enabled = StrictBooleanField()
    threshold = serializers.FloatField(required=False, allow_null=True, min_value=0,
                                       help_text="N failures, seconds of lag or grace, or K dead runs an hour")
    scheduleId = serializers.UUIDField(required=False, allow_null=True, help_text="this schedule only (an override)")


class RuleOut(serializers.Serializer):
    rule = serializers.ChoiceField(choices=IncidentRule.choices)
    scheduleId = serializers.UUIDField(allow_null=True)
    enabled = serializers.BooleanField()
    threshold = serializers.FloatField(allow_null=True)
    default = serializers.BooleanField(help_text="true: no setting of its own; the deployment's default applies")


def rule_out(p: IncidentPolicy | None, rule: str, schedule_id=None) -> dict:
    d = incidents.defaults()[rule]
    return {"rule": rule, "scheduleId": str(schedule_id) if schedule_id else None,
            "enabled": p.enabled if p else d.enabled, "threshold": p.threshold if p else d.threshold,
            "default": p is None}


class RuleListView(ApiView):
    @operation(operation_id="incident_rules_list", summary="The tenant's incident rules (or one schedule's)",
               parameters=[OpenApiParameter("scheduleId", {"type": "string", "format": "uuid"}, required=False)],
               responses={200: RuleOut(many=True), **error_responses(400, 404)})
    def get(self, request):
        tenant = request.user.tenant
        sid = parse_uuid(request.query_params.get("scheduleId"), field="scheduleId")
        if sid:
            get_object_or_404(Schedule, id=sid, tenant=tenant)
        rows = {p.rule: p for p in IncidentPolicy.objects.filter(tenant=tenant, schedule_id=sid)}
        if sid:
            tenant_rows = {p.rule: p for p in IncidentPolicy.objects.filter(tenant=tenant, schedule__isnull=True)}
            rows = {r: rows.get(r) or tenant_rows.get(r) for r in IncidentRule.values}
        return Response([rule_out(rows.get(r), r, sid) for r in IncidentRule.values])


class RuleDetailView(ApiView):
    @operation(operation_id="incident_rules_set", summary="Set a rule for the tenant or one schedule", request=RuleIn,
               responses={200: RuleOut, **error_responses(*BODY_ERRORS, 404)})
    def put(self, request, rule):
        if rule not in IncidentRule.values:
            raise ValidationFailed({"rule": [f"must be one of {', '.join(IncidentRule.values)}"]})
        body = RuleIn(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        tenant = request.user.tenant
        sid = data.get("scheduleId")
        if sid:
            if rule == IncidentRule.DLQ_GROWTH:
                raise ValidationFailed({"scheduleId": ["dlq_growth is a tenant-wide rule"]})
            get_object_or_404(Schedule, id=sid, tenant=tenant)
        p = incidents.set_policy(tenant, rule, schedule_id=sid, enabled=data["enabled"],
                                 threshold=data.get("threshold"), by=actor(request))
        return Response(rule_out(p, rule, sid))


# --- incidents --------------------------------------------------------------------------------


class IncidentOut(serializers.Serializer):
    id = serializers.IntegerField()
    rule = serializers.ChoiceField(choices=IncidentRule.choices)
    state = serializers.ChoiceField(choices=IncidentState.choices)
    summary = serializers.CharField()
    scheduleId = serializers.UUIDField(allow_null=True)
    owner = serializers.CharField(allow_null=True)
    occurrences = serializers.IntegerField()
    openedAt = serializers.DateTimeField()
    lastSeenAt = serializers.DateTimeField()
    lastRunId = serializers.UUIDField(allow_null=True)
    lastError = serializers.CharField(allow_blank=True)
    acknowledgedAt = serializers.DateTimeField(allow_null=True)
    acknowledgedBy = serializers.CharField(allow_null=True)
    resolvedAt = serializers.DateTimeField(allow_null=True)
    resolvedBy = serializers.CharField(allow_null=True)


def tenant_incident(request, pk) -> Incident:
    if pk >= 2**63:  # no such id, and more than the column can compare with
        raise Http404
    return get_object_or_404(Incident.objects.select_related("owner"), id=pk, tenant=request.user.tenant)


class IncidentListView(ApiView):
    @operation(
        operation_id="incidents_list", summary="This tenant's incidents, newest first",
        parameters=[
            OpenApiParameter("state", TEXT, required=False, description="comma-separated: open, acknowledged, resolved"),
            OpenApiParameter("owner", TEXT, required=False, description="an owner's slug"),
            OpenApiParameter("scheduleId", {"type": "string", "format": "uuid"}, required=False),
            OpenApiParameter("rule", TEXT, required=False, description="comma-separated rules"),
            *PAGE_PARAMS,
        ],
        responses={200: page_of(IncidentOut, "IncidentPage"), **error_responses(400)},
    )
    def get(self, request):
        params = request.query_params
        qs = Incident.objects.filter(tenant=request.user.tenant).select_related("owner")
        states = parse_choices(params.get("state"), "state", IncidentState.values)
        if states:
            qs = qs.filter(state__in=states)
        rules = parse_choices(params.get("rule"), "rule", IncidentRule.values)
        if rules:
            qs = qs.filter(rule__in=rules)
        owner = text_param(params.get("owner"), "owner", 64)
        if owner:
            qs = qs.filter(owner__slug=owner)
        if params.get("scheduleId"):
            qs = qs.filter(schedule_id=parse_uuid(params.get("scheduleId"), field="scheduleId"))
        page = INCIDENT_PAGES.page_from_params(qs, params)
        return Response({"results": [incidents.incident_json(i) for i in page.items], "next": page.next})


class IncidentDetailView(ApiView):
    @operation(operation_id="incidents_retrieve", summary="Read an incident",
               responses={200: IncidentOut, **error_responses(404)})
    def get(self, request, pk):
        return Response(incidents.incident_json(tenant_incident(request, pk)))


class IncidentAcknowledgeView(ApiView):
    @operation(operation_id="incidents_acknowledge", summary="Acknowledge an open incident", request=None,
               responses={200: IncidentOut, **error_responses(*BODY_ERRORS, 404, 409)})
    def post(self, request, pk):
        inc = tenant_incident(request, pk)
        require_empty_body(request)
        incidents.acknowledge_incident(inc.id, tenant_id=inc.tenant_id, by=actor(request))
        return Response(incidents.incident_json(tenant_incident(request, pk)))


class IncidentResolveView(ApiView):
    @operation(operation_id="incidents_resolve", summary="Resolve an incident by hand", request=None,
               responses={200: IncidentOut, **error_responses(*BODY_ERRORS, 404, 409)})
    def post(self, request, pk):
        inc = tenant_incident(request, pk)
        require_empty_body(request)
        incidents.resolve_incident(inc.id, tenant_id=inc.tenant_id, by=actor(request))
        return Response(incidents.incident_json(tenant_incident(request, pk)))
