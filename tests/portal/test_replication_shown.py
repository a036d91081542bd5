"""Whether the database's commits wait for a standby (the failover promise's precondition) is
shown where an operator looks: /metrics and the dashboard. A formation that really loses and
regains its synchronous standby is in the failover suite (tests/faults/failover.py)."""

import pytest
from django.db import connection
from django.urls import reverse
from prometheus_client.parser import text_string_to_metric_families

from scheduler_project.foundation.dbreplication import ReplicationStatus, replication_status

pytestmark = pytest.mark.django_db


def metric(client, name):
    text = client.get("/metrics").content.decode()
    values = [s.value for fam in text_string_to_metric_families(text) for s in fam.samples if s.name == name]
    return values[0] if values else None


def test_degraded_means_commits_are_acknowledged_without_the_standby_that_is_expected():
    def st(standbys, synchronous, visible=True, expected=False):
        return ReplicationStatus(standbys=standbys, synchronous=synchronous, synchronous_names="",
                                 visible=visible, expected=expected)

    assert not st(0, 0).degraded  # a single server, as deployed
    assert st(0, 0, expected=True).degraded  # the standby is gone (pg_auto_failover's wait_primary)
    assert st(1, 0).degraded  # connected, but commits no longer wait for it
    assert not st(1, 1, expected=True).degraded
    assert not st(2, 1, expected=True).degraded
    assert st(1, 0, visible=False, expected=True).degraded  # cannot tell, and one is promised
    assert not st(0, 0, visible=False).degraded


@pytest.mark.postgresql_only("replication exists only on PostgreSQL")
def test_metrics_and_dashboard_say_when_no_synchronous_standby_acknowledges_commits(client, operator, settings):
    # The suite's server has no standby.
    rep = replication_status()
    assert (rep.standbys, rep.synchronous) == (0, 0)
    settings.SCHEDULER_EXPECT_SYNCHRONOUS_STANDBY = False
    assert metric(client, "scheduler_database_synchronous_standbys") == 0
    assert metric(client, "scheduler_database_replication_degraded") == 0
    assert 'data-testid="replication-degraded"' not in operator.get(reverse("runs-dashboard")).content.decode()
    settings.SCHEDULER_EXPECT_SYNCHRONOUS_STANDBY = True
    assert metric(client, "scheduler_database_replication_degraded") == 1
    html = operator.get(reverse("runs-dashboard")).content.decode()
    assert 'data-testid="replication-degraded"' in html
    assert "no standby is connected" in html


def test_the_embedded_database_has_no_replication_figures(client):
    if connection.vendor == "postgresql":
        assert replication_status() is not None
        return
    assert replication_status() is None
    assert metric(client, "scheduler_database_synchronous_standbys") is None


def test_a_tenant_user_is_not_shown_the_databases_replication(acme, settings):
    settings.SCHEDULER_EXPECT_SYNCHRONOUS_STANDBY = True
    html = acme.get(reverse("runs-dashboard")).content.decode()
    assert 'data-testid="replication-degraded"' not in html
