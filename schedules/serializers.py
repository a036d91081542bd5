"""API shapes for schedules: camelCase on the wire, snake_case fields inside.

Input serializers only check shape and types and turn the body into the service's field dict;
what a schedule means (expression, zone, allowlist, bounds) is checked by `schedules.services`.
"""

from rest_framework import serializers

from schedules.models import MisfirePolicy, OverlapPolicy, Schedule
from schedules.services import TARGET_METHODS


class StrictSerializer(serializers.Serializer):
    """Unknown fields are an error (400), not silently ignored: a typo in a policy name must not
    leave the default in force unnoticed."""

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({k: ["unknown field"] for k in unknown})
        return super().to_internal_value(data)


class TargetIn(StrictSerializer):
    url = serializers.CharField(max_length=2000)
    method = serializers.ChoiceField(choices=TARGET_METHODS, required=False)
    headers = serializers.DictField(child=serializers.CharField(max_length=2000), required=False)
    timeoutSeconds = serializers.IntegerField(min_value=1, required=False)


class RetryPolicyIn(StrictSerializer):
    maxAttempts = serializers.IntegerField(min_value=1, max_value=100, required=False)
    backoffBaseSeconds = serializers.FloatField(min_value=0.001, required=False)
    backoffMaxSeconds = serializers.FloatField(min_value=0.001, required=False)


class DstPolicyIn(StrictSerializer):
    skipped = serializers.ChoiceField(choices=["next_valid", "shift", "skip"], required=False)
    repeated = serializers.ChoiceField(choices=["earlier", "later", "both"], required=False)


class ScheduleIn(StrictSerializer):
    name = serializers.CharField(max_length=200, required=False, allow_blank=True)
    expression = serializers.CharField(max_length=2000)
    timeZone = serializers.CharField(max_length=64)
    payload = serializers.JSONField(required=False)
    target = TargetIn()
    enabled = serializers.BooleanField(required=False)
    misfirePolicy = serializers.ChoiceField(choices=MisfirePolicy.choices, required=False)
    catchupLimit = serializers.IntegerField(min_value=1, max_value=10000, required=False)
    misfireGraceSeconds = serializers.IntegerField(min_value=0, max_value=86400 * 7, required=False)
    overlapPolicy = serializers.ChoiceField(choices=OverlapPolicy.choices, required=False)
    retryPolicy = RetryPolicyIn(required=False)
    dstPolicy = DstPolicyIn(required=False)
    startAt = serializers.DateTimeField(required=False, allow_null=True)
    endAt = serializers.DateTimeField(required=False, allow_null=True)


class SchedulePatchIn(ScheduleIn):
    expectedVersion = serializers.IntegerField(min_value=1)

    def __init__(self, *args, **kwargs):
        kwargs["partial"] = True
        super().__init__(*args, **kwargs)

    def validate(self, attrs):
        if "expectedVersion" not in attrs:
            raise serializers.ValidationError({"expectedVersion": ["this field is required"]})
        return attrs


def to_fields(data: dict, *, current_target: dict | None = None) -> dict:
    """Validated camelCase body -> the service's snake_case versioned fields (only those given)."""
    out = {}
    simple = {
        "name": "name", "expression": "expression", "timeZone": "time_zone", "payload": "payload",
        "misfirePolicy": "misfire_policy", "catchupLimit": "catchup_limit",
        "misfireGraceSeconds": "misfire_grace_seconds", "overlapPolicy": "overlap_policy",
        "startAt": "start_at", "endAt": "end_at",
    }
    for k, v in simple.items():
        if k in data:
            out[v] = data[k]
    if "payload" in out and out["payload"] is None:
        out["payload"] = {}
    t = data.get("target")
    if t is not None:
        out["target_url"] = t["url"]
        for k, v in {"method": "target_method", "headers": "target_headers", "timeoutSeconds": "target_timeout_seconds"}.items():
            if k in t:
                out[v] = t[k]
    for group, mapping in (
        ("retryPolicy", {"maxAttempts": "max_attempts", "backoffBaseSeconds": "backoff_base_seconds",
                         "backoffMaxSeconds": "backoff_max_seconds"}),
        ("dstPolicy", {"skipped": "dst_skipped", "repeated": "dst_repeated"}),
    ):
        for k, v in mapping.items():
            if k in (data.get(group) or {}):
                out[v] = data[group][k]
    return out


class TargetOut(serializers.Serializer):
    url = serializers.CharField(source="target_url")
    method = serializers.CharField(source="target_method")
    headers = serializers.DictField(source="target_headers", child=serializers.CharField())
    timeoutSeconds = serializers.IntegerField(source="target_timeout_seconds")


class RetryPolicyOut(serializers.Serializer):
    maxAttempts = serializers.IntegerField(source="max_attempts")
    backoffBaseSeconds = serializers.FloatField(source="backoff_base_seconds")
    backoffMaxSeconds = serializers.FloatField(source="backoff_max_seconds")


class DstPolicyOut(serializers.Serializer):
    skipped = serializers.CharField(source="dst_skipped")
    repeated = serializers.CharField(source="dst_repeated")


class ScheduleOut(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    version = serializers.IntegerField()
    status = serializers.CharField()
    enabled = serializers.BooleanField()
    nextRunAt = serializers.DateTimeField(source="next_run_at", allow_null=True)
    expression = serializers.CharField(source="current.expression")
    timeZone = serializers.CharField(source="current.time_zone")
    payload = serializers.JSONField(source="current.payload")
    target = TargetOut(source="current")
    misfirePolicy = serializers.CharField(source="current.misfire_policy")
    catchupLimit = serializers.IntegerField(source="current.catchup_limit")
    misfireGraceSeconds = serializers.IntegerField(source="current.misfire_grace_seconds")
    overlapPolicy = serializers.CharField(source="current.overlap_policy")
    retryPolicy = RetryPolicyOut(source="current")
    dstPolicy = DstPolicyOut(source="current")
    startAt = serializers.DateTimeField(source="current.start_at", allow_null=True)
    endAt = serializers.DateTimeField(source="current.end_at", allow_null=True)
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")
    lastError = serializers.CharField(source="last_error")


def schedule_json(schedule: Schedule) -> dict:
    return ScheduleOut(schedule).data
