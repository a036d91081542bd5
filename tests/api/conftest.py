"""Fixtures for the HTTP API suite: a schedule and runs of the caller's tenant, made through the
API or the services, and the other tenant's twins for isolation tests."""

from datetime import timedelta

import pytest

from runs import actions
from runs.models import Run
from scheduler_project.foundation.dbclock import db_now
from tests.helpers import ACTOR, make_schedule


class Unserved:
    """The API suite never dispatches, so targets need a URL on the allowlist, not a server (and
    skipping the server saves the half-second its shutdown takes per test)."""

    url = "http://127.0.0.1:9"


@pytest.fixture
def target():
    return Unserved()


def schedule_body(target, **overrides):
    body = {"expression": "*/5 * * * *", "timeZone": "Europe/Paris", "target": {"url": target.url + "/hook"}}
    body.update(overrides)
    return body


@pytest.fixture
def schedule(tenant, target):
    return make_schedule(tenant, target.url + "/hook", expression="0 * * * *")


@pytest.fixture
def other_schedule(other_tenant, target):
    return make_schedule(other_tenant, target.url + "/hook", expression="0 * * * *")


def manual_run(schedule) -> Run:
    return actions.trigger_schedule(schedule, by=ACTOR)


@pytest.fixture
def run(schedule):
    return manual_run(schedule)


@pytest.fixture
def other_run(other_schedule):
    return manual_run(other_schedule)


def hourly_runs(schedule, hours: int) -> int:
    """Past hourly runs by backfill: `hours` distinct scheduled times, all ready."""
    now = db_now().replace(minute=0, second=0, microsecond=0)
    return actions.backfill_schedule(
        schedule, start=now - timedelta(hours=hours), end=now, by=ACTOR
    )
