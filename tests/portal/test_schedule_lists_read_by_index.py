"""Every schedule list reads its page as an index range in the list's order (-created_at, -id), never
by sorting: the operator's list across tenants, one tenant's (portal and API), a tenant user's, and
the page after a cursor. Found by bench/soak.py at ten million schedules: the operator's
/schedules/ had no index in that order, so each page sorted every schedule (30-40 s a read, a
gunicorn worker and a core taken meanwhile). The plans are read with sequential scans and sorts
disabled, so they show what the indexes support whatever this test table's size."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from tests.helpers import ACTOR

pytestmark = pytest.mark.postgresql_only("reads PostgreSQL query plans")

ORDER = 'ORDER BY "schedules_schedule"."created_at" DESC, "schedules_schedule"."id" DESC'


def list_queries(client, url) -> list[str]:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url)
    assert response.status_code == 200, response.content[:500]
    return [q["sql"] for q in ctx.captured_queries if 'FROM "schedules_schedule"' in q["sql"] and ORDER in q["sql"]]


def plan_of(sql: str) -> str:
    with connection.cursor() as cur:
        cur.execute("SET enable_seqscan = off")
        cur.execute("SET enable_sort = off")
        try:
            cur.execute("EXPLAIN " + sql)
            return "\n".join(row[0] for row in cur.fetchall())
        finally:
            cur.execute("RESET enable_seqscan")
            cur.execute("RESET enable_sort")


def assert_read_by(queries: list[str], index: str) -> None:
    assert queries, "the page made no list query in the list's order"
    for sql in queries:
        plan = plan_of(sql)
        assert index in plan and "Sort" not in plan, plan


@pytest.fixture
def schedules(tenant, other_tenant, target):
    from runs import actions
    from scheduler_project.foundation.dbclock import db_now

    items = [{"expression": "rate(1 hour)", "time_zone": "UTC", "target_url": target.url + f"/{i}"} for i in range(60)]
    for t in (tenant, other_tenant):
        actions.create_schedules(t, items, by=ACTOR, now=db_now())


def test_the_operators_list_across_tenants_and_its_next_page(operator, schedules):
    first = operator.get(reverse("schedules-list"))
    assert first.status_code == 200
    assert_read_by(list_queries(operator, reverse("schedules-list")), "schedule_list_idx")
    cursor = first.context["page"].next_cursor
    assert cursor
    assert_read_by(list_queries(operator, reverse("schedules-list") + f"?after={cursor}"), "schedule_list_idx")


def test_the_operators_list_of_one_tenant(operator, schedules, tenant):
    assert_read_by(list_queries(operator, reverse("schedules-list") + f"?tenant={tenant.id}"),
                   "schedule_tenant_list_idx")


def test_a_tenant_users_list(acme, schedules):
    assert_read_by(list_queries(acme, reverse("schedules-list")), "schedule_tenant_list_idx")


def test_an_owners_page(operator, schedules, tenant):
    from schedules.models import Schedule
    from schedules.owners import create_owner

    owner = create_owner(tenant, {"slug": "billing", "name": "Billing team"}, by=ACTOR)
    Schedule.objects.filter(tenant=tenant).update(owner=owner)  # fixture set-up, not the feature
    assert_read_by(list_queries(operator, reverse("incidents-owner", args=[owner.id])), "schedule_owner_list_idx")


def test_the_api_list_and_its_next_page(api, schedules):
    first = api.get("/api/v1/schedules?limit=20")
    assert first.status_code == 200
    assert_read_by(list_queries(api, "/api/v1/schedules?limit=20"), "schedule_tenant_list_idx")
    nxt = first.json()["next"]
    assert nxt
    assert_read_by(list_queries(api, f"/api/v1/schedules?limit=20&cursor={nxt}"), "schedule_tenant_list_idx")
