"""POST /api/v1/schedules/batch: many schedules in one request (docs/api.md).

Each item is exactly the body of `POST /api/v1/schedules` and is checked by the same serializer and
the same service validation (runs.actions.create_schedules), quotas included; the valid
items are stored together in one transaction, and the answer has one result per item, in order:
201 with the new schedule's id, version and next run, or the status and error body the single
create would have answered. The whole answer is 201 when every item was created, 207 when some
were, 400 when none was (then, as for any error, an Idempotency-Key is not remembered and the
client may fix the items and retry with it). An Idempotency-Key works as on a single create, in its
own scope.

The batch counts as one request against the per-key rate limit; its body must fit the API's body
limit (SCHEDULER_MAX_REQUEST_BYTES).
"""

from drf_spectacular.utils import OpenApiResponse, extend_schema_serializer, inline_serializer
from rest_framework import exceptions, serializers
from rest_framework.response import Response

from runs import actions
from scheduler_project.foundation.dbclock import request_now
from scheduler_project.foundation.errors import ServiceError
from scheduler_project.web.api.base import ApiView, operation
from scheduler_project.web.api.errors import exception_handler
from scheduler_project.web.api.idempotency import idempotent
from scheduler_project.web.api.schedule_serializers import StrictSerializer, to_fields, validate_schedule
from scheduler_project.web.api.schedules import BODY_ERRORS, IDEMPOTENCY_PARAM, actor, error_responses, owner_given

MAX_ITEMS = actions.MAX_BATCH


@extend_schema_serializer(component_name="ScheduleBatchCreate")
class ScheduleBatchIn(StrictSerializer):
    schedules = serializers.ListField(
        # null too: an item that is not an object gets the single create's answer in its own
        # result (validate_schedule), instead of refusing the whole batch.
        child=serializers.JSONField(allow_null=True), min_length=1, max_length=MAX_ITEMS,
        help_text=f"1 to {MAX_ITEMS} schedules, each the body of POST /api/v1/schedules",
    )


ITEM_RESULT = {
    "index": serializers.IntegerField(help_text="the item's position in `schedules`"),
    "status": serializers.IntegerField(help_text="201, or what a single create would have answered (400, 413)"),
    "id": serializers.UUIDField(required=False),
    "version": serializers.IntegerField(required=False),
    "nextRunAt": serializers.DateTimeField(required=False, allow_null=True),
    "errors": serializers.DictField(child=serializers.ListField(child=serializers.CharField()), required=False),
    "error": serializers.CharField(required=False),
}

BatchOut = inline_serializer("ScheduleBatchResults", {
    "results": inline_serializer("ScheduleBatchResult", ITEM_RESULT, many=True),
    "created": serializers.IntegerField(),
    "failed": serializers.IntegerField(),
})


def _refused(exc: Exception, index: int) -> dict:
    """The status and body the single create answers for this error (the API's own handler)."""
    resp = exception_handler(exc, {})
    return {"index": index, "status": resp.status_code, **resp.data}


def _created(schedule, index: int) -> dict:
    nxt = schedule.next_run_at
    return {"index": index, "status": 201, "id": str(schedule.id), "version": schedule.version,
            "nextRunAt": nxt.isoformat().replace("+00:00", "Z") if nxt else None}


class ScheduleBatchView(ApiView):
    @operation(
        operation_id="schedules_batch_create",
        summary="Create up to 1,000 schedules",
        description="Each item is the body of a single create and is validated the same way (quotas included). "
                    "Valid items are stored in one transaction; the answer has one result per item. 201: all "
                    "created; 207: some; 400: none.",
        request=ScheduleBatchIn,
        parameters=[IDEMPOTENCY_PARAM],
        responses={201: BatchOut, 207: OpenApiResponse(BatchOut, "some items were created, some refused"),
                   **error_responses(*BODY_ERRORS, 422)},
    )
    def post(self, request):
        def create():
            body = ScheduleBatchIn(data=request.data)
            body.is_valid(raise_exception=True)
            items = body.validated_data["schedules"]
            results: list = [None] * len(items)
            given = []
            for index, item in enumerate(items):
                try:
                    data = validate_schedule(item)  # as a single create checks its body
                except exceptions.ValidationError as exc:
                    results[index] = _refused(exc, index)
                    continue
                fields = to_fields(data)
                fields["enabled"] = data.get("enabled", True)
                try:
                    fields.update(owner_given(request, data))
                except ServiceError as exc:
                    results[index] = _refused(exc, index)
                    continue
                given.append((index, fields))
            made = actions.create_schedules(request.user.tenant, [f for _, f in given], by=actor(request),
                                            now=request_now(request)) if given else []
            for (index, _), outcome in zip(given, made):
                results[index] = _refused(outcome, index) if isinstance(outcome, ServiceError) else _created(outcome, index)
            created = sum(1 for r in results if r["status"] == 201)
            status = 201 if created == len(items) else 207 if created else 400
            return Response({"results": results, "created": created, "failed": len(items) - created}, status=status)

        return idempotent(request, "schedules.batch", create)
