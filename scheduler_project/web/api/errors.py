"""Every API error is a JSON body a person can act on: field errors as {"errors": {...}}, other
errors as {"error": "...", ...details}. Never a stack trace, never a 500 for bad input.

Also the request body parser, because most bad input is caught there: a body over the size limit is
refused before it is read (413), and a body that is JSON but that PostgreSQL or the serializers
cannot take (NUL characters, lone surrogates, Infinity, absurd nesting or integers) is a 400 here
instead of a 500 later."""

import json
import logging
import math
import sys

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.http import Http404, JsonResponse
from django.shortcuts import render
from django.views import defaults
from rest_framework import exceptions, status
from rest_framework.parsers import JSONParser
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import exception_handler as drf_handler

from scheduler_project.foundation.errors import PayloadTooLarge, ServiceError, ValidationFailed
from scheduler_project.web.bodylimit import limit_for
from scheduler_project.web.unavailable import RETRY_AFTER_SECONDS, answer_body, database_unavailable
from schedules import timeexpr

log = logging.getLogger("scheduler.api")

# Deeper than this is refused: the renderer and PostgreSQL's jsonb both recurse, and Python's
# recursion limit is shared with Django's own call stack, so a 900-deep payload that parses can
# still crash on the way out.
MAX_JSON_DEPTH = 64
# 64-bit signed: what PostgreSQL bigint, JavaScript's BigInt64 and most clients round-trip.
MAX_JSON_INT = 2**63 - 1


def _too_large(size_text: str, limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"the request body is {size_text}; the limit is {limit} bytes "
        f"(a schedule's payload may be at most {settings.SCHEDULER_MAX_PAYLOAD_BYTES} bytes)"
    )


def _reject_constant(name):
    raise ValueError(f"{name} is not valid JSON")


def check_json_value(value, path: str = "body") -> None:
    """Raise ParseError for values that are legal in Python's JSON but not storable or not
    portable. Iterates with an explicit stack so a hostile body cannot exhaust recursion here.
    Where a value is (`body.schedules[3].name`) is spelled out only for an error: a batch's body
    holds thousands of values, nearly always all fine."""
    stack = [(value, 1, path)]
    while stack:
        v, d, where = stack.pop()
        if d > MAX_JSON_DEPTH:
            raise exceptions.ParseError(f"{_spelled(where)} is nested more than {MAX_JSON_DEPTH} levels deep")
        if isinstance(v, dict):
            for k, item in v.items():
                _check_string(k, (where, " key", None))
                stack.append((item, d + 1, (where, ".", k)))
        elif isinstance(v, list):
            for i, item in enumerate(v):
                stack.append((item, d + 1, (where, "[", i)))
        elif isinstance(v, str):
            _check_string(v, where)
        elif isinstance(v, bool) or v is None:
            pass
        elif isinstance(v, int):
            if abs(v) > MAX_JSON_INT:
                raise exceptions.ParseError(f"{_spelled(where)}: integers must fit in 64 bits")
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise exceptions.ParseError(f"{_spelled(where)}: numbers must be finite")


def _spelled(where) -> str:
    """A place as check_json_value names it: `where` is the path's text, or (parent, step, key) for
    a key (step " key"), a member (".") or an item ("["), each step's text cut at 200 characters."""
    steps = []
    while not isinstance(where, str):
        where, step, key = where
        steps.append((step, key))
    for step, key in reversed(steps):
        where = f"{where} key" if step == " key" else f"{where}.{key}"[:200] if step == "." else f"{where}[{key}]"[:200]
    return where


def _check_string(s: str, where) -> None:
    if "\x00" in s:
        raise exceptions.ParseError(f"{_spelled(where)}: strings may not contain NUL (\\u0000)")
    if s.isascii():
        return  # no surrogate is ASCII
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise exceptions.ParseError(
            f"{_spelled(where)}: strings must be valid Unicode (a lone surrogate escape was sent)") from None


