"""Fencing, lease expiry, retries and the dead-letter queue, through the real loops."""

import pytest

from dispatch.loops import drain, reconcile_step, scan_step
from dispatch.worker import run_worker
from runs import queue
from runs.actions import retry_run
from runs.models import Attempt, Run
from tests.helpers import ACTOR, expire_lease, make_due, make_schedule

pytestmark = pytest.mark.django_db(transaction=True)

FAST_RETRY = {"backoff_base_seconds": 0.001, "backoff_max_seconds": 0.001}


def one_ready_run(tenant, target, **fields) -> Run:
    s = make_schedule(tenant, target.url + "/job", **fields)
    make_due(s)
    drain(scan_step)
    return Run.objects.get(schedule=s)


def result_for(claimed, status=200):
    return queue.Result(claimed=claimed, outcome="succeeded" if status < 300 else "failed",
                        retryable=status >= 500, http_status=status, latency_ms=3)


def test_a_stale_workers_late_completion_is_fenced_and_kept_as_evidence(tenant, target):
    run = one_ready_run(tenant, target)
    (stale,) = queue.claim("w-stale", 10)
    expire_lease(run.id)
    assert reconcile_step() is False
    run.refresh_from_db()
    assert run.state == "ready" and run.lease_owner == ""
    Run.objects.filter(id=run.id).update(next_eligible_at=run.scheduled_time)  # skip the backoff wait
    (fresh,) = queue.claim("w-fresh", 10)
    assert fresh.generation == stale.generation + 1

    applied, fenced = queue.complete([result_for(stale, 500)])
    assert (applied, fenced) == (0, 1)
    run.refresh_from_db()
    assert run.state == "leased" and run.generation == 2 and run.lease_owner == "w-fresh"
    first = Attempt.objects.get(run=run, generation=1)
    assert first.outcome == "unknown"  # what the reconciler decided stays
    assert first.late_result["httpStatus"] == 500 and first.late_result["outcome"] == "failed"

    assert queue.complete([result_for(fresh)]) == (1, 0)
    run.refresh_from_db()
    assert run.state == "succeeded"


def test_an_expired_lease_is_retried_with_the_same_idempotency_key_and_the_next_generation(tenant, target):
    run = one_ready_run(tenant, target, **FAST_RETRY)
    target.delay = 3.0  # the first call outlives its lease
    import threading

    slow_stats = {}

    def slow():
        slow_stats.update(run_worker("w-slow", once=True, lease_seconds=1, poll_seconds=0, grace_seconds=0))

    t = threading.Thread(target=slow)
    t.start()
    # Wait until the target has the first delivery, then let the lease lapse and reconcile.
    for _ in range(100):
        if target.deliveries:
            break
        threading.Event().wait(0.05)
    expire_lease(run.id)
    drain(reconcile_step)
    first = Attempt.objects.get(run=run, generation=1)
    assert first.outcome == "unknown" and first.error_class == "LeaseExpired"
    target.delay = 0
    t.join(10)
    Run.objects.filter(id=run.id, state="ready").update(next_eligible_at=run.scheduled_time)
    run_worker("w-next", once=True, poll_seconds=0)
    run.refresh_from_db()
    assert run.state == "succeeded" and run.generation == 2
    keys = [d["headers"]["Idempotency-Key"] for d in target.deliveries]
    gens = [d["headers"]["X-Scheduler-Generation"] for d in target.deliveries]
    assert keys == [str(run.id), str(run.id)] and gens == ["1", "2"]
    # The slow worker's next heartbeat found its lease gone and abandoned the call: its answer
    # never counted, and the reconciler's verdict on attempt 1 stands.
    # (The same worker may well have claimed generation 2 itself: any worker may.)
    assert slow_stats["abandoned"] == 1
    first.refresh_from_db()
    assert first.outcome == "unknown"


def test_backoff_stays_within_its_full_jitter_bounds():
    for attempt in range(1, 12):
        ceiling = min(300, 1 * 2 ** (attempt - 1))
        samples = [queue.backoff_seconds(attempt, 1, 300) for _ in range(300)]
        assert all(0 <= s <= ceiling for s in samples)
        assert max(samples) > ceiling * 0.5  # really jittered across the range, not a constant


def test_a_retryable_failure_waits_within_the_backoff_window(tenant, target):
    # base 1,000 s: a pass cannot come back to the run unless the jitter drew under ~0.1 s (1e-4).
    run = one_ready_run(tenant, target, backoff_base_seconds=1000, backoff_max_seconds=6000)
    target.status = 503
    run_worker("w", once=True, poll_seconds=0)
    run.refresh_from_db()
    assert run.state == "ready" and run.attempts_used == 1
    attempt = Attempt.objects.get(run=run)
    delay = (run.next_eligible_at - attempt.finished_at).total_seconds()
    assert 0 <= delay <= 1000.01


