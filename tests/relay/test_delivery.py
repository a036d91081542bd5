"""Events reach the tenant's webhook once each, signed, with their id as the idempotency key."""

import json

import pytest

from dispatch import signing
from dispatch.relay import Relay
from runs import queue
from runs.models import OutboxEvent
from tests.relay.helpers import events_for, webhook_deliveries, with_webhook

pytestmark = pytest.mark.django_db


@pytest.fixture
def relay():
    r = Relay()
    yield r
    r.close()


def test_each_event_is_delivered_once_signed_and_marked_published(tenant, target, relay):
    with_webhook(tenant, target.url + "/events")
    events_for(tenant, target, 3)
    claims = queue.claim("w-test", 10)
    queue.complete([queue.Result(claimed=c, outcome="succeeded", http_status=200) for c in claims])
    events = list(OutboxEvent.objects.order_by("id"))
    assert len(events) == 9  # created, leased, succeeded for each run

    assert relay.step() is False
    relay.step()  # nothing left: no second delivery

    got = webhook_deliveries(target)
    assert len(got) == 9
    for ev, d in zip(events, got):  # one tenant: in id order
        body = json.loads(d["body"])
        assert body["eventId"] == str(ev.event_id) and body["kind"] == ev.kind
        assert body["runId"] == str(ev.run_id) and body["createdAt"].endswith("Z")
        assert body["state"] == ev.payload["state"]
        assert d["headers"]["Idempotency-Key"] == d["headers"]["X-Scheduler-Event-Id"] == str(ev.event_id)
        assert d["headers"]["X-Scheduler-Event-Kind"] == ev.kind
        assert signing.verify(tenant.signing_secret, d["headers"][signing.HEADER], d["body"])
    assert not OutboxEvent.objects.filter(published_at__isnull=True).exists()
    assert set(OutboxEvent.objects.values_list("publish_attempts", flat=True)) == {1}


def test_events_of_a_tenant_without_a_webhook_are_marked_published_without_a_call(tenant, other_tenant, target, relay):
    # Written while the tenant had a webhook (otherwise they are written published), which it
    # then removed: the relay marks them without calling anyone.
    with_webhook(tenant, target.url + "/gone")
    with_webhook(other_tenant, target.url + "/events")
    events_for(tenant, target, 2)
    with_webhook(tenant, "")
    theirs = events_for(other_tenant, target, 1)
    assert OutboxEvent.objects.filter(published_at__isnull=True).count() == 3
    relay.step()
    assert not OutboxEvent.objects.filter(published_at__isnull=True).exists()
    assert [json.loads(d["body"])["eventId"] for d in webhook_deliveries(target)] == [str(theirs[0].event_id)]
    assert set(OutboxEvent.objects.filter(tenant=tenant).values_list("publish_attempts", flat=True)) == {0}


def test_a_webhook_on_a_refused_address_is_not_called(tenant, target, settings):
    # Without the operator's loopback allowance the tenant's webhook on 127.0.0.1 is refused,
    # even though the URL itself is the tenant's own (it is its own allowlist).
    settings.SCHEDULER_TARGET_ALLOWED_NETWORKS = []
    with_webhook(tenant, target.url + "/events")
    events_for(tenant, target, 1)
    relay = Relay()
    try:
        relay.step()
    finally:
        relay.close()
    assert target.deliveries == []
    ev = OutboxEvent.objects.get()
    assert ev.published_at is None and ev.last_error.startswith("TargetRefused") and "loopback" in ev.last_error


def test_one_tenants_failing_webhook_does_not_hold_up_another(tenant, other_tenant, target, relay):
    with_webhook(tenant, target.url + "/down")
    with_webhook(other_tenant, target.url + "/events")
    target.responder = lambda d: (500, b"") if d["path"] == "/down" else (200, b"")
    events_for(tenant, target, 2)
    events_for(other_tenant, target, 2)
    relay.step()
    assert len(webhook_deliveries(target)) == 2
    assert not OutboxEvent.objects.filter(tenant=other_tenant, published_at__isnull=True).exists()
    # one call to the failing webhook, not one per event
    assert len(webhook_deliveries(target, "/down")) == 1
    assert OutboxEvent.objects.filter(tenant=tenant, published_at__isnull=True).count() == 2


def test_events_waiting_for_a_retry_are_published_when_the_webhook_is_removed(tenant, target, relay):
    with_webhook(tenant, target.url + "/events")
    events_for(tenant, target, 2)
    target.status = 500
    relay.step()
    assert len(webhook_deliveries(target)) == 1
    with_webhook(tenant, "")
    OutboxEvent.objects.update(next_attempt_at=OutboxEvent.objects.first().created_at)  # due again
    relay.step()
    assert len(webhook_deliveries(target)) == 1  # nobody to call any more
    assert not OutboxEvent.objects.filter(published_at__isnull=True).exists()
