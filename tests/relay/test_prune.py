"""Pruning deletes published events past the retention, and nothing else."""

from datetime import timedelta

import pytest

from dispatch.relay import prune_published
from runs.models import OutboxEvent
from scheduler_project.foundation.dbclock import db_now
from tests.relay.helpers import loose_events

pytestmark = pytest.mark.django_db


def test_it_removes_only_old_published_events(tenant, settings):
    now = db_now()
    retention = timedelta(hours=settings.SCHEDULER_OUTBOX_RETENTION_HOURS)
    old_published = loose_events(tenant, 3)
    recent_published = loose_events(tenant, 2)
    old_unpublished = loose_events(tenant, 2)
    OutboxEvent.objects.filter(id__in=[e.id for e in old_published]).update(published_at=now - retention - timedelta(minutes=1))
    OutboxEvent.objects.filter(id__in=[e.id for e in recent_published]).update(published_at=now - retention + timedelta(minutes=5))
    OutboxEvent.objects.filter(id__in=[e.id for e in old_unpublished]).update(created_at=now - 2 * retention)

    assert prune_published() == 3
    left = set(OutboxEvent.objects.values_list("id", flat=True))
    assert left == {e.id for e in recent_published + old_unpublished}


def test_it_prunes_in_bounded_batches_oldest_first(tenant):
    events = loose_events(tenant, 5)
    now = db_now()
    for age, e in zip((30, 10, 20, 40, 50), events):
        OutboxEvent.objects.filter(id=e.id).update(published_at=now - timedelta(days=age))
    assert prune_published(limit=2) == 2
    assert set(OutboxEvent.objects.values_list("id", flat=True)) == {e.id for e in events[:3]}
    assert prune_published(limit=10) == 3
    assert not OutboxEvent.objects.exists()
