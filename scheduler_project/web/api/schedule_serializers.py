"""API shapes for schedules, expressions, keys and the audit log: camelCase on the wire, snake_case
fields inside.

Input serializers only check shape and types and turn the body into the service's field dict;
what a schedule means (expression, zone, allowlist, bounds) is checked by `schedules.services`.
"""

import threading
from datetime import datetime, timedelta, timezone

from django.core.validators import MaxLengthValidator, MinLengthValidator, ProhibitNullCharactersValidator
from django.utils.dateparse import parse_datetime
from drf_spectacular.utils import extend_schema_field, extend_schema_serializer, inline_serializer
from rest_framework import serializers
from rest_framework.exceptions import ErrorDetail
from rest_framework.settings import api_settings
from rest_framework.validators import ProhibitSurrogateCharactersValidator

from scheduler_project.web.api.audit_shape import audit_value
from scheduler_project.web.api.representation import compiled
from schedules.models import MisfirePolicy, OverlapPolicy, Schedule, ScheduleStatus
from schedules.services import (
    MAX_CATCHUP_LIMIT,
    MAX_EXPRESSION,
    MAX_NAME,
    MAX_POLICY_SECONDS,
    MAX_URL,
    MIN_BACKOFF_SECONDS,
    TARGET_METHODS,
)
from schedules.spread import MAX_SPREAD_SECONDS
from schedules.targets import MAX_HEADER_VALUE, target_header_problems
from schedules.timeexpr.types import REPEATED_CHOICES, SKIPPED_CHOICES

# Instants outside this range are refused at the edge: nothing is scheduled before the epoch, and
# far-future values only reach date arithmetic overflows deep in the rule engine.
EARLIEST = datetime(1970, 1, 1, tzinfo=timezone.utc)
LATEST = datetime(3000, 1, 1, tzinfo=timezone.utc)



class UtcDateTimeField(serializers.DateTimeField):
    """ISO 8601 with an explicit offset (`Z` or `+02:00`), answered in UTC with `Z`.

    A time without an offset is refused rather than read as UTC: for a schedule in
    America/New_York, "2026-03-08T02:30:00" is ambiguous between wall time and UTC, and guessing
    would move a run by hours without a word."""

    default_error_messages = {
        "naive": "give a UTC offset: '2026-03-08T07:00:00Z' or '2026-03-08T02:00:00-05:00'",
        "range": "must be between 1970-01-01T00:00:00Z and 3000-01-01T00:00:00Z",
    }

    def to_internal_value(self, value):
        if isinstance(value, str):
            try:
                parsed = parse_datetime(value.strip())
            except ValueError:
                parsed = None
            if parsed is not None and parsed.tzinfo is None:
                self.fail("naive")
        elif isinstance(value, datetime) and value.tzinfo is None:
            self.fail("naive")
        result = super().to_internal_value(value)
        if not EARLIEST <= result < LATEST:
            self.fail("range")
        return result


def _uniq(choices):
    return [(c, c) for c in choices]


