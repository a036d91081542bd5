"""An owner's quiet hours hold its notifications (never drop them) until they end, and its hourly
limit per channel holds the excess, then sends it as one summary that lists every notification it
stands for. Test notifications are never held."""

import json
from datetime import datetime, time, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from dispatch.incidents import notifications_for, send_test_notification
from dispatch.models import Incident, Notification, NotificationKind
from dispatch.notifications import NotificationRelay, quiet_until
from scheduler_project.foundation.dbclock import db_now
from schedules.models import Owner
from schedules.owners import create_owner, edit_owner
from tests.helpers import ACTOR

pytestmark = pytest.mark.django_db

PARIS = ZoneInfo("Europe/Paris")


def queue(tenant, owner, n=1):
    """n notifications for the owner, each of its own (resolved) incident."""
    now = db_now()
    notes = []
    for i in range(n):
        inc = Incident.objects.create(tenant=tenant, owner=owner, rule="dead", summary=f"run {i} went dead",
                                      opened_at=now, last_seen_at=now, state="resolved", resolved_at=now)
        notes += notifications_for(inc, NotificationKind.INCIDENT_OPENED, tenant_slug=tenant.slug, now=now, owner=owner)
    Notification.objects.bulk_create(notes)
    return notes


@pytest.fixture
def relay():
    r = NotificationRelay()
    yield r
    r.close()


def hooks(target):
    return [json.loads(d["body"]) for d in target.deliveries if d["path"] == "/hook"]


def quiet_around_now(owner, zone="Europe/Paris"):
    local = db_now().astimezone(ZoneInfo(zone))
    start = (local - timedelta(hours=1)).time().replace(second=0, microsecond=0)
    end = (local + timedelta(hours=1)).time().replace(second=0, microsecond=0)
    edit_owner(owner, {"time_zone": zone, "quiet_start": start.strftime("%H:%M"), "quiet_end": end.strftime("%H:%M")},
               by=ACTOR)
    return Owner.objects.get(id=owner.id)


def test_notifications_in_quiet_hours_are_held_then_sent_once_when_they_end(tenant, target, relay):
    owner = create_owner(tenant, {"slug": "ops", "name": "Ops", "webhook_url": target.url + "/hook"}, by=ACTOR)
    owner = quiet_around_now(owner)
    (note,) = queue(tenant, owner)
    relay.step()
    assert hooks(target) == []
    held = Notification.objects.get(id=note.id)
    assert held.published_at is None and held.held == "quiet" and held.publish_attempts == 0
    assert held.next_attempt_at == quiet_until(owner, db_now())  # the end of the quiet hours, not lost
    relay.step()
    assert hooks(target) == []  # still waiting

    # The quiet hours end (moved away here, and the wait run out).
    edit_owner(owner, {"quiet_start": None, "quiet_end": None}, by=ACTOR)
    Notification.objects.filter(id=note.id).update(next_attempt_at=db_now() - timedelta(seconds=1))
    relay.step()
    relay.step()
    assert [h["eventId"] for h in hooks(target)] == [str(note.event_id)]
    sent = Notification.objects.get(id=note.id)
    assert sent.published_at is not None and sent.held == ""


def test_a_test_notification_is_never_held(tenant, target, relay):
    owner = create_owner(tenant, {"slug": "ops", "name": "Ops", "webhook_url": target.url + "/hook",
                                  "max_per_hour": 1}, by=ACTOR)
    owner = quiet_around_now(owner)
    send_test_notification(owner, by=ACTOR)
    send_test_notification(owner, by=ACTOR)
    relay.step()
    assert [h["kind"] for h in hooks(target)] == ["incident.test", "incident.test"]


