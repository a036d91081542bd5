"""Incidents and incident rules over the API: listed per tenant and filtered, acknowledged and
resolved by a person (409 when that no longer applies), rules set per tenant and per schedule."""

import pytest

from dispatch.models import Incident, IncidentPolicy
from scheduler_project.foundation.dbclock import db_now
from tests.helpers import make_schedule

pytestmark = pytest.mark.django_db


@pytest.fixture
def incident(tenant, target):
    s = make_schedule(tenant, target.url + "/job")
    now = db_now()
    return Incident.objects.create(tenant=tenant, schedule=s, rule="dead", summary="a run went dead", opened_at=now,
                                   last_seen_at=now)


def test_incidents_are_listed_acknowledged_and_resolved(api, other_api, incident):
    page = api.get("/api/v1/incidents?state=open").json()
    assert [i["id"] for i in page["results"]] == [incident.id]
    assert other_api.get("/api/v1/incidents").json()["results"] == []
    assert other_api.post(f"/api/v1/incidents/{incident.id}/acknowledge").status_code == 404
    r = api.post(f"/api/v1/incidents/{incident.id}/acknowledge")
    assert r.status_code == 200 and r.json()["state"] == "acknowledged" and r.json()["acknowledgedBy"].startswith("key:")
    assert api.post(f"/api/v1/incidents/{incident.id}/acknowledge").status_code == 409
    r = api.post(f"/api/v1/incidents/{incident.id}/resolve")
    assert r.status_code == 200 and r.json()["state"] == "resolved"
    assert api.post(f"/api/v1/incidents/{incident.id}/resolve").status_code == 409
    assert api.get("/api/v1/incidents?state=open").json()["results"] == []
    assert api.get(f"/api/v1/incidents?scheduleId={incident.schedule_id}").json()["results"][0]["id"] == incident.id
    assert api.get("/api/v1/incidents?state=nope").status_code == 400


def test_rules_are_set_for_the_tenant_and_overridden_per_schedule(api, tenant, target):
    rules = {r["rule"]: r for r in api.get("/api/v1/incident-rules").json()}
    assert rules["consecutive_failures"]["threshold"] == 3 and rules["consecutive_failures"]["default"] is True
    r = api.put("/api/v1/incident-rules/consecutive_failures", {"enabled": True, "threshold": 5}, format="json")
    assert r.status_code == 200 and r.json()["threshold"] == 5
    s = make_schedule(tenant, target.url + "/job")
    r = api.put("/api/v1/incident-rules/consecutive_failures", {"enabled": False, "scheduleId": str(s.id)},
                format="json")
    assert r.status_code == 200
    per_schedule = {r["rule"]: r for r in api.get(f"/api/v1/incident-rules?scheduleId={s.id}").json()}
    assert per_schedule["consecutive_failures"]["enabled"] is False
    assert api.put("/api/v1/incident-rules/nope", {"enabled": True}, format="json").status_code == 400
    assert api.put("/api/v1/incident-rules/dlq_growth", {"enabled": True, "scheduleId": str(s.id)},
                   format="json").status_code == 400
    assert IncidentPolicy.objects.count() == 2


def test_a_test_notification_is_queued_on_each_channel(api):
    api.post("/api/v1/owners", {"slug": "ops", "name": "Ops", "email": "ops@example.com",
                                "webhookUrl": "https://hooks.example.com/x"}, format="json")
    r = api.post("/api/v1/owners/ops/test-notification")
    assert r.status_code == 202 and sorted(r.json()["channels"]) == ["email", "webhook"]
