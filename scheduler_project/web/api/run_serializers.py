"""API shapes for runs and attempts: camelCase on the wire, UTC times with `Z`."""

from drf_spectacular.utils import extend_schema_serializer
from rest_framework import serializers

from runs.models import AttemptOutcome, Run, RunKind, RunState, with_history, with_spread


@extend_schema_serializer(component_name="Attempt")
class AttemptOut(serializers.Serializer):
    generation = serializers.IntegerField()
    workerId = serializers.CharField(source="worker_id", allow_blank=True)
    startedAt = serializers.DateTimeField(source="started_at")
    finishedAt = serializers.DateTimeField(source="finished_at", allow_null=True)
    outcome = serializers.ChoiceField(choices=AttemptOutcome.choices, allow_null=True,
                                      help_text="null while in flight; 'unknown' when the lease expired")
    httpStatus = serializers.IntegerField(source="http_status", allow_null=True)
    errorClass = serializers.CharField(source="error_class", allow_blank=True)
    error = serializers.CharField(allow_blank=True)
    responseExcerpt = serializers.CharField(source="response_excerpt", allow_blank=True)
    latencyMs = serializers.IntegerField(source="latency_ms", allow_null=True)
    canceledInFlight = serializers.BooleanField(source="canceled_in_flight")
    lateResult = serializers.JSONField(source="late_result", allow_null=True)
    traceparent = serializers.CharField(help_text="the W3C traceparent header this attempt's call carried")
    traceId = serializers.CharField(source="trace_id", help_text="the run's trace: the same on every attempt")
    spanId = serializers.CharField(source="span_id", help_text="this attempt's span: new on every attempt")


@extend_schema_serializer(component_name="Run")
class RunOut(serializers.Serializer):
    id = serializers.UUIDField()
    scheduleId = serializers.UUIDField(source="schedule_id")
    scheduleVersion = serializers.IntegerField(source="schedule_version")
    scheduledTime = serializers.DateTimeField(source="scheduled_time",
                                              help_text="the occurrence's nominal instant: its identity")
    nominalTime = serializers.DateTimeField(source="scheduled_time", help_text="the same as scheduledTime")
    eligibleAt = serializers.DateTimeField(
        source="eligible_from", help_text="when its first attempt could start: nominal + spreadOffsetSeconds "
                                          "(a backfill: when it was made); lags are measured from here")
    spreadSeconds = serializers.IntegerField(source="spread_seconds",
                                             help_text="its version's spread window; 0 for manual and backfill runs")
    spreadOffsetSeconds = serializers.IntegerField(source="spread_offset_seconds")
    localTime = serializers.CharField(source="occurrence.local_time")
    note = serializers.CharField(source="occurrence.note", allow_blank=True)
    kind = serializers.ChoiceField(choices=RunKind.choices)
    state = serializers.ChoiceField(choices=RunState.choices)
    reason = serializers.CharField(allow_null=True, help_text="why it was skipped or canceled, or why it waits")
    generation = serializers.IntegerField()
    attemptsUsed = serializers.IntegerField(source="attempts_used")
    maxAttempts = serializers.IntegerField(source="max_attempts")
    nextEligibleAt = serializers.DateTimeField(source="next_eligible_at", allow_null=True)
    leaseUntil = serializers.DateTimeField(source="lease_until", allow_null=True)
    leaseOwner = serializers.CharField(source="lease_owner", allow_null=True)
    idempotencyKey = serializers.CharField(source="idempotency_key", help_text="sent to the target on every attempt")
    createdAt = serializers.DateTimeField(source="created_at")
    finishedAt = serializers.DateTimeField(source="finished_at", allow_null=True)
    lastError = serializers.CharField(source="last_error", allow_blank=True)
    retriedBy = serializers.CharField(source="retried_by", allow_null=True)
    retriedAt = serializers.DateTimeField(source="retried_at", allow_null=True)
    attempts = AttemptOut(many=True, source="attempt_list")

    def to_representation(self, run: Run):
        if not hasattr(run, "attempt_list"):
            with_history([run])
        with_spread([run])  # nothing to read when the caller read them for its page
        data = super().to_representation(run)
        data["reason"] = data["reason"] or None
        data["leaseOwner"] = data["leaseOwner"] or None
        data["retriedBy"] = data["retriedBy"] or None
        return data
