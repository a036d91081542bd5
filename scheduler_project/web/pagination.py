"""Keyset (cursor) pagination for lists that grow without bound (runs, audit entries).

Offset pagination and page counts cost a scan of every row before the page (`OFFSET n`) or of the
whole filtered set (`COUNT(*)`); on a runs table of hundreds of millions of rows both degrade with
depth. A keyset page is instead "the next `limit` rows after the last row the client saw", which
an index on the ordering columns answers by a range scan, the same cost on page 1 and page 10,000.

    PAGINATOR = Keyset("runs", ("-scheduled_time", "-id"))
    page = PAGINATOR.page(queryset, cursor=request.GET.get("cursor"), limit=request.GET.get("limit"))
    page.items, page.next  # next is an opaque cursor, or None on the last page

Rules for the ordering: every column is non-null, and the last one is unique (a primary key), so
that the position after a row is well defined even when earlier columns tie. Back up the ordering
with an index on (filter columns..., ordering columns...) in the same directions.

The cursor is opaque to clients but not secret: it only carries the last row's ordering values, and
the caller's queryset (already scoped to a tenant) decides what can be seen.
"""

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from uuid import UUID

from django.core.exceptions import ValidationError
from django.db import connection
from django.db.models import Q

from scheduler_project.foundation.errors import ValidationFailed

DEFAULT_LIMIT = 50
MAX_LIMIT = 200


@dataclass(frozen=True)
class Page:
    items: list
    next: str | None

    # The portal's templates read a page as rows with a next cursor.
    @property
    def rows(self) -> list:
        return self.items

    @property
    def has_next(self) -> bool:
        return self.next is not None

    @property
    def next_cursor(self) -> str:
        return self.next or ""

    def __iter__(self):
        return iter(self.items)

    def __len__(self):
        return len(self.items)


def _jsonable(value):
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    return value


