"""A failing webhook is retried with backoff; a relay that dies after claiming loses nothing."""

import json
import threading
from datetime import timedelta

import pytest
from django.db import connection

from dispatch.relay import Outcome, Relay, backoff_seconds, claim_events, record
from dispatch.safehttp import HttpResult
from runs.models import OutboxEvent
from scheduler_project.foundation.dbclock import db_now
from tests.relay.helpers import events_for, loose_events, make_due_for_retry, webhook_deliveries, with_webhook


@pytest.fixture
def relay():
    r = Relay()
    yield r
    r.close()


def delivered_ids(target):
    return [json.loads(d["body"])["eventId"] for d in webhook_deliveries(target)]


@pytest.mark.django_db
def test_a_500_is_retried_after_a_backoff_then_delivered(tenant, target, relay):
    with_webhook(tenant, target.url + "/events")
    events = events_for(tenant, target, 3)
    target.status = 500
    before = db_now()
    relay.step()

    first, *rest = OutboxEvent.objects.order_by("id")
    assert delivered_ids(target) == [str(events[0].event_id)]  # the tenant's others were held back
    assert first.published_at is None and first.publish_attempts == 1 and "HTTP 500" in first.last_error
    assert first.next_attempt_at >= before + timedelta(seconds=0.5)  # at least half the first step
    for ev in rest:  # put back untried, to wait as long as the failed one
        assert (ev.publish_attempts, ev.next_attempt_at, ev.last_error) == (0, first.next_attempt_at, "")

    relay.step()  # still within the backoff: no call
    assert len(webhook_deliveries(target)) == 1

    target.status = 200
    make_due_for_retry(OutboxEvent.objects.all())
    relay.circuits.clear()  # the in-memory hold-back is this relay's; the database says when
    relay.step()
    assert delivered_ids(target) == [str(e.event_id) for e in events[:1] + events]
    assert not OutboxEvent.objects.filter(published_at__isnull=True).exists()
    assert OutboxEvent.objects.get(id=first.id).last_error == ""


@pytest.mark.django_db
def test_backoff_grows_with_failures_and_is_capped():
    assert all(0.5 <= backoff_seconds(1, 600) <= 1 for _ in range(50))
    assert all(4 <= backoff_seconds(4, 600) <= 8 for _ in range(50))
    assert all(300 <= backoff_seconds(30, 600) <= 600 for _ in range(50))


class BusyWebhook:
    """A client whose every call answers 429 with Retry-After: 120 (the shared test target
    cannot send extra headers)."""

    def __init__(self):
        self.calls = 0

    async def request(self, method, url, **kwargs):
        self.calls += 1
        return HttpResult(429, "failed", True, 120.0, "HTTPStatus", "HTTP 429", b"", 1, "127.0.0.1")

    async def close(self):
        pass


@pytest.mark.django_db
def test_retry_after_from_the_webhook_is_honoured(tenant, target):
    with_webhook(tenant, target.url + "/events")
    events_for(tenant, target, 1)
    client = BusyWebhook()
    relay = Relay(client=client)
    try:
        before = db_now()
        relay.step()
    finally:
        relay.close()
    ev = OutboxEvent.objects.get()
    assert client.calls == 1 and ev.published_at is None and "HTTP 429" in ev.last_error
    # the first backoff step is about a second; the webhook asked for two minutes
    assert ev.next_attempt_at >= before + timedelta(seconds=120)


@pytest.mark.django_db
def test_a_relay_that_dies_after_claiming_loses_nothing(tenant, target, relay):
    with_webhook(tenant, target.url + "/events")
    events = events_for(tenant, target, 3)
    # The crashed relay: claimed and committed, then gone before calling or recording.
    claimed, _ = claim_events(10, visibility_seconds=120)
    assert len(claimed) == 3

    relay.step()  # the lease still holds: nobody else sends them yet
    assert webhook_deliveries(target) == []

    make_due_for_retry(OutboxEvent.objects.all())  # the visibility timeout has passed
    relay.step()
    assert sorted(delivered_ids(target)) == sorted(str(e.event_id) for e in events)
    assert not OutboxEvent.objects.filter(published_at__isnull=True).exists()
    # the crashed claim counted: an event that kills relays still backs off
    assert set(OutboxEvent.objects.values_list("publish_attempts", flat=True)) == {2}


@pytest.mark.django_db
def test_a_relay_that_dies_after_the_call_sends_again_with_the_same_event_id(tenant, target, relay):
    with_webhook(tenant, target.url + "/events")
    (ev,) = events_for(tenant, target, 1)
    claimed, _ = claim_events(10, visibility_seconds=120)
    relay._loop.run_until_complete(relay.deliver(claimed))  # delivered, then died before record()
    assert OutboxEvent.objects.get().published_at is None

    make_due_for_retry(OutboxEvent.objects.all())
    relay.step()
    got = webhook_deliveries(target)
    assert [d["headers"]["Idempotency-Key"] for d in got] == [str(ev.event_id)] * 2  # at least once
    assert OutboxEvent.objects.get().published_at is not None


@pytest.mark.django_db
def test_a_late_failure_does_not_undo_a_newer_claim(tenant, target):
    with_webhook(tenant, target.url + "/events")
    events_for(tenant, target, 1)
    old, _ = claim_events(10, visibility_seconds=120)
    make_due_for_retry(OutboxEvent.objects.all())
    new, _ = claim_events(10, visibility_seconds=120)  # another relay, after the lease ran out
    record([Outcome(old[0], "failed", 1.0, "HTTPStatus: HTTP 500")])
    ev = OutboxEvent.objects.get()
    assert ev.next_attempt_at == new[0].leased_until and ev.last_error == ""
    record([Outcome(new[0], "published")])
    assert OutboxEvent.objects.get().published_at is not None


@pytest.mark.django_db
def test_retries_and_fresh_events_share_a_claim(tenant, target):
    with_webhook(tenant, target.url + "/events")
    loose_events(tenant, 10)
    OutboxEvent.objects.filter(id__in=OutboxEvent.objects.order_by("id").values("id")[:6]).update(
        next_attempt_at=db_now() - timedelta(minutes=1), publish_attempts=3
    )
    claimed, more = claim_events(6, visibility_seconds=120)
    assert [e.publish_attempts for e in claimed].count(4) == 3  # half the batch for retries
    assert [e.publish_attempts for e in claimed].count(1) == 3  # the rest for fresh events
    assert more is True


@pytest.mark.django_db(transaction=True)
def test_two_relays_never_claim_the_same_event(tenant, target):
    with_webhook(tenant, target.url + "/events")
    loose_events(tenant, 400)
    got = {"a": [], "b": []}
    barrier = threading.Barrier(2)

    def relay(name):
        try:
            barrier.wait()
            while True:
                events, _ = claim_events(25, visibility_seconds=120)
                if not events:
                    return
                got[name].extend(e.id for e in events)
        finally:
            connection.close()

    threads = [threading.Thread(target=relay, args=(n,)) for n in got]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got["a"]) + len(got["b"]) == 400
    assert not set(got["a"]) & set(got["b"])
