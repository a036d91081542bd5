"""Each invariant check finds the corruption made for it by writing around the services, and
names the rows involved. Runs are made through the real queue functions in the test's own
transaction (no worker thread), so the schema changes some tests make roll back with it."""

import uuid
from datetime import timedelta

import pytest
from django.db import connection

from dispatch import invariants
from dispatch.loops import drain, scan_step
from runs import queue
from runs.models import Attempt, Occurrence, OutboxEvent, Run
from scheduler_project.foundation.dbclock import db_now
from schedules.models import Schedule
from tests.helpers import make_due, make_schedule

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.postgresql_only("corrupts the database on purpose, with PostgreSQL DDL and deferred constraints"),
]


def checks(name):
    return invariants.CHECKS[name](invariants.Context(now=db_now()))


def found(name):
    """{check: set of ids} over the whole audit, so a test also sees what else its corruption
    tripped."""
    return {v.check: set(v.ids) for v in invariants.run_all()}


def ready_run(tenant, target, path="/ok"):
    s = make_schedule(tenant, target.url + path)
    make_due(s)
    drain(scan_step)
    return s, Run.objects.get(schedule=s)


def leased_run(tenant, target, path="/ok"):
    s, run = ready_run(tenant, target, path)
    (c,) = queue.claim("w-test", 10)
    return s, run, c


def succeeded_run(tenant, target, path="/ok"):
    s, run, c = leased_run(tenant, target, path)
    assert queue.complete([queue.Result(claimed=c, outcome="succeeded", http_status=200)]) == (1, 0)
    return s, run, c


def test_a_healthy_database_has_no_violations(tenant, target):
    leased_run(tenant, target, "/a")
    succeeded_run(tenant, target, "/b")
    assert invariants.run_all() == []


def test_it_finds_a_duplicate_occurrence(tenant, target):
    s, run = ready_run(tenant, target)
    occ = Occurrence.objects.get(run=run)
    with connection.cursor() as cur:
        # Deferred foreign keys queued by the inserts above would block the ALTER.
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cur.execute(f"ALTER TABLE {Occurrence._meta.db_table} DROP CONSTRAINT occurrence_identity_unique")
    twin = Occurrence.objects.get(id=occ.id)
    twin.id = uuid.uuid4()
    twin.save(force_insert=True)
    got = found("any")
    # Put the constraint back: the test database outlives this test, and later tests rely on it.
    Occurrence.objects.filter(id=twin.id).delete()
    with connection.cursor() as cur:
        cur.execute(f"ALTER TABLE {Occurrence._meta.db_table} ADD CONSTRAINT occurrence_identity_unique "
                    "UNIQUE (schedule_id, schedule_version, scheduled_time)")
    assert got["duplicate_occurrence"] == {str(occ.id), str(twin.id)}
    # the twin has no run either
    assert got["occurrence_run_count"] == {str(twin.id)}


def test_it_finds_an_occurrence_without_a_run(tenant, target):
    s, run = ready_run(tenant, target)
    occ_id = run.occurrence_id
    Run.objects.filter(id=run.id).delete()
    (v,) = checks("occurrences_without_one_run")
    assert (v.invariant, v.ids, v.count) == (1, [str(occ_id)], 1)


def test_it_finds_a_missing_attempt_generation(tenant, target):
    s, run, c = leased_run(tenant, target)
    queue.complete([queue.Result(claimed=c, outcome="failed", retryable=True, http_status=503)])
    Run.objects.filter(id=run.id).update(next_eligible_at=db_now() - timedelta(seconds=1))
    (c2,) = queue.claim("w-test", 10)
    assert c2.generation == 2
    Attempt.objects.filter(run=run, generation=1).delete()
    (v,) = checks("attempt_generations")
    assert (v.invariant, v.ids) == (2, [str(run.id)])


def test_it_finds_a_generation_without_its_attempt(tenant, target):
    s, run = ready_run(tenant, target)
    Run.objects.filter(id=run.id).update(generation=1)
    (v,) = checks("attempt_generations")
    assert v.ids == [str(run.id)]


