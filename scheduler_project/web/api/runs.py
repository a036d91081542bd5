"""Runs over HTTP (docs/api.md): list, read a run with its attempts, retry, cancel."""

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter
from rest_framework.response import Response

from runs import actions
from runs.models import Run, RunState, with_history, with_spread
from scheduler_project.foundation.errors import ValidationFailed
from scheduler_project.web.api.base import ApiView, operation
from scheduler_project.web.api.run_serializers import RunOut
from scheduler_project.web.api.schedules import (
    BODY_ERRORS,
    PAGE_PARAMS,
    TEXT,
    actor,
    error_responses,
    page_of,
    parse_choices,
    parse_instant,
    require_empty_body,
)
from scheduler_project.web.pagination import RUN_PAGES
from scheduler_project.web.params import parse_uuid


def tenant_run(request, pk) -> Run:
    """Another tenant's run is a 404, never a 403."""
    return with_history([get_object_or_404(Run, id=pk, tenant=request.user.tenant)])[0]


def run_json(run: Run) -> dict:
    return RunOut(with_history([Run.objects.get(id=run.id)])[0]).data


class RunListView(ApiView):
    @operation(
        operation_id="runs_list",
        summary="List runs",
        description="Newest scheduled time first, with their attempts. Never counted: follow `next`.",
        parameters=[
            OpenApiParameter("schedule", TEXT, required=False, description="a schedule id"),
            OpenApiParameter("state", TEXT, required=False,
                             description=f"comma-separated: {', '.join(RunState.values)}"),
            OpenApiParameter("from", TEXT, required=False,
                             description="scheduledTime at or after (ISO 8601 with offset)"),
            OpenApiParameter("to", TEXT, required=False, description="scheduledTime before (ISO 8601 with offset)"),
            *PAGE_PARAMS,
        ],
        responses={200: page_of(RunOut, "RunPage"), **error_responses(400)},
    )
    def get(self, request):
        params = request.query_params
        qs = Run.objects.filter(tenant=request.user.tenant)
        schedule_id = parse_uuid(params.get("schedule"), field="schedule")
        if schedule_id:
            # Another tenant's schedule id simply matches nothing here: the tenant filter is first.
            qs = qs.filter(schedule_id=schedule_id)
        states = parse_choices(params.get("state"), "state", RunState.values)
        if states:
            qs = qs.filter(state__in=states)
        start, end = parse_instant(params.get("from"), "from"), parse_instant(params.get("to"), "to")
        if start and end and end <= start:
            raise ValidationFailed({"to": ["'to' must be after 'from'"]})
        if start:
            qs = qs.filter(scheduled_time__gte=start)
        if end:
            qs = qs.filter(scheduled_time__lt=end)
        page = RUN_PAGES.page_from_params(qs, params)
        # One query for the whole page's occurrences and one for its attempts, not one per run.
        with_spread(with_history(page.items))
        return Response({"results": RunOut(page.items, many=True).data, "next": page.next})


class RunDetailView(ApiView):
    @operation(operation_id="runs_retrieve", summary="Read a run and its attempts",
               responses={200: RunOut, **error_responses(404)})
    def get(self, request, pk):
        return Response(RunOut(tenant_run(request, pk)).data)


class RunRetryView(ApiView):
    @operation(
        operation_id="runs_retry",
        summary="Retry a dead or canceled run now",
        description="Keeps the run id (the target's Idempotency-Key); 409 from any other state.",
        request=None,
        responses={200: RunOut, **error_responses(*BODY_ERRORS, 404, 409)},
    )
    def post(self, request, pk):
        run = tenant_run(request, pk)
        require_empty_body(request)
        return Response(run_json(actions.retry_run(run, by=actor(request))))


class RunCancelView(ApiView):
    @operation(
        operation_id="runs_cancel",
        summary="Cancel a ready or leased run",
        description="A leased run's worker is fenced off: whatever it reports later is kept only as "
                    "evidence. 409 from a terminal state.",
        request=None,
        responses={200: RunOut, **error_responses(*BODY_ERRORS, 404, 409)},
    )
    def post(self, request, pk):
        run = tenant_run(request, pk)
        require_empty_body(request)
        return Response(run_json(actions.cancel_run(run, by=actor(request))))
