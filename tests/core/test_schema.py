"""The invariants the database enforces are really there after every migration."""

import pytest
from django.db import connection

pytestmark = pytest.mark.django_db

EXPECTED = {
    "occurrence_identity_unique",  # one occurrence per (schedule, version, instant)
    "runs_run_occurrence_id_key",  # one run per occurrence
    "attempt_run_generation_unique",  # one attempt per generation
    "attempt_one_open_per_run",  # at most one open attempt
    "run_ready_idx", "run_ready_tenant_idx", "run_leased_idx", "run_dead_idx",
    "schedule_due_idx", "outbox_unpublished_idx", "outbox_relay_due_idx",
}


def test_the_named_constraints_and_queue_indexes_exist():
    with connection.cursor() as cur:
        cur.execute("SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()")
        names = {r[0] for r in cur.fetchall()}
    assert EXPECTED <= names, EXPECTED - names


def test_run_states_are_checked_by_the_database():
    with connection.cursor() as cur:
        cur.execute("SELECT conname FROM pg_constraint WHERE conrelid = 'runs_run'::regclass AND contype = 'c'")
        names = {r[0] for r in cur.fetchall()}
    assert {"run_state_valid", "run_lease_iff_leased", "run_finished_iff_terminal", "run_ready_has_eligibility"} <= names
