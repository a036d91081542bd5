"""Owners over the API: created and listed per tenant, set on schedules at create and edit (an
audited change that makes no version), a tenant default, filters by owner."""

import pytest

from schedules.models import AuditEntry, Schedule

pytestmark = pytest.mark.django_db


def body(target, **extra):
    return {"expression": "rate(1 hour)", "timeZone": "UTC", "target": {"url": target.url + "/job"}, **extra}


def test_owners_are_created_listed_and_edited_per_tenant(api, other_api):
    r = api.post("/api/v1/owners", {"slug": "billing", "name": "Billing", "email": "billing@example.com",
                                    "webhookUrl": "https://hooks.example.com/x", "webhookFormat": "slack"},
                 format="json")
    assert r.status_code == 201, r.json()
    assert r.json() == {"slug": "billing", "name": "Billing", "email": "billing@example.com",
                        "webhookUrl": "https://hooks.example.com/x", "webhookFormat": "slack", "timeZone": "UTC",
                        "quietStart": None, "quietEnd": None, "maxPerHour": 30, "default": False}
    assert api.post("/api/v1/owners", {"slug": "billing", "name": "Again"}, format="json").status_code == 409
    assert [o["slug"] for o in api.get("/api/v1/owners").json()] == ["billing"]
    assert other_api.get("/api/v1/owners").json() == []
    assert other_api.get("/api/v1/owners/billing").status_code == 404
    r = api.patch("/api/v1/owners/billing", {"name": "Billing team", "default": True}, format="json")
    assert r.status_code == 200 and r.json()["name"] == "Billing team" and r.json()["default"] is True
    assert set(AuditEntry.objects.filter(object_type__in=["owner", "tenant"]).values_list("action", flat=True)) >= {
        "owner.create", "owner.edit", "tenant.default_owner"}


@pytest.mark.parametrize("field,value", [("slug", "Not A Slug"), ("email", "nope"), ("webhookUrl", "ftp://x/y"),
                                         ("webhookFormat", "xml")])
def test_a_bad_owner_is_a_400_that_changes_nothing(api, field, value):
    r = api.post("/api/v1/owners", {"slug": "ops", "name": "Ops", field: value}, format="json")
    assert r.status_code == 400 and field in r.json()["errors"]
    assert api.get("/api/v1/owners").json() == []


def test_a_schedule_takes_its_owner_the_tenant_default_or_none(api, target):
    api.post("/api/v1/owners", {"slug": "billing", "name": "Billing"}, format="json")
    api.post("/api/v1/owners", {"slug": "ops", "name": "Ops", "default": True}, format="json")
    named = api.post("/api/v1/schedules", body(target, owner="billing"), format="json").json()
    default = api.post("/api/v1/schedules", body(target), format="json").json()
    none = api.post("/api/v1/schedules", body(target, owner=None), format="json").json()
    assert (named["owner"], default["owner"], none["owner"]) == ("billing", "ops", None)
    r = api.post("/api/v1/schedules", body(target, owner="nobody"), format="json")
    assert r.status_code == 400 and "owner" in r.json()["errors"]
    assert [s["id"] for s in api.get("/api/v1/schedules?owner=billing").json()["results"]] == [named["id"]]
    assert [s["id"] for s in api.get("/api/v1/schedules?owner=-").json()["results"]] == [none["id"]]


def test_changing_the_owner_is_audited_and_makes_no_version(api, target):
    api.post("/api/v1/owners", {"slug": "billing", "name": "Billing"}, format="json")
    s = api.post("/api/v1/schedules", body(target), format="json").json()
    r = api.patch(f"/api/v1/schedules/{s['id']}", {"expectedVersion": 1, "owner": "billing"}, format="json")
    assert r.status_code == 200 and r.json()["owner"] == "billing" and r.json()["version"] == 1
    entry = AuditEntry.objects.get(action="schedule.owner")
    assert (entry.before, entry.after) == ({"owner": None}, {"owner": "billing"})
    # An edit of a versioned field keeps the owner.
    r = api.patch(f"/api/v1/schedules/{s['id']}", {"expectedVersion": 1, "name": "renamed"}, format="json")
    assert r.json()["owner"] == "billing" and r.json()["version"] == 2
    r = api.patch(f"/api/v1/schedules/{s['id']}", {"expectedVersion": 2, "owner": None}, format="json")
    assert r.json()["owner"] is None and Schedule.objects.get(id=s["id"]).owner_id is None


def test_another_tenants_owner_cannot_be_named(api, other_api, target):
    other_api.post("/api/v1/owners", {"slug": "theirs", "name": "Theirs"}, format="json")
    r = api.post("/api/v1/schedules", body(target, owner="theirs"), format="json")
    assert r.status_code == 400


def test_a_batch_create_takes_owners_per_item(api, target):
    api.post("/api/v1/owners", {"slug": "billing", "name": "Billing"}, format="json")
    r = api.post("/api/v1/schedules/batch", {"schedules": [body(target, owner="billing"), body(target, owner="x")]},
                 format="json")
    assert r.status_code == 207
    first, second = r.json()["results"]
    assert first["status"] == 201 and second["status"] == 400
    assert Schedule.objects.get(id=first["id"]).owner.slug == "billing"
