"""Every API error is a JSON body a person can act on: field errors as {"errors": {...}}, other
errors as {"error": "...", ...details}. Never a stack trace, never a 500 for bad input."""

import logging

from django.http import Http404, JsonResponse
from django.views import defaults
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_handler

from scheduler_project.errors import ServiceError, ValidationFailed

log = logging.getLogger("scheduler.api")


def exception_handler(exc, context):
    if isinstance(exc, ValidationFailed):
        return Response({"errors": exc.errors}, status=400)
    if isinstance(exc, ServiceError):
        return Response({"error": exc.message, **exc.extra}, status=exc.status)
    if isinstance(exc, exceptions.ValidationError):
        detail = exc.detail if isinstance(exc.detail, dict) else {"nonFieldErrors": exc.detail}
        return Response({"errors": _plain(detail)}, status=400)
    if isinstance(exc, exceptions.ParseError):
        return Response({"error": f"the request body is not valid JSON: {exc.detail}"}, status=400)
    if isinstance(exc, (Http404, exceptions.NotFound)):
        return Response({"error": "not found"}, status=404)
    if isinstance(exc, (exceptions.NotAuthenticated, exceptions.AuthenticationFailed)):
        resp = Response({"error": str(exc.detail)}, status=401)
        resp["WWW-Authenticate"] = 'Bearer realm="api"'
        return resp
    response = drf_handler(exc, context)
    if response is not None:
        detail = getattr(exc, "detail", None)
        response.data = {"error": str(detail) if detail is not None else response.status_text}
        return response
    log.exception("unhandled API error", exc_info=exc)
    return Response({"error": "internal error; it has been logged"}, status=status.HTTP_500_INTERNAL_SERVER_ERROR)


def _plain(detail):
    if isinstance(detail, dict):
        return {k: _plain(v) for k, v in detail.items()}
    if isinstance(detail, list):
        flat = []
        for item in detail:
            p = _plain(item)
            if isinstance(p, list):
                flat.extend(p)
            else:
                flat.append(p)
        return flat
    return str(detail)


def json_404(request, exception=None):
    """API paths answer JSON; portal pages keep Django's HTML page."""
    if request.path.startswith("/api/"):
        return JsonResponse({"error": "not found"}, status=404)
    return defaults.page_not_found(request, exception)


def json_500(request):
    if request.path.startswith("/api/"):
        return JsonResponse({"error": "internal error; it has been logged"}, status=500)
    return defaults.server_error(request)
