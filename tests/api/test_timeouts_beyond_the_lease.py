"""A target call's time limit is not tied to the lease: up to SCHEDULER_MAX_TIMEOUT_SECONDS (30
minutes), kept alive by the worker's heartbeats; a default the client never sent never makes a
create fail; a worker that loses its lease mid-call abandons the call."""

import threading
import time

import pytest

from dispatch.loops import drain, reconcile_step, scan_step
from dispatch.worker import run_worker
from runs.models import Attempt, Run
from tests.api.conftest import schedule_body
from tests.helpers import expire_lease, make_due, make_schedule


def test_a_create_without_timeout_seconds_succeeds_with_a_short_lease(api, target, settings):
    settings.SCHEDULER_LEASE_SECONDS = 10
    resp = api.post("/api/v1/schedules", schedule_body(target), format="json")
    assert resp.status_code == 201, resp.json()
    assert resp.json()["target"]["timeoutSeconds"] == settings.SCHEDULER_DEFAULT_TIMEOUT_SECONDS


def test_the_default_timeout_is_clamped_to_the_largest_allowed(api, target, settings):
    settings.SCHEDULER_MAX_TIMEOUT_SECONDS = 10
    resp = api.post("/api/v1/schedules", schedule_body(target), format="json")
    assert resp.status_code == 201, resp.json()
    assert resp.json()["target"]["timeoutSeconds"] == 10


def test_timeouts_up_to_thirty_minutes_are_accepted_and_longer_ones_refused_on_target(api, target):
    def body(seconds):
        return {**schedule_body(target), "target": {"url": target.url + "/hook", "timeoutSeconds": seconds}}

    ok = api.post("/api/v1/schedules", body(1800), format="json")
    assert ok.status_code == 201 and ok.json()["target"]["timeoutSeconds"] == 1800
    too_long = api.post("/api/v1/schedules", body(1801), format="json")
    assert too_long.status_code == 400
    assert "between 1 and 1800" in too_long.json()["errors"]["target"][0]


@pytest.fixture
def served_target():
    from tests.conftest import Target

    t = Target()
    yield t
    t.close()


def _due_run(tenant, target, **fields) -> Run:
    s = make_schedule(tenant, target.url + "/slow", **fields)
    make_due(s)
    drain(scan_step)
    return Run.objects.get(schedule=s)


@pytest.mark.django_db(transaction=True)
def test_a_call_longer_than_the_lease_succeeds_while_heartbeats_keep_the_lease(served_target, settings):
    from schedules.tenants import create_tenant

    settings.SCHEDULER_LEASE_SECONDS = 2

    tenant = create_tenant("longcalls", allow_targets=[served_target.url + "/"])
    run = _due_run(tenant, served_target, target_timeout_seconds=20)
    served_target.delay = 4.0  # twice the lease below
    stats = {}
    worker = threading.Thread(target=lambda: stats.update(
        run_worker("w-long", once=True, lease_seconds=2, poll_seconds=0, grace_seconds=0)))
    worker.start()
    deadline = time.monotonic() + 10
    while not served_target.deliveries and time.monotonic() < deadline:
        time.sleep(0.05)
    assert served_target.deliveries, "the worker never called the target"
    # Past the first lease's end the reconciler finds nothing to recover: the heartbeats kept it.
    time.sleep(2.5)
    drain(reconcile_step)
    during = Run.objects.get(id=run.id)
    assert during.state == "leased" and during.generation == 1
    worker.join(20)
    assert not worker.is_alive()
    run.refresh_from_db()
    assert run.state == "succeeded" and run.generation == 1
    (attempt,) = Attempt.objects.filter(run=run)
    assert attempt.outcome == "succeeded" and attempt.latency_ms >= 4000
    assert stats["abandoned"] == 0 and len(served_target.deliveries) == 1


@pytest.mark.django_db(transaction=True)
def test_a_worker_that_loses_its_lease_mid_call_abandons_the_call(served_target, settings):
    from schedules.tenants import create_tenant

    settings.SCHEDULER_LEASE_SECONDS = 3

    tenant = create_tenant("lostlease", allow_targets=[served_target.url + "/"])
    # A long backoff: the recovered run is not eligible again while this worker still runs.
    run = _due_run(tenant, served_target, target_timeout_seconds=60, backoff_base_seconds=1000,
                   backoff_max_seconds=1000)
    served_target.delay = 30.0
    stats = {}
    started = time.monotonic()
    worker = threading.Thread(target=lambda: stats.update(
        run_worker("w-lost", once=True, lease_seconds=3, poll_seconds=0, grace_seconds=0)))
    worker.start()
    deadline = time.monotonic() + 10
    while not served_target.deliveries and time.monotonic() < deadline:
        time.sleep(0.05)
    assert served_target.deliveries, "the worker never called the target"
    # The lease runs out (as if the worker's database had been away) and the reconciler recovers it.
    expire_lease(run.id)
    drain(reconcile_step)
    worker.join(15)
    assert not worker.is_alive(), "the worker kept waiting on a call whose lease it had lost"
    assert time.monotonic() - started < 15  # well before the target's 30 s answer
    assert stats["abandoned"] == 1
    (attempt,) = Attempt.objects.filter(run=run)
    assert attempt.outcome == "unknown" and attempt.error_class == "LeaseExpired"
    run.refresh_from_db()
    assert run.state == "ready" and run.generation == 1 and run.lease_owner == ""
