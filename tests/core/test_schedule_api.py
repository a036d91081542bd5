"""The core API subset: create with defaults, edit with expectedVersion, refusals that store nothing."""

import pytest

from schedules.models import AuditEntry, Schedule, ScheduleVersion

pytestmark = pytest.mark.django_db


def create(api, target_server, **over):
    body = {"expression": "30 2 * * *", "timeZone": "America/New_York", "target": {"url": target_server.url + "/r"}, **over}
    return api.post("/api/v1/schedules", body, format="json")


def test_create_fills_every_default_and_computes_next_run(api, target):
    r = create(api, target)
    assert r.status_code == 201
    s = r.json()
    assert s["version"] == 1 and s["enabled"] is True and s["status"] == "active"
    assert s["nextRunAt"].endswith(":30:00Z")
    assert s["target"] == {"url": target.url + "/r", "method": "POST", "headers": {}, "timeoutSeconds": 30}
    assert s["misfirePolicy"] == "run_once" and s["catchupLimit"] == 10 and s["misfireGraceSeconds"] == 60
    assert s["overlapPolicy"] == "allow"
    assert s["retryPolicy"] == {"maxAttempts": 5, "backoffBaseSeconds": 1.0, "backoffMaxSeconds": 300.0}
    assert s["dstPolicy"] == {"skipped": "next_valid", "repeated": "earlier"}


def test_an_edit_needs_the_current_version_and_makes_a_new_immutable_one(api, target):
    s = create(api, target).json()
    r = api.patch(f"/api/v1/schedules/{s['id']}", {"expectedVersion": 1, "expression": "45 3 * * *"}, format="json")
    assert r.status_code == 200 and r.json()["version"] == 2 and r.json()["expression"] == "45 3 * * *"
    stale = api.patch(f"/api/v1/schedules/{s['id']}", {"expectedVersion": 1, "expression": "0 4 * * *"}, format="json")
    assert stale.status_code == 409 and stale.json()["currentVersion"] == 2
    missing = api.patch(f"/api/v1/schedules/{s['id']}", {"expression": "0 4 * * *"}, format="json")
    assert missing.status_code == 400 and "expectedVersion" in missing.json()["errors"]
    versions = ScheduleVersion.objects.filter(schedule_id=s["id"]).order_by("version")
    assert [v.expression for v in versions] == ["30 2 * * *", "45 3 * * *"]
    assert versions[1].changes == {"expression": ["30 2 * * *", "45 3 * * *"]}
    edit = AuditEntry.objects.get(action="schedule.edit")
    assert edit.actor.startswith("key:") and edit.before["expression"] == "30 2 * * *"
    assert edit.after["expression"] == "45 3 * * *"


@pytest.mark.parametrize(
    "over, field",
    [
        ({"expression": "61 * * * *"}, "expression"),
        ({"expression": "0 0 30 2 *"}, "expression"),  # never fires
        ({"expression": "rate(0 minutes)"}, "expression"),
        ({"timeZone": "Mars/Olympus_Mons"}, "timeZone"),
        ({"target": {"url": "http://evil.example.net/x"}}, "target"),  # not on the allowlist
        ({"target": {"url": "ftp://x"}}, "target"),
        ({"misfirePolicy": "sometimes"}, "misfirePolicy"),
        ({"dstPolicy": {"skipped": "never"}}, "dstPolicy"),
        ({"retryPolicy": {"maxAttempts": 0}}, "retryPolicy"),
        ({"colour": "blue"}, "colour"),  # unknown fields are refused, not ignored
    ],
)
def test_bad_input_is_a_400_with_a_field_error_and_stores_nothing(api, target, over, field):
    r = create(api, target, **over)
    assert r.status_code == 400, r.content
    errors = r.json()["errors"]
    keys = [k for k in errors if k == field or k.startswith(field + ".")]  # nested fields as "dstPolicy.skipped"
    assert keys, errors
    assert all(isinstance(m, str) and m for k in keys for m in errors[k])
    assert Schedule.objects.count() == 0 and ScheduleVersion.objects.count() == 0


def test_malformed_json_is_a_400_not_a_500(api):
    r = api.post("/api/v1/schedules", data="{not json", content_type="application/json")
    assert r.status_code == 400 and "JSON" in r.json()["error"]


def test_a_schedule_created_paused_has_no_next_run_until_resumed(api, target):
    s = create(api, target, enabled=False).json()
    assert s["enabled"] is False and s["nextRunAt"] is None
    r = api.patch(f"/api/v1/schedules/{s['id']}", {"expectedVersion": 1, "enabled": True}, format="json")
    assert r.status_code == 200 and r.json()["enabled"] is True and r.json()["nextRunAt"].endswith(":30:00Z")
