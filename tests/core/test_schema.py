"""The invariants the database enforces are really there after every migration, on both engines
(read through Django's introspection, so the same test checks PostgreSQL and SQLite)."""

import uuid

import pytest
from django.db import IntegrityError, connection, transaction

from runs.models import Run

pytestmark = pytest.mark.django_db

NAMED = {
    "runs_occurrence": {"occurrence_identity_unique"},  # one occurrence per (schedule, version, instant)
    "runs_attempt": {"attempt_run_generation_unique", "attempt_one_open_per_run"},  # one per generation; one open
    "runs_run": {"run_ready_idx", "run_ready_tenant_idx", "run_leased_idx", "run_dead_idx", "run_dead_time_idx",
                 "run_dead_all_time_idx", "run_state_valid",
                 "run_lease_iff_leased", "run_finished_iff_terminal", "run_ready_has_eligibility"},
    "schedules_schedule": {"schedule_due_idx"},
    "runs_outboxevent": {"outbox_unpublished_idx", "outbox_relay_due_idx"},
}


def constraints(table):
    with connection.cursor() as cur:
        return connection.introspection.get_constraints(cur, table)


@pytest.mark.parametrize("table", sorted(NAMED))
def test_the_named_constraints_and_queue_indexes_exist(table):
    found = set(constraints(table))
    assert NAMED[table] <= found, NAMED[table] - found


def test_one_run_per_occurrence_is_a_unique_constraint():
    # With the run's scheduled time, which is its occurrence's: PostgreSQL's time partitions need
    # the partition key in every unique constraint (runs.models).
    uniques = [c["columns"] for c in constraints("runs_run").values() if c["unique"]]
    assert ["occurrence_id", "scheduled_time"] in uniques


def test_the_database_refuses_a_second_run_for_an_occurrence(tenant, target):
    from dispatch.loops import drain, scan_step
    from tests.helpers import make_due, make_schedule

    make_due(make_schedule(tenant, target.url + "/run"))
    drain(scan_step)
    run = Run.objects.get()
    twin = Run.objects.get(id=run.id)
    twin.id = uuid.uuid4()
    with pytest.raises(IntegrityError), transaction.atomic():
        twin.save(force_insert=True)


def test_the_database_refuses_a_second_attempt_of_a_generation_and_a_second_open_attempt(tenant, target):
    from dispatch.loops import drain, scan_step
    from runs import queue
    from runs.models import Attempt
    from tests.helpers import make_due, make_schedule

    make_due(make_schedule(tenant, target.url + "/run"))
    drain(scan_step)
    (c,) = queue.claim("w-1", 10)
    with pytest.raises(IntegrityError), transaction.atomic():
        Attempt.objects.create(run_id=c.run_id, generation=1, worker_id="twin", started_at=c.scheduled_time,
                               outcome="failed", finished_at=c.scheduled_time)
    with pytest.raises(IntegrityError), transaction.atomic():
        Attempt.objects.create(run_id=c.run_id, generation=2, worker_id="second-open", started_at=c.scheduled_time)


def test_run_states_are_checked_by_the_database(tenant, target):
    from dispatch.loops import drain, scan_step
    from tests.helpers import make_due, make_schedule

    make_due(make_schedule(tenant, target.url + "/run"))
    drain(scan_step)
    run = Run.objects.get()
    for change in ({"state": "exploded"}, {"state": "leased"}, {"state": "succeeded"}):
        with pytest.raises(IntegrityError), transaction.atomic():
            Run.objects.filter(id=run.id).update(**change)
