"""Helpers every portal view shares: keyset pages, fragments, calling a service safely.

They live in `schedules` (the lowest app) so `runs` views can use them without `schedules`
reaching up into `runs`."""

from datetime import datetime, timezone
from uuid import UUID

from django.contrib import messages
from django.db.models import Q
from django.shortcuts import render

from scheduler_project.errors import ServiceError

PAGE_SIZE = 50
CURSOR_SEP = "~"


def parse_uuid(raw):
    try:
        return UUID(str(raw)) if raw else None
    except ValueError:
        return None


def parse_when(raw: str | None):
    """A datetime-local form value (or ISO text) read as UTC; None when empty or unreadable."""
    if not raw:
        return None
    try:
        dt = datetime.fromisoformat(raw.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt


def encode_cursor(when, pk) -> str:
    return f"{when.isoformat()}{CURSOR_SEP}{pk}"


def decode_cursor(raw: str | None, pk_type=UUID):
    if not raw or CURSOR_SEP not in raw:
        return None
    # A hand-pasted cursor may have had its "+00:00" decoded to a space.
    when, pk = raw.replace(" ", "+").rsplit(CURSOR_SEP, 1)
    try:
        return datetime.fromisoformat(when), pk_type(pk)
    except ValueError:
        return None


def after_cursor(qs, field: str, cursor):
    """Rows strictly after the cursor in (-field, -id) order: the keyset condition that lets the
    (…, field, id) index start where the last page ended, with no OFFSET and no COUNT(*)."""
    if not cursor:
        return qs
    when, pk = cursor
    return qs.filter(Q(**{f"{field}__lt": when}) | Q(**{field: when, "id__lt": pk}))


class Page:
    def __init__(self, rows, has_next: bool, field: str):
        self.rows = rows
        self.has_next = has_next
        self.next_cursor = encode_cursor(getattr(rows[-1], field), rows[-1].id) if has_next and rows else ""

    def __iter__(self):
        return iter(self.rows)

    def __len__(self):
        return len(self.rows)


def keyset_page(qs, field: str, raw_cursor: str | None, *, size: int | None = None, pk_type=UUID) -> Page:
    size = size or PAGE_SIZE
    rows = list(after_cursor(qs, field, decode_cursor(raw_cursor, pk_type)).order_by(f"-{field}", "-id")[: size + 1])
    return Page(rows[:size], len(rows) > size, field)


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
