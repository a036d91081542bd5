"""What every API view shares: the query parameters an operation documents are the only ones it
takes, and none of them may be empty.

Unknown body fields have always been a 400 (a typo must not leave a default in force unnoticed);
query parameters now follow the same rule, for the same reason: `?stat=dead` used to list every
run. `operation()` is drf-spectacular's `extend_schema` that also remembers the documented query
parameters, so the document and the check cannot drift apart. And an empty value (`?cursor=`,
`?enabled=`) is a 400 rather than "no filter": a client that sends one by mistake hears about it.
A parameter given twice is a 400 too, rather than the last one silently winning.
"""

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.views import APIView

from scheduler_project.foundation.errors import ValidationFailed


def operation(**kwargs):
    names = frozenset(
        p.name for p in kwargs.get("parameters") or ()
        if isinstance(p, OpenApiParameter) and p.location == OpenApiParameter.QUERY
    )

    def decorate(handler):
        handler.query_parameters = names
        return extend_schema(**kwargs)(handler)

    return decorate


class ApiView(APIView):
    def initial(self, request, *args, **kwargs):
        # Authentication, permission and the rate limit first: no key is a 401 whatever the query.
        super().initial(request, *args, **kwargs)
        handler = getattr(self, request.method.lower(), None)
        allowed = getattr(handler, "query_parameters", frozenset())
        errors = {}
        for name, values in request.query_params.lists():
            if name not in allowed:
                errors[name or "(unnamed)"] = [
                    f"unknown query parameter; this operation takes {', '.join(sorted(allowed)) or 'none'}"]
            elif any(v == "" for v in values):
                errors[name] = ["give a value or leave the parameter out"]
            elif len(values) > 1:
                # Every parameter takes one value (a list is comma-separated in one): which of
                # `?by=owner&by=target` counts would be a guess, so neither does.
                errors[name] = ["give this parameter once"]
        if errors:
            raise ValidationFailed(dict(sorted(errors.items())))


def require_request_bodies(result, generator, request, public):
    """drf-spectacular post-processing hook: every documented request body is required. Bodies are
    JSON objects; an operation whose fields are all optional (POST /keys) takes `{}`, not nothing."""
    for path in result.get("paths", {}).values():
        for op in path.values():
            if isinstance(op, dict) and "requestBody" in op:
                op["requestBody"]["required"] = True
    return result
