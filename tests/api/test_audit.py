"""Every change made through the API leaves an audit entry: who (the key's prefix), what, when,
from where, and before/after for a schedule edit; GET /api/v1/audit shows the tenant its own."""

from datetime import timedelta

import pytest

from runs import actions
from scheduler_project.foundation.dbclock import db_now
from schedules.models import ApiKey, AuditEntry
from tests.api.conftest import schedule_body
from tests.helpers import ACTOR

pytestmark = pytest.mark.django_db

FROM = {"REMOTE_ADDR": "203.0.113.9"}


def entries(**filters):
    return list(AuditEntry.objects.filter(**filters).order_by("id"))


def only(action, object_id):
    (entry,) = entries(action=action, object_id=str(object_id))
    return entry


def test_every_change_through_the_api_is_audited_with_key_and_address(api, tenant, target):
    me = f"key:{api.raw_key[:11]}"
    created = api.post("/api/v1/schedules", schedule_body(target), format="json", **FROM).json()
    sid = created["id"]
    api.patch(f"/api/v1/schedules/{sid}", {"expectedVersion": 1, "name": "renamed"}, format="json", **FROM)
    api.patch(f"/api/v1/schedules/{sid}", {"expectedVersion": 2, "enabled": False}, format="json", **FROM)
    api.patch(f"/api/v1/schedules/{sid}", {"expectedVersion": 2, "enabled": True}, format="json", **FROM)
    run = api.post(f"/api/v1/schedules/{sid}/trigger", **FROM).json()
    api.post(f"/api/v1/runs/{run['id']}/cancel", **FROM)
    api.post(f"/api/v1/runs/{run['id']}/retry", **FROM)
    end = db_now().replace(minute=0, second=0, microsecond=0)
    api.post(f"/api/v1/schedules/{sid}/backfill",
             {"from": (end - timedelta(hours=1)).isoformat(), "to": end.isoformat()}, format="json", **FROM)
    api.delete(f"/api/v1/schedules/{sid}", **FROM)
    key = api.post("/api/v1/keys", {"label": "k"}, format="json", **FROM).json()
    api.post(f"/api/v1/keys/{key['id']}/revoke", **FROM)

    expected = [
        ("schedule.create", sid), ("schedule.edit", sid), ("schedule.pause", sid), ("schedule.resume", sid),
        ("schedule.trigger", sid), ("run.cancel", run["id"]), ("run.retry", run["id"]),
        ("schedule.backfill", sid), ("schedule.archive", sid), ("apikey.create", key["id"]),
        ("apikey.revoke", key["id"]),
    ]
    mine = entries(actor=me)
    assert [(e.action, e.object_id) for e in mine] == expected
    assert all(e.remote_addr == "203.0.113.9" and e.tenant_id == tenant.id and e.at for e in mine)


def test_an_edit_records_the_whole_before_and_after(api, schedule):
    api.patch(f"/api/v1/schedules/{schedule.id}",
              {"expectedVersion": 1, "expression": "15 * * * *", "retryPolicy": {"maxAttempts": 2}}, format="json")
    edit = only("schedule.edit", schedule.id)
    assert edit.before["expression"] == "0 * * * *" and edit.after["expression"] == "15 * * * *"
    assert edit.before["max_attempts"] == 5 and edit.after["max_attempts"] == 2
    assert edit.before["target_url"] == edit.after["target_url"]


def test_reads_and_refused_requests_leave_no_entries(api, schedule):
    before = AuditEntry.objects.count()
    api.get(f"/api/v1/schedules/{schedule.id}")
    api.get("/api/v1/runs")
    api.patch(f"/api/v1/schedules/{schedule.id}", {"expectedVersion": 9, "name": "x"}, format="json")
    api.post("/api/v1/schedules", {"expression": "nope"}, format="json")
    assert AuditEntry.objects.count() == before


def test_the_audit_endpoint_lists_the_tenants_entries_newest_first(api, schedule, run):
    actions.cancel_run(run, by=ACTOR)
    api.post(f"/api/v1/runs/{run.id}/retry")
    page = api.get("/api/v1/audit", {"limit": 2}).json()
    first, second = page["results"]
    assert first["action"] == "run.retry" and first["actor"].startswith("key:")
    assert first["before"] == {"state": "canceled"} and first["after"] == {"state": "ready"}
    assert first["at"].endswith("Z") and first["objectId"] == str(run.id) and first["objectType"] == "run"
    assert second["action"] == "run.cancel" and second["actor"] == "user:tests"
    assert page["next"]
    rest = api.get("/api/v1/audit", {"cursor": page["next"], "limit": 200}).json()
    assert "schedule.trigger" in [e["action"] for e in rest["results"]]
    assert rest["next"] is None


def test_the_audit_endpoint_filters_by_object_and_action(api, schedule, run):
    by_object = api.get("/api/v1/audit", {"objectId": str(schedule.id)}).json()["results"]
    assert {e["action"] for e in by_object} == {"schedule.create", "schedule.trigger"}
    by_action = api.get("/api/v1/audit", {"action": "apikey.create"}).json()["results"]
    assert [e["objectId"] for e in by_action] == [str(ApiKey.objects.get(prefix=api.raw_key[:11]).id)]
