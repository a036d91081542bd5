"""A tenant without a webhook has nobody to deliver its events to: every path that writes run
events (scanner, claim, result) writes them published, so the relay never rewrites them. A
tenant with a webhook has them written unpublished, for the relay."""

import pytest

from dispatch.loops import drain, scan_step
from dispatch.worker import run_worker
from runs.models import OutboxEvent
from tests.helpers import make_due, make_schedule
from tests.relay.helpers import with_webhook

pytestmark = pytest.mark.django_db(transaction=True)


def test_run_events_are_written_published_only_for_tenants_without_a_webhook(tenant, other_tenant, target):
    with_webhook(other_tenant, target.url + "/events")
    for t in (tenant, other_tenant):
        make_due(make_schedule(t, target.url + f"/{t.slug}"))
    drain(scan_step)
    run_worker("w-events", once=True, poll_seconds=0)

    mine = OutboxEvent.objects.filter(tenant=tenant)
    theirs = OutboxEvent.objects.filter(tenant=other_tenant)
    kinds = ["run.created", "run.leased", "run.succeeded"]
    assert sorted(mine.values_list("kind", flat=True)) == sorted(theirs.values_list("kind", flat=True)) == kinds
    assert all(e.published_at is not None and e.publish_attempts == 0 for e in mine)
    assert all(e.published_at is None for e in theirs)
