"""Helpers every portal view shares: keyset pages, fragments, calling a service safely."""

from dataclasses import dataclass, field
from datetime import datetime, timezone

from django.contrib import messages
from django.shortcuts import render

from scheduler_project.foundation.errors import ServiceError, ValidationFailed
from scheduler_project.web.api.schedule_serializers import EARLIEST, LATEST
from scheduler_project.web.pagination import Keyset, Page
from scheduler_project.web.params import parse_uuid  # noqa: F401  (the portal's views import it from here)
from schedules import timeexpr

PAGE_SIZE = 50


WHEN_RANGE_TEXT = "between 1970-01-01 and 2999-12-31"


def parse_when(raw: str | None):
    """A datetime-local form value (or ISO text) read as UTC; None when empty, unreadable, or
    outside the range the API accepts too (1970-2999): year 1 or 9999 with an offset is not even
    a date Python can hold in UTC, and no run is ever there."""
    if not raw or len(raw) > 64:
        return None
    try:
        dt = datetime.fromisoformat(raw.strip().replace("Z", "+00:00"))
        dt = dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)
    except (ValueError, OverflowError):
        return None
    return dt if EARLIEST <= dt < LATEST else None


class FilterProblems(dict):
    """{query parameter: message} for filter values a list cannot apply. A list view that has any
    answers 400 with the messages and no rows: the API refuses the same values, and showing the
    unfiltered list instead would look like the filter's result."""

    def choice(self, params, name: str, label: str, choices) -> str:
        raw = str(params.get(name, "") or "").strip()
        if raw and raw not in choices:
            self[name] = f"{label} {raw[:40]!r} is not one of {', '.join(choices)}"
            return ""
        return raw

    def uuid(self, params, name: str, label: str):
        raw = str(params.get(name, "") or "").strip()
        value = parse_uuid(raw)
        if raw and value is None:
            self[name] = f"{label} {raw[:40]!r} is not an id"
        return value

    def when(self, params, name: str, label: str):
        raw = str(params.get(name, "") or "").strip()
        value = parse_when(raw)
        if raw and value is None:
            self[name] = f"{label} {raw[:40]!r} is not a date and time {WHEN_RANGE_TEXT}"
        return value


def keyset_page(keyset: Keyset, qs, cursor: str | None, *, size: int | None = None) -> Page:
    """One page of a portal list (`?after=` carries the cursor). A cursor that does not belong
    to this list (edited, or pasted from another) shows the first page instead of an error."""
    try:
        return keyset.page(qs, cursor=cursor or None, limit=size or PAGE_SIZE)
    except ValidationFailed:
        return keyset.page(qs, limit=size or PAGE_SIZE)


def template_for(request, template: str, partial: str | None) -> str:
    """One view serves the page and its fragment: htmx requests get only the named partial."""
    if partial and request.htmx and not request.htmx.boosted:
        return f"{template}#{partial}"
    return template


def render_view(request, template: str, context: dict, *, partial: str | None = None, status: int = 200):
    return render(request, template_for(request, template, partial), context, status=status)


def service_message(e: ServiceError) -> str:
    """What a person is told: field errors as "Field: message" each (the service names fields as
    people read them), a body-level one as the message alone."""
    if isinstance(e, ValidationFailed):
        parts = []
        for field, errors in e.errors.items():
            for error in errors:
                parts.append(error if field in ("body", "__all__") else f"{field[:1].upper()}{field[1:]}: {error}")
        # Several messages at once (a form is told all its problems): each ends as a sentence.
        return " ".join(p if p.endswith((".", "!", "?")) else f"{p}." for p in parts)
    return e.message


def call_service(request, fn, *args, success: str | None = None, **kwargs):
    """Run one service call; a ServiceError becomes a message the operator can act on, never a
    500. Returns (ok, result)."""
    try:
        result = fn(*args, **kwargs)
    except ServiceError as e:
        messages.error(request, service_message(e))
        return False, None
    except timeexpr.ExpressionError as e:
        # A stored rule the time engine now refuses (e.g. past its work budget for this range).
        messages.error(request, str(e))
        return False, None
    if success:
        messages.success(request, success.format(result=result))
    return True, result


@dataclass
class Confirm:
    """A change that asks first. Without JavaScript the confirmation is a page of its own; with
    htmx the same box is drawn inside the panel the button belongs to (`target`), so nothing
    depends on a browser dialog."""

    title: str
    text: str
    action: str  # where "yes" posts
    yes: str
    back: str  # where "no" goes
    danger: bool = False
    target: str = ""  # the panel's element id, for htmx; "" for a plain post
    fields: dict = field(default_factory=dict)  # more hidden fields to post again


def confirmed(request) -> bool:
    return request.POST.get("confirm") == "yes"


def confirm_response(request, confirm: Confirm, *, template: str | None = None, partial: str | None = None,
                     context: dict | None = None):
    """The confirmation step: the panel with its box for htmx, else a page."""
    if request.htmx and template and partial:
        return render(request, f"{template}#{partial}", {**(context or {}), "confirm": confirm})
    return render(request, "portal/confirm.html", {"confirm": confirm})
