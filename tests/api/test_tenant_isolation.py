"""Every endpoint is scoped to the caller's tenant: another tenant's ids answer 404 (never 403, so
ids cannot be probed), lists never include another tenant's objects, filters cannot reach across,
and nothing of theirs changes."""

import pytest

from runs.models import Run
from schedules.models import ApiKey, AuditEntry, Schedule
from tests.api.conftest import hourly_runs

pytestmark = pytest.mark.django_db


def test_every_endpoint_with_an_id_answers_404_for_another_tenants_object(
    api, other_api, other_schedule, other_run, other_tenant
):
    other_key = ApiKey.objects.filter(tenant=other_tenant).first()
    s, r, k = other_schedule.id, other_run.id, other_key.id
    calls = [
        ("get", f"/api/v1/schedules/{s}", None),
        ("patch", f"/api/v1/schedules/{s}", {"expectedVersion": 1, "name": "mine now"}),
        ("delete", f"/api/v1/schedules/{s}", None),
        ("post", f"/api/v1/schedules/{s}/trigger", None),
        ("post", f"/api/v1/schedules/{s}/backfill", {"from": "2026-01-01T00:00:00Z", "to": "2026-01-02T00:00:00Z"}),
        ("get", f"/api/v1/schedules/{s}/occurrences", None),
        ("get", f"/api/v1/runs/{r}", None),
        ("post", f"/api/v1/runs/{r}/retry", None),
        ("post", f"/api/v1/runs/{r}/cancel", None),
        ("get", f"/api/v1/keys/{k}", None),
        ("post", f"/api/v1/keys/{k}/revoke", None),
    ]
    for method, path, body in calls:
        resp = getattr(api, method)(path, body, format="json") if body else getattr(api, method)(path)
        assert resp.status_code == 404, (method, path, resp.status_code)
        assert resp.json() == {"error": "not found"}
    # ... and nothing of theirs moved.
    other_schedule.refresh_from_db()
    other_run.refresh_from_db()
    assert other_schedule.version == 1 and other_schedule.status == "active"
    assert other_run.state == "ready"
    assert Run.objects.filter(schedule=other_schedule).count() == 1
    assert ApiKey.objects.get(id=k).revoked_at is None


def test_an_idempotency_key_cannot_replay_another_tenants_response(api, other_api, target):
    body = {"expression": "*/5 * * * *", "timeZone": "UTC", "target": {"url": target.url + "/hook"}}
    mine = api.post("/api/v1/schedules", body, format="json", HTTP_IDEMPOTENCY_KEY="same-key")
    theirs = other_api.post("/api/v1/schedules", body, format="json", HTTP_IDEMPOTENCY_KEY="same-key")
    assert mine.status_code == theirs.status_code == 201
    assert mine.json()["id"] != theirs.json()["id"]
    assert Schedule.objects.get(id=theirs.json()["id"]).tenant.slug == "globex"


def test_lists_never_include_another_tenants_objects(api, other_api, schedule, other_schedule, tenant):
    hourly_runs(schedule, 2)
    hourly_runs(other_schedule, 3)
    other_api.post("/api/v1/keys", {"label": "theirs"}, format="json")

    def ids(path, **params):
        return {o["id"] for o in api.get(path, params).json()["results"]}

    assert ids("/api/v1/schedules") == {str(schedule.id)}
    assert ids("/api/v1/schedules", status="active,completed,archived") == {str(schedule.id)}
    assert ids("/api/v1/runs") == {str(r) for r in Run.objects.filter(schedule=schedule).values_list("id", flat=True)}
    assert ids("/api/v1/keys") == {str(k) for k in ApiKey.objects.filter(tenant=tenant).values_list("id", flat=True)}
    audit = api.get("/api/v1/audit", {"limit": 200}).json()["results"]
    assert audit and {e["id"] for e in audit} <= set(AuditEntry.objects.filter(tenant=tenant).values_list("id", flat=True))


def test_filtering_by_another_tenants_schedule_finds_nothing(api, other_schedule):
    hourly_runs(other_schedule, 2)
    resp = api.get("/api/v1/runs", {"schedule": str(other_schedule.id)})
    assert resp.status_code == 200 and resp.json() == {"results": [], "next": None}
    audit = api.get("/api/v1/audit", {"objectId": str(other_schedule.id)}).json()
    assert audit["results"] == []
