"""The keyset paginator on its own: exact order across ties, opaque cursors checked, no COUNT, and
pages answered by an index range scan however deep."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs.models import Run
from scheduler_project.foundation.errors import ValidationFailed
from scheduler_project.web.pagination import Keyset
from schedules.models import AuditEntry
from schedules.services import Actor, audit
from tests.api.conftest import hourly_runs

pytestmark = pytest.mark.django_db

RUNS = Keyset("runs", ("-scheduled_time", "-id"))


def walk(keyset, qs, limit):
    out, cursor = [], None
    while True:
        page = keyset.page(qs, cursor=cursor, limit=limit)
        out += page.items
        if page.next is None:
            return out
        cursor = page.next


def test_ties_on_the_first_column_are_ordered_by_the_second_without_gaps_or_repeats(tenant):
    for i in range(7):
        audit("test.tie", by=Actor("user:t"), obj_type="x", obj_id=i, tenant=tenant)
    AuditEntry.objects.filter(action="test.tie").update(at=AuditEntry.objects.filter(action="test.tie").first().at)
    qs = AuditEntry.objects.filter(action="test.tie")
    for limit in (1, 2, 3, 7, 8):
        got = walk(Keyset("audit", ("-at", "-id")), qs, limit)
        assert [e.id for e in got] == sorted((e.id for e in qs), reverse=True), limit


def test_ascending_and_mixed_directions_work_too(tenant):
    for i in range(5):
        audit("test.asc", by=Actor("user:t"), obj_type="x", obj_id=i % 2, tenant=tenant)
    qs = AuditEntry.objects.filter(action="test.asc")
    asc = walk(Keyset("a", ("object_id", "id")), qs, 2)
    assert [(e.object_id, e.id) for e in asc] == sorted((e.object_id, e.id) for e in qs)
    mixed = walk(Keyset("m", ("object_id", "-id")), qs, 2)
    assert [(e.object_id, e.id) for e in mixed] == sorted(((e.object_id, e.id) for e in qs),
                                                          key=lambda t: (t[0], -t[1]))


def test_a_page_reads_limit_plus_one_rows_and_never_counts(schedule):
    hourly_runs(schedule, 5)
    qs = Run.objects.filter(tenant=schedule.tenant)
    with CaptureQueriesContext(connection) as ctx:
        page = RUNS.page(qs, limit=2)
        RUNS.page(qs, cursor=page.next, limit=2)
    assert len(ctx.captured_queries) == 2
    assert all("LIMIT 3" in q["sql"] and "COUNT(" not in q["sql"].upper() for q in ctx.captured_queries)


@pytest.mark.parametrize("cursor", ["", "!!!", "e30", "eyJrIjoicnVucyIsInYiOltdfQ",
                                    "eyJrIjoicnVucyIsInYiOlsieCIsInkiXX0", "eyJrIjoicnVucyIsInYiOlsxLDJdfQ"])
def test_a_forged_or_foreign_cursor_is_a_field_error(schedule, cursor):
    qs = Run.objects.filter(tenant=schedule.tenant)
    if cursor == "":
        assert RUNS.page(qs, cursor=cursor).next is None
        return
    with pytest.raises(ValidationFailed) as e:
        RUNS.page(qs, cursor=cursor)
    assert "cursor" in e.value.errors


@pytest.mark.parametrize("limit", [0, -1, 201, "x", "1.5"])
def test_the_limit_is_bounded(schedule, limit):
    with pytest.raises(ValidationFailed) as e:
        RUNS.page(Run.objects.all(), limit=limit)
    assert "limit" in e.value.errors


@pytest.mark.postgresql_only("reads a PostgreSQL query plan")
def test_a_deep_page_is_an_index_range_scan(schedule):
    """On a big table the planner must start at the cursor in run_tenant_time_idx rather than
    sort or filter everything. Sequential scans are disabled so the plan shows what the index
    supports, independent of this test table's tiny size."""
    hourly_runs(schedule, 24)
    qs = Run.objects.filter(tenant=schedule.tenant)
    last = Run.objects.filter(tenant=schedule.tenant).order_by("-scheduled_time", "-id")[10]
    cursor = RUNS.encode(last)
    page_qs = qs.order_by(*RUNS.ordering).filter(RUNS.after(RUNS.decode(cursor, Run)))[:51]
    with connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off")
        cur.execute("SET LOCAL enable_sort = off")
        sql, params = page_qs.query.sql_with_params()
        cur.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cur.fetchall())
    assert "run_tenant_time_idx" in plan and "Sort" not in plan, plan
    assert [r.id for r in page_qs][0] == Run.objects.filter(tenant=schedule.tenant).order_by(
        "-scheduled_time", "-id")[11].id
    assert last.scheduled_time - page_qs[0].scheduled_time == timedelta(hours=1)