def test_runs_go_dead_after_max_attempts_with_every_attempts_evidence_and_retry_keeps_the_id(tenant, target, api):
    run = one_ready_run(tenant, target, max_attempts=3, **FAST_RETRY)
    target.status = 500
    target.body = b"upstream exploded"
    for _ in range(3):
        Run.objects.filter(id=run.id, state="ready").update(next_eligible_at=run.scheduled_time)
        run_worker("w-dlq", once=True, poll_seconds=0)
    run.refresh_from_db()
    assert run.state == "dead" and run.generation == 3 and run.finished_at
    attempts = list(Attempt.objects.filter(run=run).order_by("generation"))
    assert [a.generation for a in attempts] == [1, 2, 3]
    for a in attempts:
        assert a.outcome == "failed" and a.http_status == 500 and a.worker_id == "w-dlq"
        assert a.response_excerpt == "upstream exploded" and a.latency_ms is not None and a.finished_at

    # Retry through the API: same run id, the next generation, then success.
    target.status = 200
    resp = api.post(f"/api/v1/runs/{run.id}/retry")
    assert resp.status_code == 200 and resp.json()["state"] == "ready" and resp.json()["id"] == str(run.id)
    assert resp.json()["retriedBy"].startswith("key:")
    run_worker("w-dlq", once=True, poll_seconds=0)
    run.refresh_from_db()
    assert run.state == "succeeded" and run.generation == 4
    assert target.deliveries[-1]["headers"]["Idempotency-Key"] == str(run.id)
    # Retrying a succeeded run is a conflict that names the state.
    again = api.post(f"/api/v1/runs/{run.id}/retry")
    assert again.status_code == 409 and again.json()["state"] == "succeeded"


def test_a_permanent_failure_goes_straight_to_dead(tenant, target):
    run = one_ready_run(tenant, target)
    target.status = 404
    run_worker("w", once=True, poll_seconds=0)
    run.refresh_from_db()
    assert run.state == "dead" and run.attempts_used == 1


def test_manual_retry_from_canceled_records_who(tenant, target):
    from runs.actions import cancel_run

    run = one_ready_run(tenant, target)
    cancel_run(run, by=ACTOR)
    retried = retry_run(run, by=ACTOR)
    assert retried.state == "ready" and retried.retried_by == "user:tests" and retried.retried_at


def test_a_heartbeat_extends_only_the_leases_its_worker_still_holds(tenant, target):
    kept, lost_gen, other = (one_ready_run(tenant, target) for _ in range(3))
    claims = {c.run_id: c for c in queue.claim("w-beat", 10)}
    assert set(claims) == {kept.id, lost_gen.id, other.id}
    Run.objects.filter(id__in=claims).update(lease_until="2000-01-01T00:00:00Z")
    # lost_gen was re-leased at a later generation; other is held by another worker now.
    Run.objects.filter(id=lost_gen.id).update(generation=claims[lost_gen.id].generation + 1)
    Run.objects.filter(id=other.id).update(lease_owner="w-other")

    lost = queue.heartbeat("w-beat", [(c.run_id, c.generation) for c in claims.values()], lease_seconds=60)

    assert lost == {(lost_gen.id, claims[lost_gen.id].generation), (other.id, claims[other.id].generation)}
    leases = dict(Run.objects.filter(id__in=claims).values_list("id", "lease_until"))
    assert leases[kept.id].year > 2000  # extended from the database clock
    assert leases[lost_gen.id].year == leases[other.id].year == 2000  # neither touched


def test_a_stored_huge_backoff_cannot_stop_a_batch_of_results_from_being_recorded(tenant, other_tenant, target):
    # A version saved before the policy bounds existed: its backoff would put the retry past the
    # end of the calendar, and the database refused the whole batch's completion (every tenant's
    # results in it) again and again.
    from schedules.models import ScheduleVersion
    from schedules.services import MAX_POLICY_SECONDS

    huge = one_ready_run(tenant, target)
    ScheduleVersion.objects.filter(id=huge.version_id).update(backoff_base_seconds=1e308, backoff_max_seconds=1e308)
    other = one_ready_run(other_tenant, target)
    target.status = 503
    run_worker("w", once=True, poll_seconds=0)
    huge.refresh_from_db()
    other.refresh_from_db()
    assert huge.state == "ready" and huge.attempts_used == 1
    assert other.state == "ready" and other.attempts_used == 1
    finished = Attempt.objects.get(run=huge).finished_at
    assert 0 <= (huge.next_eligible_at - finished).total_seconds() <= MAX_POLICY_SECONDS + 1
    assert all(queue.backoff_seconds(n, 1e308, 1e308) <= MAX_POLICY_SECONDS for n in (1, 2, 50, 10**6))
