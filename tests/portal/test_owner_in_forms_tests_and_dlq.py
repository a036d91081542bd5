"""Owners in the portal: the schedule form's owner field (create and edit, through the same
services as the API), the owner page's "send a test notification" button (the notification
outbox, audited; admins and operators, never viewers), and the dead-letter queue grouped and
filtered by owner."""

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from dispatch.models import Notification
from runs.models import RunState
from schedules.models import AuditEntry, MemberRole, Schedule, TenantMembership
from schedules.owners import create_owner, set_default_owner
from tests.helpers import ACTOR, make_schedule

from .conftest import login, make_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def owners(tenant, other_tenant, target):
    billing = create_owner(tenant, {"slug": "billing", "name": "Billing team",
                                    "webhook_url": target.url + "/hooks/billing"}, by=ACTOR)
    ops = create_owner(tenant, {"slug": "ops", "name": "Ops"}, by=ACTOR)
    theirs = create_owner(other_tenant, {"slug": "theirs", "name": "Theirs"}, by=ACTOR)
    set_default_owner(tenant, ops, by=ACTOR)
    return {"billing": billing, "ops": ops, "theirs": theirs}


@pytest.fixture
def viewer(tenant):
    u = User.objects.create_user("vera", password="pw-vera-123")
    TenantMembership.objects.create(user=u, tenant=tenant, role=MemberRole.VIEWER)
    return login(u)


def create_form(tenant, target, **extra):
    return {"tenant": str(tenant.id), "name": "made-in-the-portal", "expression": "0 2 * * *", "time_zone": "UTC",
            "target_url": target.url + "/job", "payload": "{}", **extra}


def test_the_create_form_sets_the_owner_the_default_or_none(acme, tenant, target, owners):
    page = acme.get(reverse("schedules-create")).content.decode()
    assert 'name="owner"' in page and "Billing team (billing)" in page and "theirs" not in page
    cases = (("", owners["ops"].id), ("none", None), (str(owners["billing"].id), owners["billing"].id))
    for i, (choice, expected) in enumerate(cases):
        resp = acme.post(reverse("schedules-create"), create_form(tenant, target, owner=choice, name=f"s{i}"))
        assert resp.status_code == 302, resp.content.decode()[:2000]
        assert Schedule.objects.get(name=f"s{i}").owner_id == expected
    resp = acme.post(reverse("schedules-create"), create_form(tenant, target, owner=str(owners["theirs"].id)))
    assert resp.status_code == 400 and "owner" in resp.context["errors"]
    assert not Schedule.objects.filter(name="made-in-the-portal").exists()


def test_the_edit_form_changes_only_the_owner_without_a_new_version(acme, schedule, owners):
    form = acme.get(reverse("schedules-edit", args=[schedule.id]))
    assert 'id="s-owner"' in form.content.decode()
    assert form.context["v"]["owner"] == str(owners["ops"].id) or form.context["v"]["owner"] == "none"
    # The form as loaded, with another owner chosen.
    posted = {k: v for k, v in form.context["v"].items() if v is not None and not isinstance(v, bool)}
    resp = acme.post(reverse("schedules-edit", args=[schedule.id]), {**posted, "owner": str(owners["billing"].id)},
                     follow=True)
    schedule.refresh_from_db()
    assert schedule.owner_id == owners["billing"].id and schedule.version == 1
    assert "Owner: Billing team." in resp.content.decode()
    entry = AuditEntry.objects.filter(action="schedule.owner").latest("id")
    assert entry.after == {"owner": "billing"} and entry.actor == "user:alice"


def test_the_test_button_queues_an_audited_notification_for_admins_not_viewers(operator, acme, viewer, owners):
    billing = owners["billing"]
    url = reverse("incidents-owner-test", args=[billing.id])
    assert 'data-testid="send-test"' not in viewer.get(f"/owners/{billing.id}/").content.decode()
    assert viewer.post(url).status_code == 403
    assert not Notification.objects.exists()

    page = acme.post(url, follow=True).content.decode()
    assert "A test notification is queued" in page
    (note,) = Notification.objects.all()
    assert (note.kind, note.channel, note.destination) == ("incident.test", "webhook", billing.webhook_url)
    assert AuditEntry.objects.filter(action="owner.test_notification", actor="user:alice").count() == 1
    assert "incident.test" in page and "queued" in page  # shown on the owner's page until sent

    operator.post(url)
    assert Notification.objects.count() == 2
    # An owner without channels: nothing queued, and the page says why.
    page = acme.post(reverse("incidents-owner-test", args=[owners["ops"].id]), follow=True).content.decode()
    assert "no webhook and no e-mail address" in page and Notification.objects.count() == 2


