"""POST /api/v1/schedules/apply: a tenant's whole schedule set, declared by stable name
(docs/api.md, "Schedules as code"). With `dryRun` the answer is the plan and nothing is written;
without it the same plan is carried out in one transaction (runs.schedule_apply). The body takes
the batch create's size limit; a set that does not validate changes nothing and answers 400 with
every item's errors, keyed `schedules[i].<field>`."""

from drf_spectacular.utils import extend_schema_serializer, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response

from runs import schedule_apply
from scheduler_project.web.api.base import ApiView, operation
from scheduler_project.web.api.schedule_serializers import StrictBooleanField, StrictSerializer
from scheduler_project.web.api.schedules import BODY_ERRORS, actor, error_responses
from scheduler_project.web.schedule_set import declared_items


@extend_schema_serializer(component_name="ScheduleSetApply")
class ApplyIn(StrictSerializer):
    schedules = serializers.ListField(
        child=serializers.JSONField(allow_null=True), allow_empty=True,
        help_text="the tenant's whole set: each the body of POST /api/v1/schedules with a required `name` (its "
                  "stable key) and an optional `adopt` (the id of an existing schedule to take over)",
    )
    dryRun = StrictBooleanField(required=False, help_text="answer the plan only; nothing is written")
    prune = StrictBooleanField(required=False, help_text="archive the managed schedules the set no longer names")


PlanOut = inline_serializer("ScheduleSetPlan", {
    "applied": serializers.BooleanField(help_text="false on a dry run, or when nothing needed changing"),
    "changed": serializers.BooleanField(help_text="whether the plan changes anything"),
    "prune": serializers.BooleanField(),
    "summary": serializers.DictField(child=serializers.IntegerField(),
                                     help_text="steps per action: create, adopt, edit, unchanged, archive"),
    "plan": inline_serializer("ScheduleSetStep", {
        "action": serializers.ChoiceField(choices=[str(a) for a in schedule_apply.Action]),
        "name": serializers.CharField(),
        "id": serializers.UUIDField(allow_null=True),
        "version": serializers.IntegerField(allow_null=True),
        "changes": serializers.DictField(required=False, help_text='{"field": [before, after]}'),
    }, many=True),
    "notDeclared": serializers.ListField(child=serializers.CharField(),
                                         help_text="managed schedules the set leaves out, kept (no prune)"),
})


class ScheduleApplyView(ApiView):
    @operation(
        operation_id="schedules_apply",
        summary="Apply a schedule set",
        description="Create, adopt, edit and (with prune) archive the tenant's managed schedules so they are the "
                    "given set; with dryRun, only the plan. All or nothing; the same set twice changes nothing.",
        request=ApplyIn,
        responses={200: PlanOut, **error_responses(*BODY_ERRORS, 409)},
    )
    def post(self, request):
        body = ApplyIn(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        declared = declared_items(data["schedules"])
        plan = schedule_apply.apply_set(request.user.tenant, declared, prune=data.get("prune", False),
                                        dry_run=data.get("dryRun", False), by=actor(request))
        return Response(plan.as_json())
