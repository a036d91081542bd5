"""With one tenant in view, the runs list and the dead-letter queue read that tenant's range of
run_tenant_time_idx: without the tenant in the WHERE, ordering every run by time sorts every
partition's runs (bench/history.py: 45 ms on an empty history, 2.4 s over 700,000 runs)."""

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from runs.models import RunState

from .conftest import make_run


def runs_queries(client, url):
    with CaptureQueriesContext(connection) as ctx:
        html = client.get(url).content.decode()
    return html, [q["sql"] for q in ctx.captured_queries
                  if 'FROM "runs_run"' in q["sql"] and 'ORDER BY "runs_run"."scheduled_time" DESC' in q["sql"]]


@pytest.mark.parametrize("page", ["runs-list", "runs-dlq"])
def test_an_operator_with_one_tenant_reads_that_tenants_range(operator, schedule, tenant, page):
    make_run(schedule, RunState.DEAD, error="the only tenant's failure")
    html, queries = runs_queries(operator, reverse(page))
    assert "the only tenant's failure" in html or "acme" in html
    assert queries
    tenant_hex = str(tenant.id).replace("-", "")
    for sql in queries:
        assert re.search(r'"runs_run"\."tenant_id" = \'?' + f"({tenant.id}|{tenant_hex})", sql), sql


def test_a_tenant_user_reads_their_tenants_range(acme, schedule, other_schedule, tenant):
    make_run(schedule, RunState.DEAD, error="acme failure")
    make_run(other_schedule, RunState.DEAD, error="globex failure")
    html, queries = runs_queries(acme, reverse("runs-list"))
    assert "acme failure" in html and "globex failure" not in html
    assert queries and all('"runs_run"."tenant_id" = ' in sql for sql in queries)
