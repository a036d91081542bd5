"""What history is kept and when the next removal is due, where operators and tenant users look:
the dashboard (every tenant's policy for operators, their own for tenant users), a tenant's page,
and /metrics. The section costs the same whatever the number of tenants with their own policy."""

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from prometheus_client.parser import text_string_to_metric_families

from runs import retention
from schedules.services import SYSTEM
from schedules.tenants import create_tenant
from tests.conftest import ON_SQLITE


def section(html: str) -> str:
    start = html.index('<section id="retention"')
    return html[start:html.index("</section>", start)]


def test_the_operator_dashboard_says_what_is_kept_and_when_it_goes(operator, tenant, other_tenant, settings):
    settings.SCHEDULER_RETENTION_DAYS = 10
    retention.set_policy(tenant, finished_days=3, dead_days=None, by=SYSTEM)
    part = section(operator.get(reverse("runs-dashboard")).content.decode())
    assert "History kept" in part
    assert "10 days after their scheduled time" in part
    assert "30 days after they went dead" in part
    assert "never removed" in part
    assert "acme (own policy)" in part and "finished 3 d · dead 30 d" in part
    assert "globex" not in part  # it keeps the defaults, which the rows above already say
    if ON_SQLITE:
        assert "in small batches" in part
    else:
        assert "Next removal" in part and "Partitions made up to" in part and "On disk" in part


def test_a_tenant_user_sees_their_tenants_policy_and_not_another_tenants(acme, tenant, other_tenant):
    retention.set_policy(other_tenant, finished_days=2, dead_days=5, by=SYSTEM)
    part = section(acme.get(reverse("runs-dashboard")).content.decode())
    assert "acme" in part and "the defaults above" in part
    assert "globex" not in part and "finished 2 d" not in part
    # The deployment's storage is the operators' business.
    assert "On disk" not in part and "Partitions made up to" not in part


def test_the_tenant_page_shows_its_own_policy(acme, tenant):
    retention.set_policy(tenant, finished_days=7, dead_days=60, by=SYSTEM)
    html = acme.get(reverse("schedules-tenant-detail", args=[tenant.id])).content.decode()
    part = section(html)
    assert "acme (own policy)" in part and "finished 7 d · dead 60 d" in part
    assert "On disk" not in part


def test_an_operator_sees_the_storage_on_a_tenant_page(operator, tenant):
    part = section(operator.get(reverse("schedules-tenant-detail", args=[tenant.id])).content.decode())
    assert "History kept" in part
    if not ON_SQLITE:
        assert "On disk" in part


def test_the_dashboard_section_costs_the_same_with_more_policies(operator, tenant, target):
    retention.set_policy(tenant, finished_days=3, dead_days=None, by=SYSTEM)
    operator.get(reverse("runs-dashboard"))  # warm per-process caches

    def queries():
        with CaptureQueriesContext(connection) as ctx:
            assert operator.get(reverse("runs-dashboard")).status_code == 200
        return len(ctx.captured_queries)

    one = queries()
    for i in range(8):
        t = create_tenant(f"t{i}", allow_targets=[target.url + "/"])
        retention.set_policy(t, finished_days=i + 1, dead_days=None, by=SYSTEM)
    html = operator.get(reverse("runs-dashboard")).content.decode()
    assert "t7 (own policy)" in html
    assert queries() == one


def test_metrics_say_what_is_kept_and_when_the_next_removal_is_due(client, tenant, settings):
    settings.SCHEDULER_RETENTION_DAYS = 9
    retention.set_policy(tenant, finished_days=1, dead_days=None, by=SYSTEM)
    r = client.get("/metrics")
    assert r.status_code == 200
    got = {s.name + str(sorted(s.labels.items())): s.value
           for fam in text_string_to_metric_families(r.content.decode()) for s in fam.samples}
    assert got["scheduler_retention_days[('class', 'finished')]"] == 9
    assert got["scheduler_retention_days[('class', 'dead')]"] == 30
    assert got["scheduler_retention_overrides[]"] == 1
    assert got["scheduler_history_last_removal_age_seconds[]"] == -1  # nothing removed yet
    if not ON_SQLITE:
        # The oldest partition goes one retention period after its end: days ahead, not overdue.
        assert 0 < got["scheduler_history_next_removal_seconds[]"] <= 10 * 86400
        assert got["scheduler_history_partitions_ahead_seconds[]"] > 3600
        assert got["scheduler_history_unpartitioned_rows[('table', 'runs_run')]"] == 0