class StrictSerializer(serializers.Serializer):
    """Unknown fields are an error (400), not silently ignored: a typo in a policy name must not
    leave the default in force unnoticed. Applies at every nesting level.

    A field the body leaves out is visited only when that can do something: when it is required
    (an error) or has a default (a value). DRF visits every field, and one left out that is
    neither only raises SkipField, caught and dropped; a create's body gives four of the twenty,
    so those visits were a third of validating it (a batch validates a thousand). In a partial
    validation (PATCH) every field left out is skipped, as DRF's own get_default skips it. The
    answer, value or errors, is DRF's (tests/api/test_validation_visits.py)."""

    _given = None  # the body being validated, while it is

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            return super().to_internal_value(data)
        unknown = sorted(set(data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError({k: ["unknown field"] for k in unknown})
        self._given = data
        try:
            return super().to_internal_value(data)
        finally:
            self._given = None

    @property
    def _writable_fields(self):
        given = self._given
        if given is None:
            yield from super()._writable_fields
            return
        skip = self.__dict__.get("_skip_when_absent")
        if skip is None:
            partial = getattr(self.root, "partial", False)
            skip = self._skip_when_absent = frozenset(
                name for name, f in self.fields.items()
                if partial or (not f.required and f.default is serializers.empty))
        for name, field in self.fields.items():
            if not field.read_only and (name in given or name not in skip):
                yield field

    def run_validators(self, value):
        # DRF first merges the read-only fields' defaults into the value for the serializer's own
        # validators; these serializers declare none (they check in validate()), so there is
        # nothing to merge for and nothing to run.
        if self.validators:
            super().run_validators(value)


# The validators DRF's CharField adds by itself; a field with only these can take the fast path.
_CHAR_VALIDATORS = (MaxLengthValidator, MinLengthValidator, ProhibitNullCharactersValidator,
                    ProhibitSurrogateCharactersValidator)


class StrictCharField(serializers.CharField):
    """Text only: DRF's CharField would store the number 5 as "5". JSON has types, and a client
    that sends the wrong one is told, as for any other wrong value."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)

    def run_validators(self, value):
        # CharField's own validators (length, NUL, surrogates: the last a Python loop over every
        # character) for the value they all pass, ASCII within the bounds, in one test; any other
        # value, or a field with validators of its own, goes through them for their messages.
        if (type(value) is str and value.isascii() and "\x00" not in value
                and (self.max_length is None or len(value) <= self.max_length)
                and (self.min_length is None or len(value) >= self.min_length)
                and all(type(v) in _CHAR_VALIDATORS for v in self.validators)):
            return
        super().run_validators(value)


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer only: not "5", 5.0 or true, which DRF would take as 5 (or 1)."""

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictFloatField(serializers.FloatField):
    """A JSON number only: not "1.5" or true."""

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    """true or false only: not "yes", 1 or "on", which DRF would take as true."""

    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


@extend_schema_field({"type": "string", "maxLength": MAX_HEADER_VALUE})
class HeaderValueField(serializers.CharField):
    """A header value exactly as sent: DRF's CharField would turn `5` into "5" and trim spaces.
    What a value may contain is the one header rule's business (schedules.targets)."""

    def __init__(self, **kwargs):
        super().__init__(allow_blank=True, trim_whitespace=False, **kwargs)
        self.validators = []

    def validate_empty_values(self, data):
        return (False, data)  # null too goes to the header rule, which says what is wrong with it

    def to_internal_value(self, data):
        return data


@extend_schema_serializer(component_name="Target")
class TargetIn(StrictSerializer):
    url = StrictCharField(max_length=MAX_URL)
    method = serializers.ChoiceField(choices=_uniq(TARGET_METHODS), required=False)
    headers = serializers.DictField(child=HeaderValueField(), required=False,
                                    help_text="header names to string values")
    timeoutSeconds = StrictIntegerField(min_value=1, max_value=86400, required=False,
                                        help_text="1 to SCHEDULER_MAX_TIMEOUT_SECONDS (default 1800)")

    def validate(self, attrs):
        # The same rule the service and the worker apply, so the errors land on `target` as theirs do.
        problems = target_header_problems(attrs.get("headers"))
        if problems:
            raise serializers.ValidationError(problems)
        return attrs


@extend_schema_serializer(component_name="RetryPolicy")
class RetryPolicyIn(StrictSerializer):
    maxAttempts = StrictIntegerField(min_value=1, max_value=100, required=False)
    backoffBaseSeconds = StrictFloatField(min_value=MIN_BACKOFF_SECONDS, max_value=MAX_POLICY_SECONDS, required=False)
    backoffMaxSeconds = StrictFloatField(min_value=MIN_BACKOFF_SECONDS, max_value=MAX_POLICY_SECONDS, required=False)


@extend_schema_serializer(component_name="DstPolicy")
class DstPolicyIn(StrictSerializer):
    skipped = serializers.ChoiceField(choices=_uniq(SKIPPED_CHOICES), required=False)
    repeated = serializers.ChoiceField(choices=_uniq(REPEATED_CHOICES), required=False)


@extend_schema_serializer(component_name="ScheduleCreate")
class ScheduleIn(StrictSerializer):
    name = StrictCharField(max_length=MAX_NAME, required=False, allow_blank=True)
    expression = StrictCharField(max_length=MAX_EXPRESSION, help_text="cron, RRULE, at(...) or rate(...)")
    timeZone = StrictCharField(max_length=64, help_text="IANA zone name, e.g. America/New_York")
    payload = serializers.JSONField(required=False, allow_null=True, help_text="sent as the JSON body of each call")
    target = TargetIn()
    enabled = StrictBooleanField(required=False)
    owner = StrictCharField(max_length=64, required=False, allow_null=True, allow_blank=True,
                            help_text="slug of one of the tenant's owners; null for none; left out: the tenant's "
                                      "default owner (create) or unchanged (edit)")
    misfirePolicy = serializers.ChoiceField(choices=MisfirePolicy.choices, required=False)
    catchupLimit = StrictIntegerField(min_value=1, max_value=MAX_CATCHUP_LIMIT, required=False)
    misfireGraceSeconds = StrictIntegerField(min_value=0, max_value=MAX_POLICY_SECONDS, required=False)
    overlapPolicy = serializers.ChoiceField(choices=OverlapPolicy.choices, required=False)
    retryPolicy = RetryPolicyIn(required=False)
    dstPolicy = DstPolicyIn(required=False)
    startAt = UtcDateTimeField(required=False, allow_null=True)
    endAt = UtcDateTimeField(required=False, allow_null=True)
    spreadSeconds = StrictIntegerField(
        min_value=0, max_value=MAX_SPREAD_SECONDS, required=False,
        help_text="each occurrence becomes eligible a fixed offset in [0, spreadSeconds) after its nominal "
                  "instant, the same every time for this schedule; below the rule's shortest interval; "
                  "default: the tenant's defaultSpreadSeconds")


@extend_schema_serializer(component_name="ScheduleEdit")
class SchedulePatchIn(ScheduleIn):
    expectedVersion = StrictIntegerField(
        min_value=1, max_value=2**31 - 1, help_text="the version this edit was made against; 409 if stale"
    )

    def __init__(self, *args, **kwargs):
        kwargs["partial"] = True
        super().__init__(*args, **kwargs)

    def validate(self, attrs):
        if "expectedVersion" not in attrs:
            raise serializers.ValidationError({"expectedVersion": ["this field is required"]})
        return attrs


_per_thread = threading.local()


def _one(cls):
    """One instance of a serializer class per thread. DRF deep-copies a serializer's declared
    fields (about forty here, with the nested ones) for every new instance: that copy was a third
    of a create's Python time, and of a 1,000-item batch's. The fields keep nothing between
    calls of run_validation, so one instance serves every call. (Output goes through
    representation.compiled, which reads a serializer's declaration once.)"""
    inst = getattr(_per_thread, cls.__name__, None)
    if inst is None:
        inst = cls()
        setattr(_per_thread, cls.__name__, inst)
    return inst


def validate_schedule(data) -> dict:
    """The validated body of a create: exactly `ScheduleIn(data=data).is_valid(raise_exception=True)`
    and its `validated_data`, the same ValidationError on a bad body (including DRF's "No data
    provided" for a null one), on the thread's one ScheduleIn."""
    try:
        return _one(ScheduleIn).run_validation(data)
    except serializers.ValidationError as exc:
        detail = exc.detail
        if isinstance(detail, list) and len(detail) == 1 and getattr(detail[0], "code", None) == "null":
            detail = {api_settings.NON_FIELD_ERRORS_KEY: [ErrorDetail("No data provided", code="null")]}
        raise serializers.ValidationError(detail) from None


SIMPLE_FIELDS = {
    "name": "name", "expression": "expression", "timeZone": "time_zone", "payload": "payload",
    "misfirePolicy": "misfire_policy", "catchupLimit": "catchup_limit",
    "misfireGraceSeconds": "misfire_grace_seconds", "overlapPolicy": "overlap_policy",
    "startAt": "start_at", "endAt": "end_at", "spreadSeconds": "spread_seconds",
}
GROUPED_FIELDS = {
    "target": {"url": "target_url", "method": "target_method", "headers": "target_headers",
               "timeoutSeconds": "target_timeout_seconds"},
    "retryPolicy": {"maxAttempts": "max_attempts", "backoffBaseSeconds": "backoff_base_seconds",
                    "backoffMaxSeconds": "backoff_max_seconds"},
    "dstPolicy": {"skipped": "dst_skipped", "repeated": "dst_repeated"},
}
# The service's field name -> its path in the API's body ("target.url").
API_PATHS = {**{v: k for k, v in SIMPLE_FIELDS.items()},
             **{v: f"{group}.{k}" for group, mapping in GROUPED_FIELDS.items() for k, v in mapping.items()}}


def to_fields(data: dict) -> dict:
    """Validated camelCase body -> the service's snake_case versioned fields (only those given)."""
    out = {}
    for k, v in SIMPLE_FIELDS.items():
        if k in data:
            out[v] = data[k]
    if "payload" in out and out["payload"] is None:
        out["payload"] = {}
    # A PATCH may send part of a group (e.g. only target.method): only what is given changes.
    for group, mapping in GROUPED_FIELDS.items():
        for k, v in mapping.items():
            if k in (data.get(group) or {}):
                out[v] = data[group][k]
    return out


def _wire_value(value):
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
    return value


def changed_since_json(changed: dict | None) -> dict | None:
    """StaleVersion.changed_since in the API's names: {"target.url": {"expected": ..., "current": ...}}."""
    if changed is None:
        return None
    return {API_PATHS.get(k, k): {"expected": _wire_value(a), "current": _wire_value(b)}
            for k, (a, b) in changed.items() if k in API_PATHS}


@extend_schema_serializer(component_name="Target")
class TargetOut(serializers.Serializer):
    url = serializers.CharField(source="target_url")
    method = serializers.CharField(source="target_method")
    headers = serializers.DictField(source="target_headers", child=serializers.CharField(allow_blank=True))
    timeoutSeconds = serializers.IntegerField(source="target_timeout_seconds")


@extend_schema_serializer(component_name="RetryPolicy")
class RetryPolicyOut(serializers.Serializer):
    maxAttempts = serializers.IntegerField(source="max_attempts")
    backoffBaseSeconds = serializers.FloatField(source="backoff_base_seconds")
    backoffMaxSeconds = serializers.FloatField(source="backoff_max_seconds")


@extend_schema_serializer(component_name="DstPolicy")
class DstPolicyOut(serializers.Serializer):
    skipped = serializers.CharField(source="dst_skipped")
    repeated = serializers.CharField(source="dst_repeated")


@extend_schema_serializer(component_name="Schedule")
class ScheduleOut(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField(allow_blank=True)
    version = serializers.IntegerField()
    status = serializers.ChoiceField(choices=ScheduleStatus.choices)
    enabled = serializers.BooleanField()
    owner = serializers.CharField(source="owner_slug", allow_null=True, help_text="the owner's slug")
    nextRunAt = serializers.DateTimeField(source="next_run_at", allow_null=True)
    expression = serializers.CharField(source="current.expression")
    timeZone = serializers.CharField(source="current.time_zone")
    payload = serializers.JSONField(source="current.payload")
    target = TargetOut(source="current")
    misfirePolicy = serializers.ChoiceField(source="current.misfire_policy", choices=MisfirePolicy.choices)
    catchupLimit = serializers.IntegerField(source="current.catchup_limit")
    misfireGraceSeconds = serializers.IntegerField(source="current.misfire_grace_seconds")
    overlapPolicy = serializers.ChoiceField(source="current.overlap_policy", choices=OverlapPolicy.choices)
    retryPolicy = RetryPolicyOut(source="current")
    dstPolicy = DstPolicyOut(source="current")
    startAt = serializers.DateTimeField(source="current.start_at", allow_null=True)
    endAt = serializers.DateTimeField(source="current.end_at", allow_null=True)
    spreadSeconds = serializers.IntegerField(source="current.spread_seconds", help_text="the spread window, 0 for none")
    spreadOffsetSeconds = serializers.IntegerField(
        source="current.spread_offset_seconds",
        help_text="this schedule's offset in [0, spreadSeconds): each occurrence is eligible this long after it")
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")
    pausedAt = serializers.DateTimeField(source="paused_at", allow_null=True)
    archivedAt = serializers.DateTimeField(source="archived_at", allow_null=True)
    lastError = serializers.CharField(source="last_error", allow_blank=True)
    managedName = serializers.CharField(source="managed_name", allow_null=True,
                                        help_text="the name a schedule set manages it by (POST /schedules/apply); "
                                                  "null when no set manages it")


_schedule_json = compiled(ScheduleOut())


def schedule_json(schedule: Schedule) -> dict:
    """ScheduleOut's output (compiled once: representation.py)."""
    return _schedule_json(schedule)


@extend_schema_serializer(component_name="Backfill")
class BackfillIn(StrictSerializer):
    to = UtcDateTimeField(help_text="end of the range (exclusive)")
    # "from" is a Python keyword, so it cannot be written as a class attribute; the class body's
    # namespace is a plain dict, and DRF collects declared fields from it.
    locals()["from"] = UtcDateTimeField(help_text="start of the range (inclusive)")


@extend_schema_serializer(component_name="BackfillResult")
class BackfillOut(serializers.Serializer):
    runs = serializers.IntegerField(help_text="runs made (instants that already had a run are left alone)")


@extend_schema_serializer(component_name="Occurrence")
class OccurrenceOut(serializers.Serializer):
    at = serializers.DateTimeField(help_text="the instant, UTC")
    local = serializers.CharField(help_text="the instant in the schedule's zone, with its offset")
    wall = serializers.CharField(help_text="the local wall time the rule meant")
    note = serializers.CharField(allow_null=True, help_text="why DST moved or dropped it, else null")
    dropped = serializers.BooleanField(help_text="true when the DST policy drops this instant (no run)")
    startsAt = serializers.DateTimeField(
        required=False, help_text="a schedule's preview: when the run becomes eligible (at + its spread offset)")


def occurrence_json(wire: dict, *, offset_seconds: int | None = None) -> dict:
    """An occurrence on the wire; a schedule's preview (`offset_seconds` given) also says when its
    run becomes eligible."""
    out = {"at": wire["at"], "local": wire["local"], "wall": wire["wall"], "note": wire["note"],
           "dropped": bool(wire.get("dropped"))}
    if offset_seconds is not None:
        at = datetime.fromisoformat(wire["at"].replace("Z", "+00:00")) + timedelta(seconds=offset_seconds)
        out["startsAt"] = at.astimezone(timezone.utc).replace(tzinfo=None).isoformat(
            timespec="microseconds" if at.microsecond else "seconds") + "Z"
    return out


@extend_schema_serializer(component_name="OccurrenceList")
class OccurrencesOut(serializers.Serializer):
    occurrences = OccurrenceOut(many=True)


@extend_schema_serializer(component_name="ExpressionPreview")
class ExpressionPreviewIn(StrictSerializer):
    expression = StrictCharField(max_length=MAX_EXPRESSION)
    timeZone = StrictCharField(max_length=64)
    count = StrictIntegerField(min_value=1, max_value=100, required=False, help_text="1-100, default 10")
    dstPolicy = DstPolicyIn(required=False)
    locals()["from"] = UtcDateTimeField(
        required=False, help_text="first instant considered (inclusive) and the anchor of rate(); default now"
    )


@extend_schema_serializer(component_name="ApiKeyCreate")
class ApiKeyIn(StrictSerializer):
    label = StrictCharField(max_length=200, required=False, allow_blank=True)


@extend_schema_serializer(component_name="ApiKey")
class ApiKeyOut(serializers.Serializer):
    id = serializers.UUIDField()
    prefix = serializers.CharField(help_text="the key's first characters, to recognise it")
    label = serializers.CharField(allow_blank=True)
    active = serializers.BooleanField(source="is_active")
    createdAt = serializers.DateTimeField(source="created_at")
    createdBy = serializers.CharField(source="created_by", allow_blank=True)
    lastUsedAt = serializers.DateTimeField(source="last_used_at", allow_null=True,
                                           help_text="updated at most once a minute")
    revokedAt = serializers.DateTimeField(source="revoked_at", allow_null=True)


@extend_schema_serializer(component_name="NewApiKey")
class ApiKeyCreatedOut(ApiKeyOut):
    key = serializers.CharField(help_text="the key itself: shown this once, stored only as a hash")


@extend_schema_serializer(component_name="AuditEntry")
class AuditEntryOut(serializers.Serializer):
    id = serializers.IntegerField(help_text="the entry's number: grows with every entry")
    at = serializers.DateTimeField()
    actor = serializers.CharField(help_text="key:<prefix>, user:<name> or system:<command>")
    action = serializers.CharField()
    objectType = serializers.CharField(source="object_type")
    objectId = serializers.CharField(source="object_id")
    remoteAddr = serializers.CharField(source="remote_addr", allow_blank=True)
    before = serializers.SerializerMethodField(help_text="what changed, as it was: camelCase, a schedule's fields "
                                               "grouped as a schedule reads (target.url, retryPolicy.maxAttempts)")
    after = serializers.SerializerMethodField(help_text="what changed, as it is now (same shape)")

    @extend_schema_field({"type": "object", "nullable": True, "additionalProperties": True})
    def get_before(self, entry):
        return audit_value(entry.before)

    @extend_schema_field({"type": "object", "nullable": True, "additionalProperties": True})
    def get_after(self, entry):
        return audit_value(entry.after)


# --- error bodies, for the OpenAPI document ------------------------------------------------------


@extend_schema_serializer(component_name="Error")
class ErrorOut(serializers.Serializer):
    error = serializers.CharField(help_text="what went wrong and what to do about it")


@extend_schema_serializer(component_name="BadRequest")
class BadRequestOut(serializers.Serializer):
    error = serializers.CharField(required=False, help_text="a body that is not usable JSON")
    errors = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField()),
        required=False,
        help_text='field errors, {"field": ["message"]}; nested fields as "target.url"',
    )


@extend_schema_serializer(component_name="Conflict")
class ConflictOut(ErrorOut):
    currentVersion = serializers.IntegerField(required=False, help_text="on a stale expectedVersion")
    expectedVersion = serializers.IntegerField(required=False, help_text="on a stale expectedVersion: the one sent")
    changedSince = serializers.DictField(
        child=inline_serializer("FieldChange", {"expected": serializers.JSONField(allow_null=True),
                                                "current": serializers.JSONField(allow_null=True)}),
        required=False, allow_null=True,
        help_text='on a stale expectedVersion: each field that differs between the expected version and the '
                  'current one, {"expression": {"expected": ..., "current": ...}}; null when the schedule never '
                  'had the expected version',
    )
    state = serializers.CharField(required=False, help_text="the run's (or schedule's) current state")
    status = serializers.CharField(required=False, help_text="the schedule's status")


@extend_schema_serializer(component_name="RateLimited")
class RateLimitedOut(ErrorOut):
    retryAfter = serializers.IntegerField(help_text="seconds; also in the Retry-After header")
