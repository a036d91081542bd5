"""Schedules over HTTP: create with defaults, read, list and filter, edit with expectedVersion,
pause/resume, archive, trigger, backfill, occurrence preview."""

import re
import uuid

import pytest

from runs.models import Run
from schedules.models import Schedule
from tests.api.conftest import hourly_runs, schedule_body

pytestmark = pytest.mark.django_db

UTC_Z = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


def test_create_fills_every_default_and_answers_utc_times_with_z(api, target):
    resp = api.post("/api/v1/schedules", schedule_body(target), format="json")
    assert resp.status_code == 201, resp.content
    body = resp.json()
    uuid.UUID(body["id"])
    assert body["version"] == 1 and body["status"] == "active" and body["enabled"] is True
    assert body["target"] == {"url": target.url + "/hook", "method": "POST", "headers": {}, "timeoutSeconds": 30}
    assert body["retryPolicy"] == {"maxAttempts": 5, "backoffBaseSeconds": 1.0, "backoffMaxSeconds": 300.0}
    assert body["dstPolicy"] == {"skipped": "next_valid", "repeated": "earlier"}
    assert (body["misfirePolicy"], body["catchupLimit"], body["misfireGraceSeconds"], body["overlapPolicy"]) == (
        "run_once", 10, 60, "allow")
    assert body["payload"] == {} and body["startAt"] is None and body["endAt"] is None
    for field in ("nextRunAt", "createdAt", "updatedAt"):
        assert UTC_Z.match(body[field]), (field, body[field])


def test_start_and_end_given_with_an_offset_come_back_in_utc(api, target):
    body = schedule_body(target, startAt="2090-03-08T02:00:00-05:00", endAt="2091-01-01T00:00:00+01:00")
    got = api.post("/api/v1/schedules", body, format="json").json()
    assert got["startAt"] == "2090-03-08T07:00:00Z" and got["endAt"] == "2090-12-31T23:00:00Z"


def test_a_time_without_an_offset_is_refused_rather_than_guessed(api, target):
    resp = api.post("/api/v1/schedules", schedule_body(target, startAt="2090-03-08T02:30:00"), format="json")
    assert resp.status_code == 400
    assert "offset" in resp.json()["errors"]["startAt"][0]


def test_a_target_off_the_allowlist_is_a_400_on_target(api):
    resp = api.post("/api/v1/schedules", {"expression": "* * * * *", "timeZone": "UTC",
                                          "target": {"url": "https://elsewhere.example/x"}}, format="json")
    assert resp.status_code == 400
    assert "allowlist" in resp.json()["errors"]["target"][0]


def test_read_returns_the_schedule(api, schedule):
    body = api.get(f"/api/v1/schedules/{schedule.id}").json()
    assert body["id"] == str(schedule.id) and body["expression"] == "0 * * * *"


def test_list_is_newest_first_and_pages_with_a_cursor(api, tenant, target):
    ids = [api.post("/api/v1/schedules", schedule_body(target, name=f"s{i}"), format="json").json()["id"]
           for i in range(5)]
    seen, cursor = [], None
    while True:
        resp = api.get("/api/v1/schedules", {"limit": 2, **({"cursor": cursor} if cursor else {})})
        assert resp.status_code == 200
        page = resp.json()
        assert len(page["results"]) <= 2
        seen += [s["id"] for s in page["results"]]
        cursor = page["next"]
        if cursor is None:
            break
    assert seen == list(reversed(ids))


def test_list_filters_on_enabled_and_leaves_archived_out_unless_asked(api, target):
    running = api.post("/api/v1/schedules", schedule_body(target), format="json").json()
    paused = api.post("/api/v1/schedules", schedule_body(target, enabled=False), format="json").json()
    gone = api.post("/api/v1/schedules", schedule_body(target), format="json").json()
    assert api.delete(f"/api/v1/schedules/{gone['id']}").status_code == 204

    def ids(**params):
        return {s["id"] for s in api.get("/api/v1/schedules", params).json()["results"]}

    assert ids() == {running["id"], paused["id"]}
    assert ids(enabled="true") == {running["id"]}
    assert ids(enabled="false") == {paused["id"]}
    assert ids(status="archived") == {gone["id"]}
    assert ids(status="active,archived") == {running["id"], paused["id"], gone["id"]}
    assert api.get("/api/v1/schedules", {"enabled": "maybe"}).status_code == 400
    assert api.get("/api/v1/schedules", {"status": "deleted"}).status_code == 400


def test_edit_with_the_current_version_makes_the_next_version(api, schedule):
    resp = api.patch(f"/api/v1/schedules/{schedule.id}",
                     {"expectedVersion": 1, "expression": "30 2 * * *", "target": {"method": "PUT"}}, format="json")
    assert resp.status_code == 200, resp.content
    body = resp.json()
    assert body["version"] == 2 and body["expression"] == "30 2 * * *"
    # A partial target keeps the url it had.
    assert body["target"]["method"] == "PUT" and body["target"]["url"].endswith("/hook")