def test_more_than_the_hourly_limit_is_held_and_summarised_never_dropped(tenant, target, relay):
    owner = create_owner(tenant, {"slug": "ops", "name": "Ops", "webhook_url": target.url + "/hook",
                                  "max_per_hour": 2}, by=ACTOR)
    notes = queue(tenant, owner, n=5)
    relay.step()
    first, summary = hooks(target)
    assert first["eventId"] == str(notes[0].event_id)
    assert summary["kind"] == "notification.summary"
    assert [n["eventId"] for n in summary["notifications"]] == [str(n.event_id) for n in notes[1:]]
    assert summary["text"].startswith("4 notifications for ops held by its limit of 2 an hour")
    rows = {n.event_id: n for n in Notification.objects.filter(kind="incident.opened")}
    assert all(r.published_at is not None for r in rows.values())
    summary_row = Notification.objects.get(kind="notification.summary")
    assert [r.summarized_in_id for r in rows.values()].count(summary_row.id) == 4

    # The hour is full: the next one waits until the oldest message of the hour is an hour old.
    (late,) = queue(tenant, owner)
    relay.step()
    assert len(hooks(target)) == 2
    late = Notification.objects.get(id=late.id)
    oldest = Notification.objects.filter(published_at__isnull=False, summarized_in__isnull=True).order_by(
        "published_at").first()
    assert late.held == "rate" and late.published_at is None
    assert late.next_attempt_at == oldest.published_at + timedelta(hours=1)

    # An hour later (the sent ones moved back an hour), it goes out on its own.
    Notification.objects.filter(published_at__isnull=False).update(published_at=db_now() - timedelta(hours=2))
    Notification.objects.filter(id=late.id).update(next_attempt_at=db_now() - timedelta(seconds=1))
    relay.step()
    relay.step()
    assert [h["eventId"] for h in hooks(target)][2:] == [str(late.event_id)]


def test_the_limit_is_per_channel_and_no_limit_means_none(tenant, target, relay):
    owner = create_owner(tenant, {"slug": "ops", "name": "Ops", "webhook_url": target.url + "/hook"}, by=ACTOR)
    edit_owner(owner, {"max_per_hour": None}, by=ACTOR)
    queue(tenant, Owner.objects.get(id=owner.id), n=40)
    while relay.step():
        pass
    relay.step()
    assert len(hooks(target)) == 40 and all(h["kind"] == "incident.opened" for h in hooks(target))


def _owner(start, end, zone="Europe/Paris"):
    return Owner(time_zone=zone, quiet_start=start, quiet_end=end)


def test_quiet_hours_are_wall_times_in_the_owners_zone_and_may_span_midnight():
    night = _owner(time(22, 0), time(7, 0))
    at = lambda *a: datetime(*a, tzinfo=PARIS).astimezone(timezone.utc)  # noqa: E731
    assert quiet_until(night, at(2026, 3, 5, 21, 59)) is None
    assert quiet_until(night, at(2026, 3, 5, 23, 30)) == at(2026, 3, 6, 7, 0)
    assert quiet_until(night, at(2026, 3, 6, 6, 59)) == at(2026, 3, 6, 7, 0)
    assert quiet_until(night, at(2026, 3, 6, 7, 0)) is None
    # Across the spring-forward night (29 March 2026 in Paris): still 07:00 local, now UTC+2.
    assert quiet_until(night, at(2026, 3, 28, 23, 0)) == datetime(2026, 3, 29, 5, 0, tzinfo=timezone.utc)
    lunch = _owner(time(12, 0), time(13, 0), zone="UTC")
    assert quiet_until(lunch, datetime(2026, 3, 5, 12, 30, tzinfo=timezone.utc)) == datetime(
        2026, 3, 5, 13, 0, tzinfo=timezone.utc)
    assert quiet_until(_owner(None, None), datetime(2026, 3, 5, 12, 30, tzinfo=timezone.utc)) is None


def test_the_api_sets_and_refuses_quiet_hours_and_limits(api):
    r = api.post("/api/v1/owners", {"slug": "ops", "name": "Ops", "timeZone": "Europe/Paris", "quietStart": "22:00",
                                    "quietEnd": "07:00", "maxPerHour": 5}, format="json")
    assert r.status_code == 201, r.json()
    assert (r.json()["quietStart"], r.json()["quietEnd"], r.json()["timeZone"], r.json()["maxPerHour"]) == (
        "22:00", "07:00", "Europe/Paris", 5)
    for body, field in (({"quietStart": None}, "quietStart"), ({"quietEnd": "25:00"}, "quietEnd"),
                        ({"timeZone": "Mars/Olympus"}, "timeZone"), ({"maxPerHour": 0}, "maxPerHour"),
                        ({"maxPerHour": "5"}, "maxPerHour"), ({"quietEnd": "22:00"}, "quietEnd")):
        resp = api.patch("/api/v1/owners/ops", body, format="json")
        assert resp.status_code == 400 and field in json.dumps(resp.json()), (body, resp.json())
    assert api.get("/api/v1/owners/ops").json()["quietStart"] == "22:00"  # nothing changed
    r = api.patch("/api/v1/owners/ops", {"quietStart": None, "quietEnd": None, "maxPerHour": None}, format="json")
    assert (r.json()["quietStart"], r.json()["maxPerHour"]) == (None, None)
