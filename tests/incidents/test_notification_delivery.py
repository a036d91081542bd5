"""Notifications are delivered at least once with a stable event id: a relay that dies between
sending and recording sends again (same id) once the lease runs out; a channel on a refused
address is never called; a failing channel is retried with backoff and holds back only itself;
e-mail goes through Django's backend with the event id as its Message-ID."""

import json
from datetime import timedelta

import pytest
from django.core import mail

from dispatch.incidents import notifications_for
from dispatch.models import Incident, Notification, NotificationKind
from dispatch.notifications import NotificationRelay, claim
from scheduler_project.foundation.dbclock import db_now
from schedules.owners import create_owner
from tests.helpers import ACTOR

pytestmark = pytest.mark.django_db


def queue_for(tenant, owner, rule="dead"):
    now = db_now()
    # A tenant-wide incident (no schedule): one open per (tenant, rule), so each call its own rule.
    inc = Incident.objects.create(tenant=tenant, owner=owner, rule=rule, summary="a run went dead", opened_at=now,
                                  last_seen_at=now)
    notes = notifications_for(inc, NotificationKind.INCIDENT_OPENED, tenant_slug=tenant.slug, now=now, owner=owner)
    Notification.objects.bulk_create(notes)
    return notes


@pytest.fixture
def relay():
    r = NotificationRelay()
    yield r
    r.close()


def test_a_relay_killed_after_sending_sends_again_with_the_same_event_id(tenant, target, relay):
    owner = create_owner(tenant, {"slug": "ops", "name": "Ops", "webhook_url": target.url + "/hook"}, by=ACTOR)
    (note,) = queue_for(tenant, owner)
    # The dying relay: claimed and sent, never recorded.
    (pending,) = claim(10, visibility_seconds=60)
    relay._loop.run_until_complete(relay.deliver([pending]))
    assert len(target.deliveries) == 1
    assert relay.step() is False and len(target.deliveries) == 1  # still leased: nobody else sends it
    Notification.objects.filter(id=note.id).update(next_attempt_at=db_now() - timedelta(seconds=1))
    relay.step()
    assert [d["headers"]["X-Scheduler-Event-Id"] for d in target.deliveries] == [str(note.event_id)] * 2
    assert Notification.objects.get(id=note.id).published_at is not None
    relay.step()
    assert len(target.deliveries) == 2


def test_a_channel_on_a_refused_address_is_not_called(tenant, target, settings, relay):
    settings.SCHEDULER_TARGET_ALLOWED_NETWORKS = []
    owner = create_owner(tenant, {"slug": "ops", "name": "Ops", "webhook_url": target.url + "/hook"}, by=ACTOR)
    queue_for(tenant, owner)
    relay.step()
    assert target.deliveries == []
    note = Notification.objects.get()
    assert note.published_at is None and note.last_error.startswith("TargetRefused")


def test_a_failing_channel_backs_off_and_holds_back_only_itself(tenant, target, relay):
    target.responder = lambda d: (500, b"") if d["path"] == "/down" else (200, b"")
    down = create_owner(tenant, {"slug": "down", "name": "Down", "webhook_url": target.url + "/down"}, by=ACTOR)
    up = create_owner(tenant, {"slug": "up", "name": "Up", "webhook_url": target.url + "/up"}, by=ACTOR)
    queue_for(tenant, down)
    queue_for(tenant, up, rule="dlq_growth")
    relay.step()
    failed = Notification.objects.get(owner=down)
    assert failed.published_at is None and failed.next_attempt_at > db_now() and failed.last_error
    assert Notification.objects.get(owner=up).published_at is not None


def test_slack_format_and_email(tenant, target, settings, relay):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    owner = create_owner(tenant, {"slug": "ops", "name": "Ops", "email": "ops@example.com",
                                  "webhook_url": target.url + "/slack", "webhook_format": "slack"}, by=ACTOR)
    notes = queue_for(tenant, owner)
    relay.step()
    body = json.loads(target.deliveries[0]["body"])
    assert body["text"] == "Incident: a run went dead" and set(body) == {"text", "eventId"}
    (msg,) = mail.outbox
    email_note = next(n for n in notes if n.channel == "email")
    assert msg.to == ["ops@example.com"] and msg.extra_headers["Message-ID"] == f"<{email_note.event_id}@scheduler>"
    assert not Notification.objects.filter(published_at__isnull=True).exists()