def test_a_stale_edit_is_a_409_with_the_current_version(api, schedule):
    api.patch(f"/api/v1/schedules/{schedule.id}", {"expectedVersion": 1, "name": "a"}, format="json")
    resp = api.patch(f"/api/v1/schedules/{schedule.id}", {"expectedVersion": 1, "name": "b"}, format="json")
    assert resp.status_code == 409
    assert resp.json()["currentVersion"] == 2 and "stale" in resp.json()["error"]


def test_an_edit_without_expected_version_is_a_400(api, schedule):
    resp = api.patch(f"/api/v1/schedules/{schedule.id}", {"name": "x"}, format="json")
    assert resp.status_code == 400 and "expectedVersion" in resp.json()["errors"]


def test_enabled_false_pauses_and_true_resumes(api, schedule):
    paused = api.patch(f"/api/v1/schedules/{schedule.id}", {"expectedVersion": 1, "enabled": False}, format="json")
    assert paused.status_code == 200 and paused.json()["enabled"] is False and paused.json()["nextRunAt"] is None
    assert paused.json()["pausedAt"].endswith("Z")
    resumed = api.patch(f"/api/v1/schedules/{schedule.id}", {"expectedVersion": 1, "enabled": True}, format="json")
    assert resumed.json()["enabled"] is True and resumed.json()["nextRunAt"].endswith("Z")


def test_delete_archives_keeps_the_schedule_readable_and_is_repeatable(api, schedule):
    assert api.delete(f"/api/v1/schedules/{schedule.id}").status_code == 204
    body = api.get(f"/api/v1/schedules/{schedule.id}").json()
    assert body["status"] == "archived" and body["nextRunAt"] is None and body["archivedAt"].endswith("Z")
    assert api.delete(f"/api/v1/schedules/{schedule.id}").status_code == 204
    # An archived schedule cannot be edited or triggered: 409, saying why.
    resp = api.post(f"/api/v1/schedules/{schedule.id}/trigger")
    assert resp.status_code == 409 and resp.json()["status"] == "archived"
    assert api.get(f"/api/v1/schedules/{schedule.id}/occurrences").json() == {"occurrences": []}


def test_trigger_makes_a_manual_run_now(api, schedule):
    resp = api.post(f"/api/v1/schedules/{schedule.id}/trigger")
    assert resp.status_code == 201
    body = resp.json()
    assert body["kind"] == "manual" and body["state"] == "ready" and body["scheduleId"] == str(schedule.id)
    assert body["idempotencyKey"] == body["id"] and UTC_Z.match(body["scheduledTime"])
    assert Run.objects.filter(id=body["id"], schedule=schedule).exists()


def test_trigger_accepts_an_empty_object_but_not_fields(api, schedule):
    assert api.post(f"/api/v1/schedules/{schedule.id}/trigger", {}, format="json").status_code == 201
    resp = api.post(f"/api/v1/schedules/{schedule.id}/trigger", {"now": True}, format="json")
    assert resp.status_code == 400 and "body" in resp.json()["errors"]


def test_backfill_answers_202_with_the_count_and_never_doubles_an_instant(api, schedule):
    from datetime import timedelta

    from scheduler_project.foundation.dbclock import db_now

    end = db_now().replace(minute=0, second=0, microsecond=0)
    body = {"from": (end - timedelta(hours=3)).isoformat(), "to": end.isoformat()}
    resp = api.post(f"/api/v1/schedules/{schedule.id}/backfill", body, format="json")
    assert resp.status_code == 202 and resp.json() == {"runs": 3}
    again = api.post(f"/api/v1/schedules/{schedule.id}/backfill", body, format="json")
    assert again.json() == {"runs": 0}
    bad = api.post(f"/api/v1/schedules/{schedule.id}/backfill", {"from": body["to"], "to": body["from"]},
                   format="json")
    assert bad.status_code == 400 and "to" in bad.json()["errors"]


def test_occurrences_preview_stores_nothing(api, schedule):
    before = Run.objects.count()
    resp = api.get(f"/api/v1/schedules/{schedule.id}/occurrences", {"count": 3})
    assert resp.status_code == 200
    occs = resp.json()["occurrences"]
    assert len(occs) == 3 and all(UTC_Z.match(o["at"]) and o["at"].endswith(":00:00Z") for o in occs)
    assert occs[0]["at"] == Schedule.objects.get(id=schedule.id).next_run_at.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert Run.objects.count() == before
    assert api.get(f"/api/v1/schedules/{schedule.id}/occurrences", {"count": 0}).status_code == 400


def test_backfilled_runs_are_listed_for_their_schedule(api, schedule):
    assert hourly_runs(schedule, 2) == 2
    results = api.get("/api/v1/runs", {"schedule": str(schedule.id)}).json()["results"]
    assert [r["kind"] for r in results] == ["backfill", "backfill"]
