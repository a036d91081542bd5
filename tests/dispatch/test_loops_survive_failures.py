"""Every loop survives a failing step and a database connection terminated in the middle of a
step, and comes back to do its work; a loop that dies anyway takes its process down with it.

The failures are injected into the real steps (the queue and relay functions they call), against
the real database, with the loops running on their own threads through the one runner."""

import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.db import connection, connections

from dispatch import loops
from dispatch.loops import LoopThreads, Reconciler, Scanner, failure_backoff, run_loop
from dispatch.relay import Relay
from runs import queue
from runs.models import Attempt, OutboxEvent, Run
from runs.store import store
from scheduler_project.foundation.dbclock import db_now
from tests.helpers import make_due, make_schedule

pytestmark = pytest.mark.django_db(transaction=True)


@contextmanager
def running(loop, *, fast=True, monkeypatch=None):
    """The loop on its own thread through run_loop, stopped (and joined) on exit."""
    stop = threading.Event()

    def loop_thread():
        try:
            run_loop(loop, stop=stop)
        finally:
            connections.close_all()  # this thread's sessions, or the test database cannot be dropped

    t = threading.Thread(target=loop_thread, daemon=True)
    t.start()
    try:
        yield stop
    finally:
        stop.set()
        t.join(10)
        assert not t.is_alive()


