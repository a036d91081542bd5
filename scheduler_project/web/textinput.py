"""Text that browsers send to the portal, the admin and the login pages: no NUL, no huge values.

PostgreSQL refuses NUL (U+0000) in text, so a filter such as `/schedules/?q=%00` or a key label
with one used to end in a 500 wherever the value reached a query; and SQLite refuses a LIKE
pattern over 50,000 bytes, so a huge `?q=` did the same on the embedded database. No page has a
use for either, so every query-string and form value (names too) is checked once, here, before
any view runs, and a request carrying one is answered 400 with a message saying what to change.
The longest value a form takes is a 2,000-character URL, except a schedule's payload and headers
(JSON and header lines as the schedule form shows them), which may be as long as the payload
limit allows, pretty-printed. The API checks its own input and answers in JSON
(scheduler_project.web.api).
"""

from django.conf import settings
from django.http import HttpResponseBadRequest

MAX_VALUE_LENGTH = 4000
# Form fields (POST) that carry a schedule's payload or headers: their own, longer limit.
LONG_FIELDS = ("payload", "target_headers")
NUL_MESSAGE = ("A field of this request contains a NUL character (\\x00, %00), which cannot be stored or "
               "searched for. Remove it and try again.")
LONG_MESSAGE = f"A field of this request is longer than {MAX_VALUE_LENGTH} characters. Shorten it and try again."


def long_value_limit() -> int:
    """The most characters of a payload or headers field: the payload limit, pretty-printed."""
    return 2 * settings.SCHEDULER_MAX_PAYLOAD_BYTES + 4096


def problem(data, long_fields=()) -> str | None:
    for key, values in data.lists():
        limit = long_value_limit() if key in long_fields else MAX_VALUE_LENGTH
        for text in (key, *values):
            if "\x00" in text:
                return NUL_MESSAGE
            if len(text) > limit:
                return LONG_MESSAGE if limit == MAX_VALUE_LENGTH else (
                    f"The {key.replace('_', ' ')} field is longer than {limit} characters. Shorten it and try again.")
    return None


class RefuseBadTextMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_view(self, request, view, args, kwargs):
        # After the CSRF check (listed after its middleware), so a forged POST is still a 403.
        if request.path.startswith("/api/"):
            return None
        message = problem(request.GET) or (problem(request.POST, LONG_FIELDS) if request.method == "POST" else None)
        if message:
            return HttpResponseBadRequest(message, content_type="text/plain; charset=utf-8")
        return None
