"""/metrics: Prometheus text computed from the database, so every web process agrees."""

from datetime import timedelta

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dispatch.activity import ActivityAggregator
from dispatch.activity import drain as count_activity
from dispatch.loops import drain, scan_step
from dispatch.worker import Worker
from runs.models import Attempt
from scheduler_project.foundation.dbclock import db_now
from tests.helpers import make_due, make_schedule

pytestmark = pytest.mark.django_db(transaction=True)


def scrape(client):
    r = client.get("/metrics")
    assert r.status_code == 200
    return {s.name + str(sorted(s.labels.items())): s.value
            for fam in text_string_to_metric_families(r.content.decode()) for s in fam.samples}


def test_metrics_report_what_the_loops_did(client, tenant, target):
    # A webhook, so the run events wait for a relay (a tenant without one has them written
    # published).
    type(tenant).objects.filter(id=tenant.id).update(notification_url=target.url + "/events")
    for i in range(3):
        # A long backoff, so the one worker pass cannot retry a failed run (full jitter may be ~0).
        make_due(make_schedule(tenant, f"{target.url}/m{i}", backoff_base_seconds=600, backoff_max_seconds=600))
    drain(scan_step)
    before = scrape(client)
    assert before["scheduler_runs[('state', 'ready')]"] == 3
    assert before["scheduler_tenant_backlog[('tenant', 'acme')]"] == 3
    target.status = 500
    import asyncio

    w = Worker("w-metrics", poll_seconds=0)
    asyncio.run(w.run(once=True))
    w2 = Worker("w-metrics", poll_seconds=0)  # save counters as the running worker does every few seconds
    w2.stats, w2.batch_buckets = w.stats, w.batch_buckets
    w2._save_stats()
    after = scrape(client)
    assert after["scheduler_runs[('state', 'ready')]"] == 3  # failed once, waiting to retry
    assert after["scheduler_claimed_runs_total[]"] == 3
    assert after["scheduler_claims_total[]"] >= 1
    assert after["scheduler_claim_batch_size_bucket[('le', '10')]"] == 1  # one claim of three runs
    assert after["scheduler_claim_batch_size_bucket[('le', '1')]"] == 0
    assert "scheduler_start_lag_seconds_bucket[('le', '+Inf')]" in after
    assert after["scheduler_start_lag_seconds_bucket[('le', '+Inf')]"] == 3  # three first attempts started
    # No relay ran: the run events wait unpublished for the webhook, and the lag says how long.
    assert after["scheduler_outbox_lag_seconds[]"] > 0
    assert after["scheduler_unknown_attempt_oldest_age_seconds[]"] == 0
    Attempt.objects.filter(id=Attempt.objects.order_by("id").values("id")[:1]).update(
        outcome="unknown", finished_at=db_now() - timedelta(minutes=10))
    count_activity(ActivityAggregator(settle=timedelta(0)))  # unknown outcomes come from its rows
    # Counted by the minute it ended in: 10 to 11 minutes ago.
    assert 590 < scrape(client)["scheduler_unknown_attempt_oldest_age_seconds[]"] < 700


def test_metrics_can_be_restricted_by_network(client, settings):
    settings.SCHEDULER_METRICS_ALLOWED_NETWORKS = ["10.0.0.0/8"]
    assert client.get("/metrics").status_code == 403
    settings.SCHEDULER_METRICS_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 200


def test_metrics_are_not_open_by_default(client, settings, tenant):
    """Issue 26, finding 12: /metrics (tenant names, backlogs) was open to every address by
    default. Now: loopback, a bearer token, or a signed-in operator."""
    from django.contrib.auth.models import User

    from scheduler_project import settings as project_settings
    from scheduler_project.web.access import ROLE_READ_ONLY, role

    assert project_settings.SCHEDULER_METRICS_ALLOWED_NETWORKS == ["127.0.0.0/8", "::1/128"]
    settings.SCHEDULER_METRICS_ALLOWED_NETWORKS = project_settings.SCHEDULER_METRICS_ALLOWED_NETWORKS
    settings.SCHEDULER_METRICS_TOKEN = "metrics-token-123"
    outside = {"REMOTE_ADDR": "203.0.113.50"}
    refused = client.get("/metrics", **outside)
    assert refused.status_code == 403 and b"SCHEDULER_METRICS_TOKEN" in refused.content
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong", **outside).status_code == 403
    ok = client.get("/metrics", HTTP_AUTHORIZATION="Bearer metrics-token-123", **outside)
    assert ok.status_code == 200 and b"scheduler_" in ok.content
    for local in ("127.0.0.1", "::1", "::ffff:127.0.0.1"):
        assert client.get("/metrics", REMOTE_ADDR=local).status_code == 200, local
    settings.SCHEDULER_METRICS_TOKEN = ""
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer ", **outside).status_code == 403
    # A signed-in operator reads it from anywhere (in a browser); a plain account does not.
    plain = User.objects.create_user("plain", password="pw-plain-123")
    client.force_login(plain)
    assert client.get("/metrics", **outside).status_code == 403
    op = User.objects.create_user("rita", password="pw-rita-123", is_staff=True)
    op.groups.add(role(ROLE_READ_ONLY))
    client.force_login(op)
    assert client.get("/metrics", **outside).status_code == 200
