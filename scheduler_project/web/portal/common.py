"""Helpers every portal view shares: keyset pages, fragments, calling a service safely."""

from datetime import datetime, timezone

from django.contrib import messages
from django.shortcuts import render

from scheduler_project.errors import ServiceError, ValidationFailed
from scheduler_project.web.pagination import Keyset, Page
from scheduler_project.web.params import parse_uuid  # noqa: F401  (the portal's views import it from here)

PAGE_SIZE = 50


def parse_when(raw: str | None):
    """A datetime-local form value (or ISO text) read as UTC; None when empty or unreadable."""
    if not raw:
        return None
    try:
        dt = datetime.fromisoformat(raw.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt


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


def call_service(request, fn, *args, success: str | None = None, **kwargs):
    """Run one service call; a ServiceError becomes a message the operator can act on, never a
    500. Returns (ok, result)."""
    try:
        result = fn(*args, **kwargs)
    except ServiceError as e:
        messages.error(request, e.message)
        return False, None
    if success:
        messages.success(request, success.format(result=result))
    return True, result
