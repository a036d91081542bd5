"""Portal personas and fixtures: an operator (the "Operator" role), a read-only operator, a staff
account without a role, a tenant user of acme, a tenant user of globex, and an outsider with
neither; runs in every state made through the services, then moved to the state a test needs with
plain ORM updates (fixtures only)."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client

from runs.actions import trigger_schedule
from runs.models import Attempt, AttemptOutcome, Occurrence, Run, RunState
from scheduler_project.foundation.dbclock import db_now
from scheduler_project.web.access import ROLE_OPERATOR, ROLE_READ_ONLY, role
from schedules.models import TenantMembership
from tests.helpers import ACTOR, make_schedule


def login(user) -> Client:
    c = Client()
    c.force_login(user)
    return c


def staff_user(username: str, role_name: str | None = None) -> User:
    u = User.objects.create_user(username, password=f"pw-{username}-123", is_staff=True)
    if role_name:
        u.groups.add(role(role_name))
    return u


@pytest.fixture
def operator_user(db):
    return staff_user("olga", ROLE_OPERATOR)


@pytest.fixture
def read_only_operator_user(db):
    return staff_user("rita", ROLE_READ_ONLY)


@pytest.fixture
def staff_without_role_user(db):
    return staff_user("sam")


@pytest.fixture
def acme_user(tenant):
    u = User.objects.create_user("alice", password="pw-alice-123")
    TenantMembership.objects.create(user=u, tenant=tenant)
    return u


@pytest.fixture
def globex_user(other_tenant):
    u = User.objects.create_user("gary", password="pw-gary-123")
    TenantMembership.objects.create(user=u, tenant=other_tenant)
    return u


@pytest.fixture
def outsider(db):
    return User.objects.create_user("nobody", password="pw-nobody-123")


@pytest.fixture
def operator(operator_user):
    return login(operator_user)


@pytest.fixture
def read_only_operator(read_only_operator_user):
    return login(read_only_operator_user)


@pytest.fixture
def staff_without_role(staff_without_role_user):
    return login(staff_without_role_user)


@pytest.fixture
def acme(acme_user):
    return login(acme_user)


@pytest.fixture
def globex(globex_user):
    return login(globex_user)


@pytest.fixture
def schedule(tenant, target):
    return make_schedule(tenant, target.url + "/hook", name="nightly-report", expression="0 2 * * *",
                         tz="America/New_York")


@pytest.fixture
def other_schedule(other_tenant, target):
    return make_schedule(other_tenant, target.url + "/globex", name="globex-sync")


def make_run(schedule, state=RunState.READY, *, error="HTTP 500 from target", http_status=500,
             outcome=AttemptOutcome.FAILED, excerpt='{"error": "database is down"}', age=timedelta(0)) -> Run:
    """A run made by trigger_schedule, then moved to `state` with the attempt evidence it would
    carry there."""
    run = trigger_schedule(schedule, by=ACTOR)
    now = db_now()
    if age:
        # The occurrence moves with its run: the two share the scheduled time, as the scanner makes them.
        Occurrence.objects.filter(id=run.occurrence_id).update(scheduled_time=run.scheduled_time - age)
        Run.objects.filter(id=run.id).update(scheduled_time=run.scheduled_time - age,
                                             next_eligible_at=run.scheduled_time - age)
        run.refresh_from_db()
    if state == RunState.READY:
        return run
    started = run.scheduled_time + timedelta(seconds=2)
    if state == RunState.LEASED:
        Attempt.objects.create(run=run, generation=1, worker_id="worker-a:1", started_at=started)
        Run.objects.filter(id=run.id).update(state=state, generation=1, attempts_used=0, first_started_at=started,
                                             lease_owner="worker-a:1", lease_until=now + timedelta(seconds=60),
                                             next_eligible_at=None)
    else:
        if state != RunState.SKIPPED and state != RunState.CANCELED:
            Attempt.objects.create(
                run=run, generation=1, worker_id="worker-a:1", started_at=started,
                finished_at=started + timedelta(milliseconds=250),
                outcome=AttemptOutcome.SUCCEEDED if state == RunState.SUCCEEDED else outcome,
                http_status=200 if state == RunState.SUCCEEDED else http_status,
                error_class="" if state == RunState.SUCCEEDED else ("LeaseExpired" if outcome == AttemptOutcome.UNKNOWN else "HTTPError"),
                error="" if state == RunState.SUCCEEDED else error,
                response_excerpt=excerpt, latency_ms=250,
            )
            gen = 1
        else:
            gen = 0
        Run.objects.filter(id=run.id).update(
            state=state, generation=gen, attempts_used=gen, first_started_at=started if gen else None,
            next_eligible_at=None, finished_at=now, last_error="" if state == RunState.SUCCEEDED else (error if gen else ""),
            reason="canceled" if state == RunState.CANCELED else ("misfire" if state == RunState.SKIPPED else ""),
        )
    run.refresh_from_db()
    return run
