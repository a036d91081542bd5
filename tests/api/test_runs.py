"""Runs over HTTP: the list (filters, keyset pages, never counted), a run with its attempts, retry
and cancel with their 409s."""

from datetime import timedelta, timezone

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs import actions
from runs.models import Attempt, Run
from scheduler_project.foundation.dbclock import db_now
from tests.api.conftest import hourly_runs, manual_run
from tests.helpers import ACTOR, make_schedule

pytestmark = pytest.mark.django_db


def test_the_list_is_newest_scheduled_time_first_and_pages_without_counting(api, schedule):
    hourly_runs(schedule, 7)
    expected = list(Run.objects.filter(schedule=schedule).order_by("-scheduled_time", "-id")
                    .values_list("id", flat=True))
    seen, cursor = [], None
    with CaptureQueriesContext(connection) as ctx:
        while True:
            page = api.get("/api/v1/runs", {"limit": 3, **({"cursor": cursor} if cursor else {})}).json()
            seen += [r["id"] for r in page["results"]]
            cursor = page["next"]
            if not cursor:
                break
    assert seen == [str(i) for i in expected]
    assert not [q for q in ctx.captured_queries if "COUNT(" in q["sql"].upper()]


def test_the_last_page_has_no_next(api, schedule):
    hourly_runs(schedule, 2)
    page = api.get("/api/v1/runs", {"limit": 2}).json()
    assert len(page["results"]) == 2 and page["next"] is None


def test_filters_by_schedule_state_and_scheduled_time(api, tenant, target, schedule):
    hourly_runs(schedule, 4)
    other = make_schedule(tenant, target.url + "/hook", expression="0 * * * *")
    hourly_runs(other, 2)
    runs = list(Run.objects.filter(schedule=schedule).order_by("scheduled_time"))
    actions.cancel_run(runs[0], by=ACTOR)

    def ids(**params):
        return [r["id"] for r in api.get("/api/v1/runs", params).json()["results"]]

    assert set(ids(schedule=str(schedule.id))) == {str(r.id) for r in runs}
    assert ids(state="canceled") == [str(runs[0].id)]
    assert len(ids(state="ready,canceled")) == 6
    assert set(ids(schedule=str(schedule.id), state="ready")) == {str(r.id) for r in runs[1:]}
    frm, to = runs[1].scheduled_time, runs[3].scheduled_time
    window = ids(schedule=str(schedule.id), **{"from": frm.isoformat(), "to": to.isoformat()})
    assert window == [str(runs[2].id), str(runs[1].id)]  # from inclusive, to exclusive


def test_a_plus_offset_in_the_query_string_survives_url_decoding(api, schedule):
    hourly_runs(schedule, 2)
    start = (db_now() - timedelta(days=1)).astimezone(timezone(timedelta(hours=2))).isoformat()
    assert "+02:00" in start
    # An unencoded '+' arrives as a space; it is read back as the offset's sign.
    resp = api.get("/api/v1/runs?from=" + start)
    assert resp.status_code == 200 and len(resp.json()["results"]) == 2


def test_a_run_is_read_with_its_attempts(api, run):
    now = db_now()
    Attempt.objects.create(run=run, generation=1, worker_id="w-3", started_at=now - timedelta(seconds=1),
                           finished_at=now, outcome="failed", http_status=503, error="upstream down",
                           latency_ms=41)
    Run.objects.filter(id=run.id).update(generation=1, attempts_used=1)
    body = api.get(f"/api/v1/runs/{run.id}").json()
    assert body["id"] == str(run.id) and body["scheduledTime"].endswith("Z")
    (attempt,) = body["attempts"]
    assert attempt == {**attempt, "generation": 1, "workerId": "w-3", "outcome": "failed", "httpStatus": 503,
                       "error": "upstream down", "latencyMs": 41}
    assert attempt["startedAt"].endswith("Z") and attempt["finishedAt"].endswith("Z")
    listed = api.get("/api/v1/runs").json()["results"]
    assert listed[0]["attempts"] == body["attempts"]


def test_cancel_a_ready_run_then_409_when_terminal(api, run):
    resp = api.post(f"/api/v1/runs/{run.id}/cancel")
    assert resp.status_code == 200
    assert resp.json()["state"] == "canceled" and resp.json()["reason"] == "canceled"
    again = api.post(f"/api/v1/runs/{run.id}/cancel")
    assert again.status_code == 409 and again.json()["state"] == "canceled"


def test_retry_a_canceled_run_then_409_when_ready(api, run):
    actions.cancel_run(run, by=ACTOR)
    resp = api.post(f"/api/v1/runs/{run.id}/retry")
    assert resp.status_code == 200
    body = resp.json()
    assert body["state"] == "ready" and body["id"] == str(run.id) and body["retriedBy"].startswith("key:")
    again = api.post(f"/api/v1/runs/{run.id}/retry")
    assert again.status_code == 409 and again.json()["state"] == "ready"


def test_actions_take_no_body(api, run):
    resp = api.post(f"/api/v1/runs/{run.id}/cancel", {"reason": "because"}, format="json")
    assert resp.status_code == 400
    assert Run.objects.get(id=run.id).state == "ready"


def test_a_manual_run_and_a_scheduled_one_list_together(api, schedule):
    hourly_runs(schedule, 1)
    manual = manual_run(schedule)
    kinds = {r["id"]: r["kind"] for r in api.get("/api/v1/runs").json()["results"]}
    assert kinds[str(manual.id)] == "manual" and sorted(kinds.values()) == ["backfill", "manual"]
