"""The incidents page and an owner's page as operator, tenant admin and tenant viewer: each sees
its own tenants' incidents only; admins and operators acknowledge and resolve (audited), viewers
cannot."""

import pytest
from django.contrib.auth.models import User

from dispatch.models import Incident
from scheduler_project.foundation.dbclock import db_now
from schedules.models import AuditEntry, MemberRole, Schedule, TenantMembership
from schedules.owners import create_owner
from tests.helpers import ACTOR, make_schedule

from .conftest import login

pytestmark = pytest.mark.django_db


@pytest.fixture
def incident(tenant, target):
    owner = create_owner(tenant, {"slug": "billing", "name": "Billing team"}, by=ACTOR)
    s = make_schedule(tenant, target.url + "/job", name="nightly-export")
    Schedule.objects.filter(id=s.id).update(owner=owner)
    now = db_now()
    return Incident.objects.create(tenant=tenant, schedule=s, owner=owner, rule="consecutive_failures",
                                   summary="nightly-export failed 3 times in a row", occurrences=3, opened_at=now,
                                   last_seen_at=now)


@pytest.fixture
def viewer(tenant):
    u = User.objects.create_user("vera", password="pw-vera-123")
    TenantMembership.objects.create(user=u, tenant=tenant, role=MemberRole.VIEWER)
    return login(u)


def test_the_operator_and_the_tenant_admin_see_and_act(operator, acme, incident):
    for client in (operator, acme):
        page = client.get("/incidents/").content.decode()
        assert "nightly-export failed 3 times in a row" in page and "Acknowledge" in page and "billing" in page
    r = acme.post(f"/incidents/{incident.id}/acknowledge", {"next": "/incidents/"})
    assert r.status_code == 302
    incident.refresh_from_db()
    assert incident.state == "acknowledged" and incident.acknowledged_by == "user:alice"
    operator.post(f"/incidents/{incident.id}/resolve")
    incident.refresh_from_db()
    assert incident.state == "resolved" and incident.resolved_by == "user:olga"
    assert list(AuditEntry.objects.filter(object_type="incident").order_by("id").values_list("action", flat=True)) == [
        "incident.acknowledge", "incident.resolve"]
    assert "nightly-export" not in operator.get("/incidents/").content.decode()  # unresolved only by default
    assert "nightly-export" in operator.get("/incidents/?state=resolved").content.decode()


def test_a_viewer_sees_but_cannot_act(viewer, incident):
    page = viewer.get("/incidents/").content.decode()
    assert "nightly-export failed" in page and "Acknowledge" not in page
    assert viewer.post(f"/incidents/{incident.id}/acknowledge").status_code == 403
    incident.refresh_from_db()
    assert incident.state == "open"


def test_another_tenant_sees_nothing(globex, incident):
    assert "nightly-export" not in globex.get("/incidents/").content.decode()
    assert globex.post(f"/incidents/{incident.id}/resolve").status_code == 404
    assert globex.get(f"/owners/{incident.owner_id}/").status_code == 404


def test_the_owner_page_lists_its_schedules_and_open_incidents(acme, incident):
    page = acme.get(f"/owners/{incident.owner_id}/").content.decode()
    assert "Billing team" in page and "nightly-export" in page and "3 since" in page
    page = acme.get(f"/incidents/?owner={incident.owner_id}").content.decode()
    assert "nightly-export failed" in page


def test_a_schedules_owner_is_changed_from_its_page_audited_without_a_version(acme, viewer, globex, incident):
    sid = incident.schedule_id
    assert "Billing team" in acme.get(f"/schedules/{sid}/owner").content.decode()
    assert viewer.post(f"/schedules/{sid}/owner", {"owner": ""}).status_code == 403
    assert globex.get(f"/schedules/{sid}/owner").status_code == 404
    r = acme.post(f"/schedules/{sid}/owner", {"owner": ""})
    assert r.status_code == 302
    s = Schedule.objects.get(id=sid)
    assert s.owner_id is None and s.version == 1
    assert AuditEntry.objects.get(action="schedule.owner").after == {"owner": None}
    acme.post(f"/schedules/{sid}/owner", {"owner": str(incident.owner_id)})
    assert Schedule.objects.get(id=sid).owner_id == incident.owner_id
