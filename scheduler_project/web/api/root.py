"""GET /api/v1/: what the API is and where its parts are, for a person or a client that starts
from the address the README and quickstart print.

It answers the same with or without a key and never looks at one: it names no tenant and no
object, so there is nothing to protect, and a key sent to it is neither checked nor counted
against the key's rate limit (an unknown key learns nothing here that /api/docs/ does not say)."""

from django.http import JsonResponse
from django.urls import reverse
from django.views.decorators.http import require_safe


@require_safe
def api_root(request):
    def link(name):
        return request.build_absolute_uri(reverse(name))

    return JsonResponse({
        "api": "scheduler",
        "version": "v1",
        "authentication": "send 'Authorization: Bearer <API key>' on every other endpoint; a key acts for its tenant",
        "links": {
            "schedules": link("api-schedules"),
            "schedulesBatch": link("api-schedules-batch"),
            "expressionPreview": link("api-expressions-preview"),
            "runs": link("api-runs"),
            "keys": link("api-keys"),
            "audit": link("api-audit"),
            "openapi": link("api-schema"),
            "docs": link("api-docs"),
        },
    })
