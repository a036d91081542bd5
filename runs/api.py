"""Runs over HTTP (api.md): read a run with its attempts, retry, cancel."""

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from runs import services
from runs.models import Run
from runs.serializers import RunOut
from schedules.api import actor


def tenant_run(request, pk) -> Run:
    """Another tenant's run is a 404, never a 403."""
    return get_object_or_404(Run.objects.select_related("occurrence"), id=pk, tenant=request.user.tenant)


class RunDetailView(APIView):
    @extend_schema(responses=RunOut)
    def get(self, request, pk):
        return Response(RunOut(tenant_run(request, pk)).data)


class RunRetryView(APIView):
    @extend_schema(request=None, responses={200: RunOut})
    def post(self, request, pk):
        run = services.retry_run(tenant_run(request, pk), by=actor(request))
        return Response(RunOut(Run.objects.select_related("occurrence").get(id=run.id)).data)


class RunCancelView(APIView):
    @extend_schema(request=None, responses={200: RunOut})
    def post(self, request, pk):
        run = services.cancel_run(tenant_run(request, pk), by=actor(request))
        return Response(RunOut(Run.objects.select_related("occurrence").get(id=run.id)).data)