def test_the_dlq_groups_and_filters_by_owner(operator, acme, tenant, target, owners):
    mine = make_schedule(tenant, target.url + "/a", name="billing-export")
    Schedule.objects.filter(id=mine.id).update(owner=owners["billing"])
    nobody = make_schedule(tenant, target.url + "/b", name="orphan-job")
    Schedule.objects.filter(id=nobody.id).update(owner=None)
    for s, n in ((mine, 3), (nobody, 1)):
        for _ in range(n):
            make_run(s, RunState.DEAD)
    for client in (operator, acme):
        page = client.get(reverse("runs-dlq")).content.decode()
        assert 'data-testid="dlq-by-owner"' in page
        by_owner = page.split('data-testid="dlq-by-owner"')[1].split("</table>")[0]
        assert by_owner.index("Billing team") < by_owner.index("No owner")  # most dead runs first
        assert "Show the 3 runs of this owner" in by_owner and "Show the 1 runs of this owner" in by_owner
        billing_only = client.get(reverse("runs-dlq"), {"owner": str(owners["billing"].id)}).content.decode()
        assert "billing-export" in billing_only and "orphan-job" not in billing_only
        none_only = client.get(reverse("runs-dlq"), {"owner": "none"}).content.decode()
        assert "orphan-job" in none_only and "billing-export" not in none_only
    resp = acme.get(reverse("runs-dlq"), {"owner": "garbage"})
    assert resp.status_code == 400 and "is not an owner" in resp.content.decode()


def test_the_owner_page_sets_quiet_hours_and_the_limit_audited_and_refuses_garbage(acme, viewer, owners):
    billing = owners["billing"]
    url = reverse("incidents-owner-settings", args=[billing.id])
    assert 'data-testid="owner-settings"' not in viewer.get(f"/owners/{billing.id}/").content.decode()
    assert viewer.post(url, {"quiet_start": "22:00", "quiet_end": "07:00"}).status_code == 403

    page = acme.post(url, {"quiet_start": "22:00", "quiet_end": "07:00", "time_zone": "Europe/Berlin",
                           "max_per_hour": "12", "webhook_url": billing.webhook_url, "webhook_format": "slack",
                           "email": ""}, follow=True).content.decode()
    assert "Owner settings saved." in page
    billing.refresh_from_db()
    assert (billing.quiet_start.strftime("%H:%M"), billing.quiet_end.strftime("%H:%M"), billing.time_zone,
            billing.max_per_hour, billing.webhook_format) == ("22:00", "07:00", "Europe/Berlin", 12, "slack")
    assert AuditEntry.objects.filter(action="owner.edit", actor="user:alice").count() == 1
    assert "22:00 to 07:00 Europe/Berlin" in page

    # Garbage: an error naming the field, nothing changed, no audit entry.
    for bad, says in (({"quiet_start": "25:00"}, "must be a wall time"), ({"max_per_hour": "lots"}, "whole number"), ({"max_per_hour": "²"}, "whole number"),
                      ({"max_per_hour": "9" * 3000}, "whole number"),
                      ({"time_zone": "Mars/Olympus"}, "Mars/Olympus"), ({"quiet_end": ""}, "both a start and an end"),
                      ({"webhook_url": "ftp://x"}, "http:// or https://")):
        page = acme.post(url, bad, follow=True).content.decode()
        assert "Owner settings saved." not in page and says in page, (bad, says)
        billing.refresh_from_db()
        assert (billing.quiet_start.strftime("%H:%M"), billing.quiet_end, billing.max_per_hour) == \
            ("22:00", billing.quiet_end, 12), bad
    assert billing.quiet_end.strftime("%H:%M") == "07:00"
    assert AuditEntry.objects.filter(action="owner.edit").count() == 1

    # Blank quiet hours and limit mean none.
    acme.post(url, {"quiet_start": "", "quiet_end": "", "max_per_hour": ""})
    billing.refresh_from_db()
    assert (billing.quiet_start, billing.quiet_end, billing.max_per_hour) == (None, None, None)
