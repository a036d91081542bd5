"""Materialising: the occurrence's unique constraint decides, so an instant that already has an
occurrence never gets a second run or event, even inside a batch that makes others."""

from datetime import timedelta

import pytest

from runs.models import Occurrence, OutboxEvent, Run, RunKind, RunState
from runs.queue import build_run, insert_runs
from scheduler_project.foundation.dbclock import db_now
from schedules import timeexpr
from tests.helpers import make_schedule

pytestmark = pytest.mark.django_db(transaction=True)


def triple(schedule, at, now):
    occ = timeexpr.Occurrence(at=at, local=at, wall=at.replace(tzinfo=None).isoformat(timespec="seconds"))
    return build_run(schedule, schedule.current, occ, state=RunState.READY, reason="", eligible_at=at,
                     kind=RunKind.SCHEDULED, now=now)


def test_an_instant_that_has_an_occurrence_gets_no_second_run_in_a_mixed_batch(tenant, target):
    schedule = make_schedule(tenant, target.url + "/i")
    now = db_now()
    first, second = (now + timedelta(minutes=5)).replace(microsecond=0), (now + timedelta(minutes=6)).replace(microsecond=0)
    made = insert_runs([triple(schedule, first, now)])
    assert len(made) == 1 and made[0].created_at is not None and not made[0]._state.adding

    again = insert_runs([triple(schedule, first, now), triple(schedule, second, now)])

    assert [r.scheduled_time for r in again] == [second]
    assert Occurrence.objects.filter(schedule=schedule).count() == Run.objects.filter(schedule=schedule).count() == 2
    assert OutboxEvent.objects.filter(kind="run.created").count() == 2
    kept = Run.objects.get(id=made[0].id)
    assert (kept.state, kept.next_eligible_at, kept.target_host) == ("ready", first, made[0].target_host)
    event = OutboxEvent.objects.get(run_id=again[0].id)
    assert event.payload["scheduledTime"].startswith(second.strftime("%Y-%m-%dT%H:%M:%S"))
    assert event.tenant_id == tenant.id
