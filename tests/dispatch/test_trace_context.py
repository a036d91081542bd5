"""W3C trace context on target calls: every call carries a valid traceparent, the run's trace id
on each of its attempts and a new span id per attempt; the API's attempt and the portal's run page
show the same ids; a schedule's tracestate is passed through, and its own traceparent refused."""

import re
import time

import pytest

from dispatch.worker import run_worker
from runs.models import Attempt, Run, RunState
from scheduler_project.web.access import ROLE_OPERATOR
from tests.core.test_fencing_and_leases import FAST_RETRY, one_ready_run
from tests.portal.conftest import login, staff_user

pytestmark = pytest.mark.django_db(transaction=True)
# version 00: 32 and 16 lower-case hex digits, neither all zeros, then the flags.
TRACEPARENT = re.compile(r"^00-(?!0{32})([0-9a-f]{32})-(?!0{16})([0-9a-f]{16})-([0-9a-f]{2})$")


def work_until_finished(run, tries=50):
    for _ in range(tries):
        run_worker("w-trace", once=True, poll_seconds=0)
        run.refresh_from_db()
        if run.state in (RunState.SUCCEEDED, RunState.DEAD):
            return
        time.sleep(0.02)  # the retry's backoff (FAST_RETRY)
    raise AssertionError(f"the run is still {run.state}")


def test_every_attempt_carries_the_runs_trace_and_its_own_span(tenant, target, api):
    statuses = iter([503, 500, 200])
    target.responder = lambda delivery: (next(statuses), b"{}")
    run = one_ready_run(tenant, target, max_attempts=3,
                        target_headers={"tracestate": "vendor=abc"}, **FAST_RETRY)
    work_until_finished(run)
    assert run.state == RunState.SUCCEEDED and len(target.deliveries) == 3
    parents = [d["headers"]["traceparent"] for d in target.deliveries]
    matches = [TRACEPARENT.match(p) for p in parents]
    assert all(matches), parents
    assert {m.group(1) for m in matches} == {run.id.hex}  # one trace per run
    spans = [m.group(2) for m in matches]
    assert len(set(spans)) == 3  # one span per attempt
    assert [d["headers"]["tracestate"] for d in target.deliveries] == ["vendor=abc"] * 3

    attempts = list(Attempt.objects.filter(run=run).order_by("generation"))
    assert [a.traceparent for a in attempts] == parents  # what was sent is what is shown
    body = api.get(f"/api/v1/runs/{run.id}").json()
    assert [(a["traceparent"], a["traceId"], a["spanId"]) for a in body["attempts"]] == [
        (p, run.id.hex, s) for p, s in zip(parents, spans)]
    page = login(staff_user("olga", ROLE_OPERATOR)).get(f"/runs/{run.id}/").content.decode()
    for p in parents:
        assert p in page


def test_a_schedule_cannot_set_its_own_traceparent(api, target):
    body = {"expression": "*/5 * * * *", "timeZone": "UTC",
            "target": {"url": target.url + "/hook", "headers": {"Traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}}}
    resp = api.post("/api/v1/schedules", body, format="json")
    assert resp.status_code == 400
    assert "set by the scheduler" in resp.json()["errors"]["target"][0]


def test_a_run_never_retried_has_one_span(tenant, target):
    run = one_ready_run(tenant, target, max_attempts=1)
    work_until_finished(run)
    (delivery,) = target.deliveries
    (attempt,) = Attempt.objects.filter(run=run)
    assert delivery["headers"]["traceparent"] == f"00-{run.id.hex}-{attempt.id:016x}-01"
    assert Run.objects.get(id=run.id).state == RunState.SUCCEEDED