def test_it_finds_a_leased_run_without_an_open_attempt(tenant, target):
    s, run, c = leased_run(tenant, target)
    Attempt.objects.filter(id=c.attempt_id).update(outcome="failed", finished_at=db_now())
    (v,) = checks("leased_without_open_attempt")
    assert (v.invariant, v.ids) == (3, [str(run.id)])


def test_it_finds_a_second_open_attempt(tenant, target):
    s, run, c = leased_run(tenant, target)
    with connection.cursor() as cur:
        cur.execute("DROP INDEX attempt_one_open_per_run")
    # an open attempt of a later generation than the run has: a second, misplaced one
    Attempt.objects.create(run=run, generation=2, worker_id="ghost", started_at=db_now())
    got = found("any")
    # Put the index back: the test database outlives this test, and later tests rely on it.
    Attempt.objects.filter(run=run, generation=2).delete()
    with connection.cursor() as cur:
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")  # deferred FK checks would block the DDL
        cur.execute("CREATE UNIQUE INDEX attempt_one_open_per_run ON runs_attempt (run_id, scheduled_time) WHERE outcome IS NULL")
    assert got["misplaced_open_attempt"] == {str(run.id)}
    assert got["attempt_generations"] == {str(run.id)}


def test_it_finds_an_open_attempt_on_a_finished_run(tenant, target):
    s, run, c = succeeded_run(tenant, target)
    Attempt.objects.filter(id=c.attempt_id).update(outcome=None, finished_at=None)
    (v,) = checks("misplaced_open_attempts")
    assert v.ids == [str(run.id)]


def test_it_reports_a_lease_the_reconciler_left_behind(tenant, target, settings):
    s, run, c = leased_run(tenant, target)
    assert checks("stale_leases") == []
    # Past its end, but within one reconcile interval (plus margin): the reconciler has time.
    Run.objects.filter(id=run.id).update(lease_until=db_now() - timedelta(seconds=settings.SCHEDULER_RECONCILE_SECONDS))
    assert checks("stale_leases") == []
    Run.objects.filter(id=run.id).update(lease_until=db_now() - timedelta(hours=1))
    (v,) = checks("stale_leases")
    assert (v.invariant, v.ids) == (4, [str(run.id)]) and "reconciler" in v.message


def test_it_finds_an_event_after_a_terminal_one_without_a_retry(tenant, target):
    s, run, c = succeeded_run(tenant, target)
    OutboxEvent.objects.create(run=run, tenant=tenant, kind="run.leased", payload={"state": "leased", "generation": 2})
    got = found("any")
    assert got["changed_after_terminal"] == {str(run.id)}


def test_a_manual_retry_after_a_terminal_event_is_allowed(tenant, target):
    from runs.actions import retry_run
    from tests.helpers import ACTOR

    s, run, c = leased_run(tenant, target)
    queue.complete([queue.Result(claimed=c, outcome="failed", retryable=False, http_status=400)])
    retry_run(run, by=ACTOR)
    (c2,) = queue.claim("w-test", 10)
    queue.complete([queue.Result(claimed=c2, outcome="succeeded", http_status=200)])
    assert list(OutboxEvent.objects.filter(run=run).order_by("id").values_list("kind", flat=True)) == [
        "run.created", "run.leased", "run.dead", "run.retried", "run.leased", "run.succeeded"]
    assert invariants.run_all() == []


def test_it_finds_a_terminal_run_changed_behind_the_outbox(tenant, target):
    s, run, c = succeeded_run(tenant, target)
    Run.objects.filter(id=run.id).update(state="ready", finished_at=None, next_eligible_at=db_now())
    got = found("any")
    assert got["changed_after_terminal"] == {str(run.id)}
    assert got["state_without_event"] == {str(run.id)}


def test_it_finds_a_run_without_its_creation_event(tenant, target):
    s, run = ready_run(tenant, target)
    OutboxEvent.objects.filter(run=run, kind="run.created").delete()
    (v,) = checks("runs_without_creation_event")
    assert (v.invariant, v.ids) == (6, [str(run.id)])