def _unique_keys(pairs: list) -> dict:
    """An object with a key given twice is refused: JSON leaves the meaning open, Python keeps the
    last one silently, and what the client meant may well be the first."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"the key {key[:200]!r} appears more than once in one object")
            seen.add(key)
    return obj


class LimitedJSONParser(JSONParser):
    """JSON bodies only, at most the path's body limit (bodylimit.limit_for): the Content-Length is checked before a byte
    is read, and the read itself is capped, so a chunked or lying body is bounded too."""

    def parse(self, stream, media_type=None, parser_context=None):
        parser_context = parser_context or {}
        request = parser_context.get("request")
        limit = limit_for(getattr(request, "path", "/api/"))
        meta = getattr(request, "META", {}) if request is not None else {}
        try:
            declared = int(meta.get("CONTENT_LENGTH") or 0)
        except (TypeError, ValueError):
            declared = 0
        if declared > limit:
            raise _too_large(f"{declared} bytes", limit)
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise _too_large(f"over {limit} bytes", limit)
        if not raw.strip():
            return {}
        encoding = parser_context.get("encoding", settings.DEFAULT_CHARSET)
        try:
            text = raw.decode(encoding)
        except (UnicodeDecodeError, LookupError):
            raise exceptions.ParseError(f"the body is not valid {encoding}")
        try:
            data = json.loads(text, parse_constant=_reject_constant if api_settings.STRICT_JSON else None,
                              object_pairs_hook=_unique_keys)
        except RecursionError:
            raise exceptions.ParseError(f"the body is nested more than {MAX_JSON_DEPTH} levels deep")
        except ValueError as e:
            raise exceptions.ParseError(str(e))
        check_json_value(data)
        return data


def exception_handler(exc, context):
    if isinstance(exc, RequestDataTooBig):
        # RequestBodyLimitMiddleware refuses these first; kept so the answer never depends on it.
        request = context.get("request")
        limit = limit_for(getattr(request, "path", "/api/"))
        return Response({"error": _too_large("over the limit", limit).message}, status=413)
    if isinstance(exc, SuspiciousOperation):
        return Response({"error": f"bad request: {exc}"}, status=400)
    if isinstance(exc, ValidationFailed):
        return Response({"errors": flatten_errors(exc.errors)}, status=400)
    if isinstance(exc, ServiceError):
        resp = Response({"error": exc.message, **exc.extra}, status=exc.status)
        if exc.status == 429 and "retryAfter" in exc.extra:
            resp["Retry-After"] = str(exc.extra["retryAfter"])
        return resp
    if isinstance(exc, timeexpr.ExpressionError):
        # A stored rule met its work budget (e.g. over a backfill's range): the engine's message.
        return Response({"errors": {exc.field: [str(exc)]}}, status=400)
    if isinstance(exc, exceptions.ValidationError):
        detail = exc.detail if isinstance(exc.detail, dict) else {"body": exc.detail}
        return Response({"errors": flatten_errors(_plain(detail))}, status=400)
    if isinstance(exc, exceptions.ParseError):
        return Response({"error": f"the request body is not usable JSON: {exc.detail}"}, status=400)
    if isinstance(exc, (Http404, exceptions.NotFound)):
        return Response({"error": "not found"}, status=404)
    if isinstance(exc, (exceptions.NotAuthenticated, exceptions.AuthenticationFailed)):
        resp = Response({"error": str(exc.detail)}, status=401)
        resp["WWW-Authenticate"] = 'Bearer realm="api"'
        return resp
    if isinstance(exc, exceptions.Throttled):
        wait = max(1, math.ceil(exc.wait or 1))
        resp = Response(
            {"error": f"rate limit exceeded for this API key; retry in {wait} s", "retryAfter": wait},
            status=429,
        )
        resp["Retry-After"] = str(wait)
        return resp
    if database_unavailable(exc):
        log.warning("API request not served: the database is unavailable", exc_info=exc)
        resp = Response(answer_body(), status=503)
        resp["Retry-After"] = str(RETRY_AFTER_SECONDS)
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


def flatten_errors(errors: dict, prefix: str = "") -> dict[str, list[str]]:
    """{"target": {"url": ["..."]}} -> {"target.url": ["..."]}: one shape, `{"field": ["message"]}`,
    whatever the nesting, so a client can show each message next to its field."""
    out: dict[str, list[str]] = {}
    for key, value in errors.items():
        name = "body" if key == api_settings.NON_FIELD_ERRORS_KEY and not prefix else str(key)
        if key == api_settings.NON_FIELD_ERRORS_KEY and prefix:
            name = ""
        full = f"{prefix}.{name}" if prefix and name else (prefix or name)
        if isinstance(value, dict):
            out.update(flatten_errors(value, full))
            continue
        items = value if isinstance(value, list) else [value]
        for item in items:
            if isinstance(item, dict):
                out.update(flatten_errors(item, full))
            else:
                out.setdefault(full, []).append(str(item))
    return out


def _wants_json(request) -> bool:
    return request.path.startswith("/api/")


def json_400(request, exception=None):
    if _wants_json(request):
        return JsonResponse({"error": "bad request"}, status=400)
    return defaults.bad_request(request, exception)


def json_403(request, exception=None):
    if _wants_json(request):
        return JsonResponse({"error": "forbidden"}, status=403)
    return defaults.permission_denied(request, exception)


def json_404(request, exception=None):
    """API paths answer JSON; portal pages keep Django's HTML page."""
    if _wants_json(request):
        return JsonResponse({"error": "not found"}, status=404)
    return defaults.page_not_found(request, exception)


def json_500(request):
    # Django calls this inside its `except` for the error, so the error is still at hand (a
    # portal page, the admin, /metrics, or the API's middleware: outside DRF's own handler).
    if database_unavailable(sys.exc_info()[1]):
        if _wants_json(request):
            resp = JsonResponse(answer_body(), status=503)
        else:
            resp = render(request, "503.html", {"retry_after": RETRY_AFTER_SECONDS}, status=503)
        resp["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return resp
    if _wants_json(request):
        return JsonResponse({"error": "internal error; it has been logged"}, status=500)
    return defaults.server_error(request)