class Keyset:
    def __init__(self, name: str, ordering: tuple[str, ...], *, default_limit: int = DEFAULT_LIMIT,
                 max_limit: int = MAX_LIMIT):
        if not ordering:
            raise ValueError("a keyset needs at least one ordering column")
        self.name = name  # a cursor made for one list is refused by another
        self.ordering = tuple(ordering)
        self.columns = [(o.lstrip("-"), o.startswith("-")) for o in ordering]
        self.default_limit = default_limit
        self.max_limit = max_limit

    def parse_limit(self, raw) -> int:
        if raw in (None, ""):
            return self.default_limit
        try:
            n = int(raw)
        except (TypeError, ValueError):
            raise ValidationFailed({"limit": ["must be a whole number"]})
        if not 1 <= n <= self.max_limit:
            raise ValidationFailed({"limit": [f"must be between 1 and {self.max_limit}"]})
        return n

    def encode(self, row) -> str:
        values = [_jsonable(getattr(row, name)) for name, _ in self.columns]
        raw = json.dumps({"k": self.name, "v": values}, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    def decode(self, cursor: str, model) -> list:
        bad = ValidationFailed({"cursor": ["not a cursor from this list; start again without 'cursor'"]})
        try:
            padded = cursor + "=" * (-len(cursor) % 4)
            data = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
        except (ValueError, binascii.Error, UnicodeError):
            raise bad
        if not isinstance(data, dict) or data.get("k") != self.name:
            raise bad
        raw_values = data.get("v")
        if not isinstance(raw_values, list) or len(raw_values) != len(self.columns):
            raise bad
        values = []
        for (name, _), raw in zip(self.columns, raw_values):
            if raw is None or isinstance(raw, (dict, list, bool)):
                raise bad
            field = model._meta.get_field(name)
            try:
                value = field.to_python(raw)
            except (ValidationError, TypeError, ValueError, OverflowError):
                raise bad
            if value is None or (isinstance(value, datetime) and value.tzinfo is None):
                raise bad
            if isinstance(value, datetime):
                # PostgreSQL refuses offsets past ±15:59 that Python accepts; UTC it always takes.
                try:
                    value = value.astimezone(timezone.utc)
                except OverflowError:
                    raise bad
            values.append(value)
        return values

    def after(self, values: list) -> Q:
        """Rows strictly after `values` in this ordering: the lexicographic comparison written out
        as (c1 < v1) OR (c1 = v1 AND c2 < v2) OR ... (for descending columns).

        The extra leading `c1 <= v1` says the same thing again, but as a plain range on the first
        column, which the planner can use as the start of an index range scan; the OR alone would
        leave it a filter."""
        cond = Q()
        for i, (name, desc) in enumerate(self.columns):
            step = Q(**{f"{name}__{'lt' if desc else 'gt'}": values[i]})
            for j in range(i):
                step &= Q(**{self.columns[j][0]: values[j]})
            cond |= step
        first, desc = self.columns[0]
        return Q(**{f"{first}__{'lte' if desc else 'gte'}": values[0]}) & cond

    def page(self, queryset, *, cursor: str | None = None, limit=None) -> Page:
        """One page of `queryset` (already filtered and scoped) in this keyset's ordering. Reads
        limit + 1 rows to learn whether another page exists; never counts."""
        n = self.parse_limit(limit)
        qs = queryset.order_by(*self.ordering)
        if cursor:
            qs = qs.filter(self.after(self.decode(cursor, queryset.model)))
        rows = list(qs[: n + 1])
        more = len(rows) > n
        rows = rows[:n]
        return Page(items=rows, next=self.encode(rows[-1]) if more else None)

    def merged_page(self, querysets: list, *, cursor: str | None = None, limit=None, load=None) -> Page:
        """One page over the union of `querysets` (disjoint parts of one list, e.g. one per tenant),
        each served by its own index range: each part's next `limit + 1` keys are read, merged
        here, and only the winners are loaded (`load(pks) -> {pk: row}`, default in_bulk).

        Where the database allows a sliced query inside a compound statement (PostgreSQL), the
        parts are read in one UNION ALL statement; elsewhere (SQLite refuses LIMIT in a compound's
        parts) one query each."""
        n = self.parse_limit(limit)
        if not querysets:
            return Page(items=[], next=None)
        directions = {desc for _, desc in self.columns}
        if len(directions) != 1:
            raise ValueError("a merged page needs every ordering column in the same direction")
        model = querysets[0].model
        values = self.decode(cursor, model) if cursor else None
        names = [name for name, _ in self.columns]
        parts = []
        for qs in querysets:
            qs = qs.order_by(*self.ordering)
            if values is not None:
                qs = qs.filter(self.after(values))
            parts.append(qs.values_list(*names)[: n + 1])
        if len(parts) > 1 and connection.features.supports_slicing_ordering_in_compound:
            keys = list(parts[0].union(*parts[1:], all=True))
        else:
            keys = [k for part in parts for k in part]
        keys = sorted(keys, reverse=directions == {True})[: n + 1]
        pks = [k[-1] for k in keys]
        rows_by_pk = load(pks) if load else model.objects.in_bulk(pks)
        rows = [rows_by_pk[pk] for pk in pks if pk in rows_by_pk]
        more = len(rows) > n
        rows = rows[:n]
        return Page(items=rows, next=self.encode(rows[-1]) if more else None)

    def page_from_params(self, queryset, params) -> Page:
        """`?cursor=` and `?limit=` from a request's query parameters."""
        return self.page(queryset, cursor=params.get("cursor") or None, limit=params.get("limit"))


# The lists of the API and the portal, each backed by an index on (its filter column, then these
# columns in these directions).
# run_tenant_time_idx / run_schedule_time_idx: (tenant | schedule, -scheduled_time, -id).
RUN_PAGES = Keyset("runs", ("-scheduled_time", "-id"))
# schedule_list_idx / schedule_tenant_list_idx / schedule_owner_list_idx: (all | tenant | owner, -created_at, -id).
SCHEDULE_PAGES = Keyset("schedules", ("-created_at", "-id"))
KEY_PAGES = Keyset("keys", ("-created_at", "-id"))
# audit_tenant_at_idx: (tenant, -at).
AUDIT_PAGES = Keyset("audit", ("-at", "-id"))
# incident_tenant_opened_idx / incident_owner_opened_idx / incident_schedule_opened_idx.
INCIDENT_PAGES = Keyset("incidents", ("-opened_at", "-id"))
