"""Published events past the outbox's retention are removed, and nothing else: on SQLite by the
relay's bounded batches, on PostgreSQL with their partition of the outbox (retention's swap),
where the relay deletes none row by row."""

from datetime import timedelta

import pytest
from django.db import connection

from dispatch.relay import prune_published
from runs.models import OutboxEvent
from scheduler_project.foundation.dbclock import db_now
from tests.relay.helpers import loose_events
from tests.retention.conftest import run_retention

pytestmark = pytest.mark.django_db



def test_the_relay_removes_only_old_published_events_and_on_postgresql_none(tenant, settings):
    now = db_now()
    retention = timedelta(hours=settings.SCHEDULER_OUTBOX_RETENTION_HOURS)
    old_published = loose_events(tenant, 3)
    recent_published = loose_events(tenant, 2)
    old_unpublished = loose_events(tenant, 2)
    OutboxEvent.objects.filter(id__in=[e.id for e in old_published]).update(published_at=now - retention - timedelta(minutes=1))
    OutboxEvent.objects.filter(id__in=[e.id for e in recent_published]).update(published_at=now - retention + timedelta(minutes=5))
    OutboxEvent.objects.filter(id__in=[e.id for e in old_unpublished]).update(created_at=now - 2 * retention)

    everything = {e.id for e in old_published + recent_published + old_unpublished}

    if connection.vendor == "postgresql":
        assert prune_published() == 0  # their partition goes whole (the test below)
        assert set(OutboxEvent.objects.values_list("id", flat=True)) == everything
        return
    assert prune_published() == 3
    left = set(OutboxEvent.objects.values_list("id", flat=True))
    assert left == {e.id for e in recent_published + old_unpublished}


def test_the_relay_prunes_in_bounded_batches_oldest_written_first(tenant):
    events = loose_events(tenant, 5)
    now = db_now()
    for age, e in zip((30, 10, 20, 40, 50), events):
        OutboxEvent.objects.filter(id=e.id).update(published_at=now - timedelta(days=age))
    if connection.vendor == "postgresql":
        assert prune_published(limit=2) == 0
        assert OutboxEvent.objects.count() == 5
        return
    assert prune_published(limit=2) == 2
    assert set(OutboxEvent.objects.values_list("id", flat=True)) == {e.id for e in events[2:]}
    assert prune_published(limit=10) == 3
    assert not OutboxEvent.objects.exists()


@pytest.mark.postgresql_only("the outbox's partitions")
def test_published_events_go_with_their_partition_and_unpublished_ones_stay(tenant, settings):
    now = db_now()
    published = loose_events(tenant, 3)
    unpublished = loose_events(tenant, 2)
    OutboxEvent.objects.filter(id__in=[e.id for e in published]).update(published_at=now)
    everything = {e.id for e in published + unpublished}

    # Past their retention, the relay leaves them alone (nothing is deleted row by row) ...
    later = now + timedelta(hours=settings.SCHEDULER_OUTBOX_RETENTION_HOURS) + timedelta(days=2)
    assert prune_published(older_than_hours=-48) == 0
    assert set(OutboxEvent.objects.values_list("id", flat=True)) == everything

    # ... and retention takes the partition that holds them, keeping what is not published.
    run_retention(later)
    assert set(OutboxEvent.objects.values_list("id", flat=True)) == {e.id for e in unpublished}