def wait_for(predicate, timeout=15.0, what="the loop to do its work"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class FailFirst:
    """Wraps a function: raises for its first `n` calls, then calls through."""

    def __init__(self, fn, n=2, error=RuntimeError("injected failure")):
        self.fn, self.n, self.error, self.calls = fn, n, error, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls <= self.n:
            raise self.error
        return self.fn(*args, **kwargs)


class TerminateMidStep:
    """Wraps a function the step calls after it has already written in its transaction: the first
    time, the step's own database session is terminated from another connection first (as a
    database restart or pg_terminate_backend does), so the statement fails mid-transaction."""

    def __init__(self, fn, times=1):
        self.fn, self.times, self.terminated = fn, times, 0

    def __call__(self, *args, **kwargs):
        if self.terminated < self.times:
            self.terminated += 1
            pid = connection.cursor().connection.info.backend_pid
            killer = connections.create_connection("default")
            try:
                with killer.cursor() as cur:
                    cur.execute("SELECT pg_terminate_backend(%s)", [pid])
            finally:
                killer.close()
        return self.fn(*args, **kwargs)


def succeeded_runs(tenant, target, tag: str, n: int = 3) -> list:
    """n schedules of the tenant, each with one run made by the scanner and succeeded."""
    schedules = [make_schedule(tenant, target.url + f"/{tag}{i}") for i in range(n)]
    for s in schedules:
        make_due(s)
    loops.drain(loops.scan_step)
    claimed = queue.claim("w-1", 10)
    queue.complete([queue.Result(claimed=c, outcome="succeeded", http_status=200) for c in claimed])
    assert len(claimed) == n
    return schedules


@pytest.fixture(autouse=True)
def quick_polls(settings, monkeypatch):
    settings.SCHEDULER_POLL_SECONDS = 0.1
    settings.SCHEDULER_RECONCILE_SECONDS = 0.1
    monkeypatch.setattr(loops, "FAILURE_BACKOFF_FIRST", 0.05)


def test_the_failure_backoff_grows_to_its_cap_and_never_waits_nothing():
    waits = [failure_backoff(n) for n in range(1, 40)]
    assert all(w > 0 for w in waits)
    assert max(waits) <= loops.FAILURE_BACKOFF_CAP
    assert failure_backoff(30) >= loops.FAILURE_BACKOFF_CAP / 2 > failure_backoff(1)


def test_a_failing_scan_step_is_retried_and_the_scanner_makes_the_run(tenant, target, monkeypatch, caplog):
    schedule = make_schedule(tenant, target.url + "/s")
    make_due(schedule)
    flaky = FailFirst(queue.materialise_due, n=3)
    monkeypatch.setattr(queue, "materialise_due", flaky)
    with caplog.at_level(logging.INFO, logger="scheduler.loops"), running(Scanner()):
        wait_for(lambda: Run.objects.filter(schedule=schedule).exists())
    assert flaky.calls > 3
    assert "scan step failed (3 in a row)" in caplog.text and "scan recovered after 3 failed steps" in caplog.text


def test_a_failing_reconcile_step_is_retried_and_the_expired_lease_recovered(tenant, target, monkeypatch):
    make_due(make_schedule(tenant, target.url + "/r"))
    loops.drain(loops.scan_step)
    (c,) = queue.claim("w-gone", 10, lease_seconds=1)
    Run.objects.filter(id=c.run_id).update(lease_until=db_now() - timedelta(seconds=5))
    monkeypatch.setattr(queue, "expire_leases", FailFirst(queue.expire_leases, n=2))
    with running(Reconciler()):
        wait_for(lambda: Run.objects.get(id=c.run_id).state != "leased")
    assert Attempt.objects.get(id=c.attempt_id).outcome == "unknown"


def test_a_failing_relay_step_is_retried_and_the_event_delivered(tenant, target, monkeypatch):
    from dispatch import relay as relay_module
    from schedules.services import SYSTEM
    from schedules.tenants import set_notification_url

    set_notification_url(tenant, target.url + "/events", by=SYSTEM)
    make_due(make_schedule(tenant, target.url + "/job"))
    loops.drain(loops.scan_step)
    monkeypatch.setattr(relay_module, "claim_events", FailFirst(relay_module.claim_events, n=2))
    relay = Relay()
    try:
        with running(relay):
            wait_for(lambda: not OutboxEvent.objects.filter(published_at__isnull=True).exists())
    finally:
        relay.close()
    assert any(d["path"] == "/events" for d in target.deliveries)


@pytest.mark.postgresql_only("terminates the step's PostgreSQL session with pg_terminate_backend")
def test_a_scan_step_whose_session_is_terminated_mid_transaction_makes_the_run_once(tenant, target, monkeypatch):
    schedules = [make_schedule(tenant, target.url + f"/s{i}") for i in range(3)]
    for s in schedules:
        make_due(s)
    s = store()
    cut = TerminateMidStep(s.schedule_advance_many, times=2)  # after the runs were inserted in the same transaction
    # Into the shared store's own attributes, so that undoing it leaves none behind: monkeypatch's
    # setattr on an instance restores the bound method as an instance attribute, which then hid
    # every later test's patch of the class (a later test's hold never took hold).
    monkeypatch.setitem(vars(s), "schedule_advance_many", cut)
    with running(Scanner()):
        wait_for(lambda: Run.objects.filter(schedule__in=schedules).count() == 3)
        time.sleep(0.5)  # the scanner goes on scanning: nothing is made twice
    assert cut.terminated == 2
    assert Run.objects.filter(schedule__in=schedules).count() == 3


@pytest.mark.postgresql_only("terminates the step's PostgreSQL session with pg_terminate_backend")
def test_a_reconcile_step_whose_session_is_terminated_mid_transaction_recovers_the_lease(tenant, target, monkeypatch):
    make_due(make_schedule(tenant, target.url + "/r"))
    loops.drain(loops.scan_step)
    (c,) = queue.claim("w-gone", 10, lease_seconds=1)
    Run.objects.filter(id=c.run_id).update(lease_until=db_now() - timedelta(seconds=5))
    s = store()
    cut = TerminateMidStep(s.run_apply_updates)  # after the attempt was marked unknown
    monkeypatch.setitem(vars(s), "run_apply_updates", cut)
    with running(Reconciler()):
        wait_for(lambda: Run.objects.get(id=c.run_id).state != "leased")
    assert cut.terminated == 1
    assert Attempt.objects.get(id=c.attempt_id).outcome == "unknown"
    assert OutboxEvent.objects.filter(run_id=c.run_id, kind="run.lease_expired").count() == 1


@pytest.mark.postgresql_only("terminates the step's PostgreSQL session with pg_terminate_backend")
def test_a_relay_step_whose_session_is_terminated_mid_step_delivers_every_event(tenant, target, monkeypatch):
    from dispatch import relay as relay_module
    from schedules.services import SYSTEM
    from schedules.tenants import set_notification_url

    set_notification_url(tenant, target.url + "/events", by=SYSTEM)
    make_due(make_schedule(tenant, target.url + "/job"))
    loops.drain(loops.scan_step)
    cut = TerminateMidStep(relay_module.record)  # after the call, before its outcome is written
    monkeypatch.setattr(relay_module, "record", cut)
    relay = Relay(visibility_seconds=1, timeout_seconds=0.2)
    try:
        with running(relay):
            wait_for(lambda: not OutboxEvent.objects.filter(published_at__isnull=True).exists(), timeout=30)
    finally:
        relay.close()
    assert cut.terminated == 1


@pytest.mark.postgresql_only("terminates the worker's PostgreSQL sessions with pg_terminate_backend")
@pytest.mark.parametrize("step", ["claim", "complete"])
def test_a_worker_whose_session_is_terminated_mid_step_delivers_every_run(tenant, target, monkeypatch, step):
    from dispatch.worker import run_worker

    schedules = [make_schedule(tenant, target.url + f"/w{i}") for i in range(5)]
    for s in schedules:
        make_due(s)
    loops.drain(loops.scan_step)
    st = store()
    method = {"claim": "run_claim_due", "complete": "run_complete"}[step]
    cut = TerminateMidStep(getattr(st, method))
    monkeypatch.setitem(vars(st), method, cut)
    stop = threading.Event()
    t = threading.Thread(target=run_worker, args=("w-cut",), kwargs={"stop": stop, "poll_seconds": 0.1}, daemon=True)
    t.start()
    try:
        wait_for(lambda: Run.objects.filter(schedule__in=schedules, state="succeeded").count() == 5, timeout=30)
    finally:
        stop.set()
        t.join(20)
    assert cut.terminated == 1 and not t.is_alive()
    assert Run.objects.filter(schedule__in=schedules).count() == 5


def test_a_loop_thread_that_dies_stops_every_loop_and_says_which(db):
    class Dies:
        name = "doomed"

        def step(self):
            raise KeyboardInterrupt  # not an Exception: the runner does not retry it

        def idle_seconds(self):
            return 0.1

    class Idle:
        name = "idle"

        def step(self):
            return False

        def idle_seconds(self):
            return 0.05

    stop = threading.Event()
    threads = LoopThreads(stop)
    threads.start(Idle())
    threads.start(Dies())
    assert stop.wait(5)
    threads.join(5)
    assert threads.died == ["doomed"]
    assert not any(t.is_alive() for t in threads.threads)


DYING_SCHEDULER = """
import os, sys
sys.path.insert(0, os.getcwd())
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "scheduler_project.settings_test")
django.setup()
from django.core.management import call_command
from dispatch import relay

class Boom(BaseException):
    pass

def boom(self, **kwargs):
    raise Boom("a bug in the loop itself")

relay.Relay.step = boom
call_command("scheduler")
"""


def test_the_scheduler_command_exits_non_zero_when_one_of_its_loops_dies(tenant):
    from tests.faults.harness import ROOT

    env = dict(os.environ)
    if connection.vendor == "postgresql":
        from tests.faults.harness import database_url

        env["DATABASE_URL"] = database_url()
    else:
        env["SCHEDULER_VAR_DIR"] = tempfile.mkdtemp(prefix="scheduler-dying-")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", DYING_SCHEDULER], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "the relay loop died" in done.stderr
    assert time.monotonic() - started < 40


@pytest.mark.postgresql_only("terminates the step's PostgreSQL session with pg_terminate_backend")
def test_an_activity_step_whose_session_is_terminated_mid_transaction_counts_each_attempt_once(
        tenant, target, monkeypatch):
    # After the step has read the attempts (joined to their runs) and before its counts are written.
    from dispatch import activity
    from dispatch.models import ALL_TENANTS, ActivityMinute

    succeeded_runs(tenant, target, "a")
    cut = TerminateMidStep(activity._Tally.apply)
    monkeypatch.setattr(activity._Tally, "apply", lambda self: cut(self))

    def counted():
        return sum(r.succeeded for r in ActivityMinute.objects.filter(tenant_id=ALL_TENANTS))

    with running(activity.ActivityAggregator(settle=timedelta(0))):
        wait_for(lambda: counted() >= 3, what="the activity loop to count the attempts")
        time.sleep(0.5)  # further passes count nothing twice
    assert cut.terminated == 1
    assert counted() == 3


@pytest.mark.postgresql_only("terminates the step's PostgreSQL session with pg_terminate_backend")
@pytest.mark.parametrize("cut_before", ["add_schedule_batches", "add_retry_cost_hours"])
def test_an_activity_step_cut_between_its_upserts_adds_each_attempt_once_to_every_table(
        tenant, target, monkeypatch, cut_before):
    # The step's per-minute and per-target upserts (and, for the second, the schedules' summaries)
    # have run in its transaction when its session is terminated: none of them may count twice.
    from dispatch import activity, activity_store
    from dispatch.models import RetryCostHour, ScheduleActivity, TargetMinute

    schedules = succeeded_runs(tenant, target, "c")
    cut = TerminateMidStep(getattr(activity_store, cut_before))
    monkeypatch.setattr(activity_store, cut_before, cut)

    def summaries():
        return sum(r.succeeded for r in ScheduleActivity.objects.filter(schedule_id__in=[s.id for s in schedules]))

    with running(activity.ActivityAggregator(settle=timedelta(0))):
        wait_for(lambda: summaries() >= 3, what="the activity loop to fold the attempts")
        time.sleep(0.5)  # further passes count nothing twice
    assert cut.terminated == 1
    assert summaries() == 3
    assert sum(TargetMinute.objects.filter(tenant_id=tenant.id).values_list("attempts", flat=True)) == 3
    per_schedule = RetryCostHour.objects.filter(tenant_id=tenant.id, dimension="schedule")
    assert sorted(per_schedule.values_list("attempts", flat=True)) == [1, 1, 1]


def test_two_activity_loops_at_once_fold_each_attempt_once(tenant, target):
    # Two `reconcile` processes each run the activity loop: they take turns on its cursor, and
    # every table gets each attempt once, whichever loop folded it.
    from dispatch import activity
    from dispatch.models import RetryCostHour, ScheduleActivity, TargetMinute

    schedules = [make_schedule(tenant, target.url + f"/two{i % 3}") for i in range(12)]
    for s in schedules:
        make_due(s)
    loops.drain(loops.scan_step)
    claimed = queue.claim("w-1", 50)
    queue.complete([queue.Result(claimed=c, outcome="failed" if i % 4 == 0 else "succeeded",
                                 http_status=500 if i % 4 == 0 else 200, retryable=False)
                    for i, c in enumerate(claimed)])
    assert len(claimed) == 12

    def folded():
        rows = ScheduleActivity.objects.filter(schedule_id__in=[s.id for s in schedules])
        return sum(r.succeeded + r.failed for r in rows)

    with running(activity.ActivityAggregator(batch=2, settle=timedelta(0))), \
            running(activity.ActivityAggregator(batch=2, settle=timedelta(0))):
        wait_for(lambda: folded() >= 12, what="the two activity loops to fold the attempts")
        time.sleep(0.5)
    assert folded() == 12
    assert sum(TargetMinute.objects.filter(tenant_id=tenant.id).values_list("attempts", flat=True)) == 12
    assert sum(TargetMinute.objects.filter(tenant_id=tenant.id).values_list("failed", flat=True)) == 3
    assert sum(RetryCostHour.objects.filter(tenant_id=tenant.id, dimension="schedule")
               .values_list("attempts", flat=True)) == 12


@pytest.mark.postgresql_only("terminates the step's PostgreSQL session with pg_terminate_backend")
def test_an_incidents_step_whose_session_is_terminated_as_it_saves_opens_one_incident(
        tenant, target, monkeypatch, settings):
    # The pass has read its events by key and opened the incident in its transaction when the
    # session goes: the next pass evaluates the same events again, and one incident results.
    from dispatch import incidents
    from dispatch.models import FailureStreak, Incident, IncidentCursor

    settings.SCHEDULER_INCIDENT_SETTLE_SECONDS = 0
    IncidentCursor.objects.update_or_create(id=1, defaults={"watermark": 0})
    from django.db import transaction

    from runs.actions import trigger_schedule
    from tests.helpers import ACTOR

    s = make_schedule(tenant, target.url + "/fails", max_attempts=1)
    for _ in range(3):
        trigger_schedule(s, by=ACTOR)
        claimed = queue.claim("w-1", 10)
        queue.complete([queue.Result(claimed=c, outcome="failed", http_status=500) for c in claimed])
    # What an uninterrupted evaluation makes of these events, undone again.
    with transaction.atomic():
        incidents.drain()
        expected = list(Incident.objects.filter(schedule_id=s.id).values_list("rule", "occurrences"))
        transaction.set_rollback(True)
    assert expected and not Incident.objects.exists()
    cut = TerminateMidStep(incidents.Pass.save)
    monkeypatch.setattr(incidents.Pass, "save", lambda self, sids: cut(self, sids))

    with running(incidents.IncidentEvaluator()):
        wait_for(lambda: Incident.objects.filter(schedule_id=s.id).exists(), what="the incident to open")
        time.sleep(0.5)
    assert cut.terminated == 1
    assert list(Incident.objects.filter(schedule_id=s.id).values_list("rule", "occurrences")) == expected
    assert FailureStreak.objects.get(schedule_id=s.id).failures == 3
