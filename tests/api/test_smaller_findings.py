"""Issue 26, finding 12 (the API's part): duplicate JSON keys were accepted silently (the last
won); a trigger's answer carried a createdAt that was never stored; audit entries were snake_case
with string ids unlike the rest of the API."""

import pytest

from runs.models import Run
from schedules.models import Schedule
from tests.api.conftest import schedule_body

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("raw, key", [
    ('{"expression": "*/5 * * * *", "expression": "0 3 * * *", "timeZone": "UTC", "target": {"url": "%s/h"}}',
     "expression"),
    ('{"expression": "*/5 * * * *", "timeZone": "UTC", "target": {"url": "%s/h", "method": "POST", "method": "GET"}}',
     "method"),
    ('{"expression": "*/5 * * * *", "timeZone": "UTC", "payload": {"a": 1, "a": 2}, "target": {"url": "%s/h"}}', "a"),
])
def test_duplicate_json_keys_are_a_400_naming_the_key(api, target, raw, key):
    resp = api.post("/api/v1/schedules", data=raw % target.url, content_type="application/json")
    assert resp.status_code == 400, resp.content
    assert f"the key '{key}' appears more than once" in resp.json()["error"]
    assert not Schedule.objects.exists()


def test_duplicate_json_keys_are_a_400_on_edit_too(api, schedule):
    resp = api.patch(f"/api/v1/schedules/{schedule.id}", data='{"expectedVersion": 1, "name": "a", "name": "b"}',
                     content_type="application/json")
    assert resp.status_code == 400 and "'name' appears more than once" in resp.json()["error"]
    schedule.refresh_from_db()
    assert schedule.version == 1


def test_trigger_answers_the_stored_created_at(api, schedule):
    resp = api.post(f"/api/v1/schedules/{schedule.id}/trigger")
    assert resp.status_code == 201
    body = resp.json()
    assert body["createdAt"] == api.get(f"/api/v1/runs/{body['id']}").json()["createdAt"]
    stored = Run.objects.get(id=body["id"]).created_at
    assert body["createdAt"] == stored.isoformat().replace("+00:00", "Z")


def test_audit_entries_are_camel_case_with_integer_ids(api, target):
    body = {**schedule_body(target, payload={"snake_key": 1}),
            "target": {"url": target.url + "/h", "headers": {"X_Team": "bi"}}}
    created = api.post("/api/v1/schedules", body, format="json").json()
    sid = created["id"]
    api.patch(f"/api/v1/schedules/{sid}", {"expectedVersion": 1, "startAt": "2026-01-01T00:00:00-05:00"},
              format="json")
    api.patch(f"/api/v1/schedules/{sid}", {"expectedVersion": 2, "enabled": False}, format="json")
    api.patch(f"/api/v1/schedules/{sid}", {"expectedVersion": 2, "enabled": True}, format="json")
    entries = api.get("/api/v1/audit", {"objectId": sid}).json()["results"]
    assert all(isinstance(e["id"], int) for e in entries)
    assert [e["id"] for e in entries] == sorted((e["id"] for e in entries), reverse=True)
    by_action = {e["action"]: e for e in entries}
    edit = by_action["schedule.edit"]
    for side in ("before", "after"):
        fields = edit[side]
        assert not [k for k in fields if "_" in k], fields
        assert fields["target"]["url"] == target.url + "/h" and fields["timeZone"] == "Europe/Paris"
        assert fields["retryPolicy"]["maxAttempts"] == 5 and fields["dstPolicy"]["skipped"] == "next_valid"
        # The client's own keys, as sent.
        assert fields["payload"] == {"snake_key": 1} and fields["target"]["headers"] == {"X_Team": "bi"}
    assert edit["before"]["startAt"] is None and edit["after"]["startAt"] == "2026-01-01T05:00:00Z"
    assert by_action["schedule.resume"]["after"]["nextRunAt"].endswith("Z")
    # The API's schedule shape and the audit's agree on names.
    schedule = api.get(f"/api/v1/schedules/{sid}").json()
    assert set(edit["after"]) - {"subMinute"} <= set(schedule)
    assert set(edit["after"]["target"]) == set(schedule["target"])
