"""Issue 26, finding 4: one tenant's hanging webhook delayed everyone's events (the relay waited
for every delivery of a step, so each step took the hanging call's whole time limit). Now each
tenant's deliveries run on their own, and a hanging webhook holds back only its own events."""

import json
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection

from dispatch.loops import run_loop
from dispatch.relay import Relay
from runs.models import OutboxEvent
from tests.dispatch.test_fair_by_default import Silent, p99
from tests.relay.helpers import loose_events, webhook_deliveries, with_webhook

pytestmark = pytest.mark.django_db(transaction=True)


def run_relay(stop: threading.Event) -> None:
    relay = Relay()  # every relay setting as shipped: a 10 s time limit per delivery
    try:
        run_loop(relay, stop=stop)
    finally:
        relay.close()
        connection.close()


def delivery_lags(tenant, target, n, path="/events"):
    """Write n events for the tenant, a little apart, and return how long each took to reach
    its webhook; fails if they do not all arrive within 20 s."""
    made = []
    for _ in range(n):
        made += loose_events(tenant, 1)
        time.sleep(0.05)
    created = {str(e.event_id): e.created_at for e in OutboxEvent.objects.filter(id__in=[e.id for e in made])}
    deadline = time.monotonic() + 20
    arrived = {}
    while time.monotonic() < deadline and len(arrived) < n:
        for d in webhook_deliveries(target, path):
            event_id = json.loads(d["body"])["eventId"]
            if event_id in created:
                arrived.setdefault(event_id, d["at"])
        time.sleep(0.05)
    assert len(arrived) == n, f"only {len(arrived)} of the other tenant's {n} events arrived within 20 s"
    return [(arrived[k] - created[k]).total_seconds() for k in created]


def test_one_tenants_hanging_webhook_delays_everyones_events(tenant, other_tenant, target):
    silent = Silent()
    with_webhook(tenant, silent.url + "/hook")
    with_webhook(other_tenant, target.url + "/events")
    stop = threading.Event()
    relay = threading.Thread(target=run_relay, args=(stop,))
    relay.start()
    try:
        baseline = delivery_lags(other_tenant, target, 20)
        loose_events(tenant, 50)  # their webhook accepts the connection and never answers
        deadline = time.monotonic() + 10
        while not silent.accepted and time.monotonic() < deadline:
            time.sleep(0.05)
        assert silent.accepted  # the hanging delivery is in flight
        noisy = delivery_lags(other_tenant, target, 20)
        bound = max(2 * p99(baseline), 2.0)
        assert p99(noisy) <= bound, f"p99 delivery lag {p99(noisy):.3f}s beside the hanging webhook, baseline {p99(baseline):.3f}s"
        # The hanging tenant's events went one at a time (its first, then its retry), not 50.
        assert 1 <= len(silent.accepted) <= 2
    finally:
        stop.set()
        relay.join(30)
        silent.close()
    assert not relay.is_alive()
    # Nothing of the hanging tenant was lost or marked delivered: its events wait for their retry.
    assert OutboxEvent.objects.filter(tenant=tenant, published_at__isnull=True).count() == 50
    first = OutboxEvent.objects.filter(tenant=tenant).order_by("id").first()
    assert first.next_attempt_at is not None and first.next_attempt_at > first.created_at + timedelta(seconds=1)
