"""API create -> scan -> work -> local target -> run succeeded, attempt recorded."""

import json
import uuid

import pytest

from dispatch import signing
from dispatch.loops import drain, scan_step
from dispatch.worker import run_worker
from runs.models import Attempt, OutboxEvent, Run
from schedules.models import Schedule
from tests.helpers import make_due

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_created_schedule_runs_and_its_target_receives_the_payload(api, tenant, target):
    resp = api.post(
        "/api/v1/schedules",
        {
            "name": "nightly-report",
            "expression": "rate(1 minute)",
            "timeZone": "UTC",
            "payload": {"report": "daily"},
            "target": {"url": target.url + "/hooks/run", "headers": {"X-Team": "bi"}},
        },
        format="json",
    )
    assert resp.status_code == 201, resp.content
    body = resp.json()
    assert body["version"] == 1 and body["nextRunAt"].endswith("Z")
    assert body["misfirePolicy"] == "run_once" and body["retryPolicy"]["maxAttempts"] == 5
    schedule = Schedule.objects.get(id=body["id"])

    make_due(schedule)
    drain(scan_step)
    run = Run.objects.get(schedule=schedule)
    assert run.state == "ready"

    stats = run_worker("w-test", once=True, poll_seconds=0)
    assert stats["applied"] == 1

    run.refresh_from_db()
    assert run.state == "succeeded" and run.generation == 1 and run.finished_at
    (delivery,) = target.deliveries
    assert delivery["path"] == "/hooks/run"
    assert json.loads(delivery["body"]) == {"report": "daily"}
    headers = delivery["headers"]
    assert headers["Idempotency-Key"] == str(run.id)
    assert headers["X-Scheduler-Generation"] == "1"
    assert headers["X-Team"] == "bi"
    assert headers["X-Scheduler-Scheduled-Time"].endswith("Z")
    assert signing.verify(tenant.signing_secret, headers["X-Scheduler-Signature"], delivery["body"])
    assert not signing.verify("wrong-secret", headers["X-Scheduler-Signature"], delivery["body"])

    (attempt,) = Attempt.objects.filter(run=run)
    assert attempt.outcome == "succeeded" and attempt.http_status == 200 and attempt.latency_ms is not None
    assert attempt.response_excerpt == '{"ok": true}'
    kinds = list(OutboxEvent.objects.filter(run=run).order_by("id").values_list("kind", flat=True))
    assert kinds == ["run.created", "run.leased", "run.succeeded"]

    got = api.get(f"/api/v1/runs/{run.id}").json()
    assert got["state"] == "succeeded" and got["idempotencyKey"] == str(run.id)
    assert got["attempts"][0]["httpStatus"] == 200 and got["attempts"][0]["workerId"] == "w-test"


def test_another_tenants_objects_answer_404(api, other_api, target):
    created = api.post(
        "/api/v1/schedules",
        {"expression": "*/5 * * * *", "timeZone": "Europe/Paris", "target": {"url": target.url + "/x"}},
        format="json",
    ).json()
    assert other_api.get(f"/api/v1/schedules/{created['id']}").status_code == 404
    assert other_api.patch(f"/api/v1/schedules/{created['id']}", {"expectedVersion": 1, "name": "x"},
                           format="json").status_code == 404
    assert other_api.get(f"/api/v1/runs/{uuid.uuid4()}").status_code == 404
    assert api.get("/api/v1/schedules/not-a-uuid").status_code == 404
    assert api.get("/api/v1/schedules/not-a-uuid").json() == {"error": "not found"}


def test_no_key_or_a_bad_key_is_401(api, target):
    from rest_framework.test import APIClient

    anon = APIClient()
    r = anon.get(f"/api/v1/schedules/{uuid.uuid4()}")
    assert r.status_code == 401 and "error" in r.json()
    anon.credentials(HTTP_AUTHORIZATION="Bearer sk_nope")
    assert anon.get(f"/api/v1/schedules/{uuid.uuid4()}").status_code == 401


def test_a_nul_byte_in_the_answer_is_kept_readable_and_does_not_block_the_batch(api, tenant, target):
    """PostgreSQL text cannot hold NUL; an answer with one must still be recorded, and the other
    results in the same batch with it."""
    target.responder = lambda d: (500, b'bad\x00answer') if d["path"] == "/nul" else (200, b"ok")
    runs = []
    for path in ("/nul", "/fine"):
        body = api.post("/api/v1/schedules", {"expression": "rate(1 minute)", "timeZone": "UTC",
                                               "retryPolicy": {"maxAttempts": 1},
                                               "target": {"url": target.url + path}}, format="json").json()
        make_due(Schedule.objects.get(id=body["id"]))
    drain(scan_step)
    stats = run_worker("w-nul", once=True, poll_seconds=0)
    assert stats["applied"] == 2
    nul = Run.objects.get(schedule__versions__target_url=target.url + "/nul")
    fine = Run.objects.get(schedule__versions__target_url=target.url + "/fine")
    assert (nul.state, fine.state) == ("dead", "succeeded")
    attempt = Attempt.objects.get(run=nul)
    assert attempt.response_excerpt == "bad\ufffdanswer" and attempt.http_status == 500
    event = OutboxEvent.objects.get(run=nul, kind="run.dead")
    assert event.payload == {"runId": str(nul.id), "generation": 1, "state": "dead", "nextEligibleAt": None,
                             "outcome": "failed", "httpStatus": 500, "errorClass": "HTTPStatus",
                             "error": "HTTP 500", "latencyMs": attempt.latency_ms}
    assert nul.last_error == "HTTP 500"
