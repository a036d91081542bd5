"""Request bodies are bounded before anything reads them.

DRF's JSON parsing reads `request.body` whole before a parser sees it, and Django reads it whole
up to DATA_UPLOAD_MAX_MEMORY_SIZE (then raises, which a DRF view turned into a 500). So the size
is decided here, first, from the Content-Length alone: over the limit is a 413 and not a byte of
the body is read (`limit_for(path)`: the batch create's, the rest of the API's, or the form limit).

A chunked body has no Content-Length, and Django reads it as empty (a create then failed with
"expression required"). Where the server has de-chunked the body and marks the input as
terminated (gunicorn sets `wsgi.input_terminated`), it is read here under the same bound, at
most limit + 1 bytes, and handed on with its length; under a server that does not (Django's
runserver), it is refused with 411 Length Required, which says what to send instead. A chunked
body the server cannot de-chunk (a chunk size that is not a hexadecimal number, a chunk without
its terminator, a client that stops sending mid-body) is a 400 that says so, not a 500: the
server raises its parse error, or an OSError for a connection gone quiet, out of the read here.
"""

import io

from django.conf import settings
from django.http import HttpResponse, JsonResponse

try:  # what gunicorn raises when a body it de-chunks is malformed (NoMoreData is an OSError)
    from gunicorn.http.errors import ParseException as _ServerParseError
except ImportError:  # another server: its own errors are OSErrors or ValueErrors
    _ServerParseError = ValueError

_BROKEN_BODY = (_ServerParseError, OSError, ValueError)


def max_request_bytes() -> int:
    """The API's raw body limit. The payload limit (SCHEDULER_MAX_PAYLOAD_BYTES) is checked exactly
    by the service on the compact JSON of `payload`; the raw body also carries the other fields and
    whatever whitespace the client's encoder adds, so by default it gets twice that plus 64 KiB of
    headroom. It exists so that a huge body is refused without being read."""
    explicit = getattr(settings, "SCHEDULER_MAX_REQUEST_BYTES", None)
    if explicit:
        return int(explicit)
    return 2 * settings.SCHEDULER_MAX_PAYLOAD_BYTES + 65536


# The batch create carries up to a thousand schedules in one body: its own, larger limit, which a
# schedule set's apply shares.
BATCH_PATH = "/api/v1/schedules/batch"
APPLY_PATH = "/api/v1/schedules/apply"


def max_batch_request_bytes() -> int:
    """The batch create's raw body limit (SCHEDULER_MAX_BATCH_REQUEST_BYTES), never below the
    single request's: each item is still checked against the payload limit by the service."""
    return max(int(settings.SCHEDULER_MAX_BATCH_REQUEST_BYTES), max_request_bytes())


def limit_for(path: str) -> int:
    """The raw body limit of a request to `path` (the middleware here and the API's JSON parser)."""
    if path.rstrip("/") in (BATCH_PATH, APPLY_PATH):
        return max_batch_request_bytes()
    return max_request_bytes() if path.startswith("/api/") else settings.DATA_UPLOAD_MAX_MEMORY_SIZE


def _refuse(request, status: int, message: str):
    if request.path.startswith("/api/"):
        return JsonResponse({"error": message}, status=status)
    return HttpResponse(message + "\n", status=status, content_type="text/plain; charset=utf-8")


class RequestBodyLimitMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        refused = self.check(request)
        return refused if refused is not None else self.get_response(request)

    def check(self, request):
        meta = request.META
        limit = limit_for(request.path)
        raw_length = meta.get("CONTENT_LENGTH") or ""
        chunked = "chunked" in meta.get("HTTP_TRANSFER_ENCODING", "").lower()
        if chunked and not raw_length:
            return self._read_chunked(request, limit)
        if not raw_length:
            return None
        try:
            length = int(raw_length)
        except ValueError:
            length = -1
        if length < 0:
            return _refuse(request, 400, "Content-Length must be a whole number of bytes")
        if length > limit:
            return _refuse(request, 413, f"the request body is {length} bytes; the limit is {limit} bytes")
        return None

    def _read_chunked(self, request, limit: int):
        if not request.META.get("wsgi.input_terminated"):
            return _refuse(request, 411, "send the request body with a Content-Length header "
                                         "(a chunked body is not accepted by this server)")
        try:
            body = request.META["wsgi.input"].read(limit + 1)
        except _BROKEN_BODY as exc:
            detail = str(exc) or type(exc).__name__
            return _refuse(request, 400, f"the chunked request body is malformed or incomplete ({detail[:200]})")
        if len(body) > limit:
            return _refuse(request, 413, f"the request body is over the limit of {limit} bytes")
        # Django sized the request's stream from the missing Content-Length (empty); hand the
        # body on as if it had been sent with one, which is all a parser downstream looks at.
        request.META["CONTENT_LENGTH"] = str(len(body))
        request._stream = io.BytesIO(body)
        return None