def test_it_finds_an_attempt_without_its_leased_event(tenant, target):
    s, run, c = leased_run(tenant, target)
    OutboxEvent.objects.filter(run=run, kind="run.leased").delete()
    got = found("any")
    assert got == {"attempt_without_leased_event": {str(run.id)}, "state_without_event": {str(run.id)}}


def test_it_finds_a_result_without_its_event(tenant, target):
    s, run, c = succeeded_run(tenant, target)
    OutboxEvent.objects.filter(run=run, kind="run.succeeded").delete()
    got = found("any")
    assert got == {"result_without_event": {str(run.id)}, "state_without_event": {str(run.id)}}


def test_a_cancel_in_flight_counts_as_the_abandoned_attempts_event(tenant, target):
    from runs.actions import cancel_run
    from tests.helpers import ACTOR

    s, run, c = leased_run(tenant, target)
    cancel_run(run, by=ACTOR)
    assert invariants.run_all() == []
    OutboxEvent.objects.filter(run=run, kind="run.canceled").delete()
    assert {v.check for v in invariants.run_all()} == {"result_without_event", "state_without_event"}


def test_events_older_than_the_retention_are_not_judged(tenant, target, settings):
    s, run = ready_run(tenant, target)
    # The relay may have pruned these events: their absence proves nothing.
    Run.objects.filter(id=run.id).update(created_at=db_now() - timedelta(hours=settings.SCHEDULER_OUTBOX_RETENTION_HOURS))
    OutboxEvent.objects.filter(run=run).delete()
    assert checks("runs_without_creation_event") == []


def test_it_warns_of_old_unpublished_events_only_where_a_webhook_waits_for_them(tenant, other_tenant, target):
    type(tenant).objects.filter(id=tenant.id).update(notification_url=target.url + "/events")
    s, run = ready_run(tenant, target)
    ready_run(other_tenant, target, "/other")  # no webhook: its event is written published
    OutboxEvent.objects.update(created_at=db_now() - timedelta(hours=1))
    type(tenant).objects.filter(id=tenant.id).update(notification_url="")
    assert checks("unpublished_events") == []  # the webhook is gone: nothing waits for the event
    type(tenant).objects.filter(id=tenant.id).update(notification_url=target.url + "/events")
    (v,) = checks("unpublished_events")
    ev = OutboxEvent.objects.get(run=run)
    assert (v.invariant, v.severity, v.ids) == (6, "warning", [str(ev.event_id)])
    OutboxEvent.objects.filter(id=ev.id).update(published_at=db_now())
    assert checks("unpublished_events") == []


def test_it_finds_a_schedule_whose_next_occurrence_was_lost(tenant, target):
    s, run = ready_run(tenant, target)
    assert checks("schedules_left_behind") == []
    Schedule.objects.filter(id=s.id).update(next_run_at=None)
    (v,) = checks("schedules_left_behind")
    assert (v.invariant, v.ids) == (7, [str(s.id)])


def test_it_finds_a_schedule_the_scanner_left_behind(tenant, target):
    s, run = ready_run(tenant, target)
    grace = s.current.misfire_grace_seconds
    Schedule.objects.filter(id=s.id).update(next_run_at=db_now() - timedelta(seconds=grace))
    assert checks("schedules_left_behind") == []  # due, within grace: the scanner's next pass
    Schedule.objects.filter(id=s.id).update(next_run_at=db_now() - timedelta(hours=1))
    (v,) = checks("schedules_left_behind")
    assert v.ids == [str(s.id)]
    # a paused schedule has no next occurrence on purpose
    Schedule.objects.filter(id=s.id).update(enabled=False, next_run_at=None)
    assert checks("schedules_left_behind") == []


def test_output_is_bounded_and_counts_everything(tenant, target):
    for i in range(5):
        ready_run(tenant, target, f"/r{i}")
    Schedule.objects.update(next_run_at=None)
    (v,) = invariants.CHECKS["schedules_left_behind"](invariants.Context(now=db_now(), limit=2))
    assert v.count == 5 and len(v.ids) == 2 and v.ids == sorted(v.ids)
