"""Cancellation of ready and leased runs, and graceful worker shutdown."""

import asyncio
import threading

import pytest

from dispatch.loops import drain, scan_step
from dispatch.worker import Worker, run_worker
from runs import queue
from runs.models import Attempt, OutboxEvent, Run
from tests.helpers import make_due, make_schedule

pytestmark = pytest.mark.django_db(transaction=True)


def ready_runs(tenant, target, n=1):
    runs = []
    for i in range(n):
        s = make_schedule(tenant, target.url + f"/job{i}")
        make_due(s)
    drain(scan_step)
    runs = list(Run.objects.filter(state="ready"))
    assert len(runs) == n
    return runs


def test_cancel_of_a_ready_run_makes_it_canceled_and_the_worker_never_calls(tenant, target, api):
    (run,) = ready_runs(tenant, target)
    r = api.post(f"/api/v1/runs/{run.id}/cancel")
    assert r.status_code == 200 and r.json()["state"] == "canceled" and r.json()["reason"] == "canceled"
    run_worker("w", once=True, poll_seconds=0)
    assert target.deliveries == []
    again = api.post(f"/api/v1/runs/{run.id}/cancel")
    assert again.status_code == 409 and again.json()["state"] == "canceled"


def test_cancel_of_a_leased_run_reaches_the_worker_at_its_heartbeat_and_fences_its_result(tenant, target, api):
    (run,) = ready_runs(tenant, target)
    target.delay = 4.0
    stats = {}
    t = threading.Thread(target=lambda: stats.update(run_worker("w-busy", once=True, lease_seconds=3, poll_seconds=0,
                                                                grace_seconds=0)))
    t.start()
    for _ in range(100):
        if target.deliveries:
            break
        threading.Event().wait(0.05)
    assert target.deliveries, "the call should be in flight"
    r = api.post(f"/api/v1/runs/{run.id}/cancel")
    assert r.status_code == 200 and r.json()["state"] == "canceled"
    t.join(10)
    assert stats["abandoned"] == 1 and stats["applied"] == 0
    run.refresh_from_db()
    assert run.state == "canceled" and run.lease_owner == "" and run.lease_until is None
    attempt = Attempt.objects.get(run=run)
    assert attempt.canceled_in_flight and attempt.outcome == "abandoned"
    assert "in flight" in attempt.error
    ev = OutboxEvent.objects.get(run=run, kind="run.canceled")
    assert ev.payload["inFlight"] is True


def test_a_result_arriving_after_cancel_is_kept_as_late_evidence_only(tenant, target, actor):
    from runs.actions import cancel_run

    (run,) = ready_runs(tenant, target)
    (claimed,) = queue.claim("w", 1)
    cancel_run(run, by=actor)
    applied, fenced = queue.complete([queue.Result(claimed=claimed, outcome="succeeded", http_status=200)])
    assert (applied, fenced) == (0, 1)
    run.refresh_from_db()
    assert run.state == "canceled"
    attempt = Attempt.objects.get(run=run)
    assert attempt.outcome == "abandoned" and attempt.late_result["httpStatus"] == 200


def test_shutdown_gives_back_claimed_but_unstarted_runs_without_using_an_attempt(tenant, target):
    runs = ready_runs(tenant, target, n=3)

    async def scenario():
        # 16 slots: the three runs (one tenant, one host) are within the default target share.
        w = Worker("w-stop", concurrency=16, poll_seconds=0, grace_seconds=0)
        w._slot = asyncio.Event()
        from dispatch.safehttp import client_from_settings

        w.client = client_from_settings()
        claims = await w.db(w._claim, 10, lane="claim")
        for c in claims:
            w._spawn(c)  # tasks exist but have not run: nothing was sent yet
        await w._shutdown()
        await w.client.close()
        w.close_db()
        return w.stats

    stats = asyncio.run(scenario())
    assert stats["released"] == 3
    assert target.deliveries == []
    for run in runs:
        run.refresh_from_db()
        assert run.state == "ready" and run.generation == 1 and run.attempts_used == 0
        (attempt,) = Attempt.objects.filter(run=run)
        assert attempt.outcome == "abandoned"
    # They run normally afterwards, as generation 2 with the full retry budget.
    run_worker("w-next", once=True, poll_seconds=0)
    assert Run.objects.filter(state="succeeded", generation=2).count() == 3


def test_shutdown_leaves_a_call_still_running_after_the_grace_period_to_lease_expiry(tenant, target):
    (run,) = ready_runs(tenant, target)
    target.delay = 3.0
    stop = threading.Event()
    t = threading.Thread(target=run_worker, args=("w-term",), kwargs={"stop": stop, "poll_seconds": 0.05,
                                                                      "grace_seconds": 0.2})
    t.start()
    for _ in range(100):
        if target.deliveries:
            break
        threading.Event().wait(0.05)
    stop.set()
    t.join(10)
    assert not t.is_alive()
    run.refresh_from_db()
    # Still leased: the target may act on it, so only lease expiry may decide (as unknown).
    assert run.state == "leased"
    assert Attempt.objects.get(run=run).outcome is None
