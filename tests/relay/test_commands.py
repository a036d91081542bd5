"""The relay as operators run it: `relay --once`, and the relay thread of `scheduler`."""

import threading
from io import StringIO

import pytest
from django.core.management import call_command

from dispatch import relay as relay_module
from dispatch.loops import LoopThreads
from dispatch.management.commands.scheduler import start_loops
from runs.models import OutboxEvent
from tests.relay.helpers import events_for, webhook_deliveries, with_webhook


# The command renames its database session (application_name), which reconnects: only a
# committed database survives that.
@pytest.mark.django_db(transaction=True)
def test_relay_once_publishes_everything_due(tenant, target):
    with_webhook(tenant, target.url + "/events")
    events_for(tenant, target, 2)
    out = StringIO()
    call_command("relay", "--once", stdout=out)
    assert len(webhook_deliveries(target)) == 2
    assert not OutboxEvent.objects.filter(published_at__isnull=True).exists()
    assert "'published': 2" in out.getvalue()


@pytest.mark.django_db
def test_relay_step_keeps_one_relay_per_thread(tenant, target):
    with_webhook(tenant, target.url + "/events")
    events_for(tenant, target, 1)
    relay_module.relay_step()
    first = relay_module._local.relay
    relay_module.relay_step()
    try:
        assert relay_module._local.relay is first and first.stats["published"] == 1
    finally:
        first.close()
        del relay_module._local.relay


@pytest.mark.django_db(transaction=True)
def test_the_scheduler_runs_a_relay_thread():
    stop = threading.Event()
    loops = LoopThreads(stop)
    start_loops(loops)
    names = [t.name for t in loops.threads]
    stop.set()
    loops.join(10)
    assert {"scan", "reconcile", "relay"} <= set(names)
    assert not loops.died
