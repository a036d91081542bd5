"""Trigger now makes one manual run, identified by the trigger's instant."""

import pytest

from runs.actions import pause_schedule, trigger_schedule
from runs.models import Occurrence, Run
from runs.queue import claim
from schedules.models import AuditEntry
from tests.helpers import ACTOR, make_schedule

pytestmark = pytest.mark.django_db


def test_trigger_now_makes_a_manual_run_that_is_ready_at_once(tenant, target):
    schedule = make_schedule(tenant, target.url + "/t", expression="0 0 1 1 *")
    run = trigger_schedule(schedule, by=ACTOR)
    assert (run.kind, run.state, run.schedule_version) == ("manual", "ready", 1)
    occ = Occurrence.objects.get(run=run)
    assert occ.kind == "manual" and occ.scheduled_time == run.scheduled_time == run.next_eligible_at
    assert occ.note == "manual trigger"
    assert [c.run_id for c in claim("w", 10)] == [run.id]
    assert AuditEntry.objects.filter(action="schedule.trigger", object_id=str(schedule.id)).count() == 1


def test_each_trigger_is_its_own_run(tenant, target):
    schedule = make_schedule(tenant, target.url + "/t")
    a = trigger_schedule(schedule, by=ACTOR)
    b = trigger_schedule(schedule, by=ACTOR)
    assert a.id != b.id and a.scheduled_time < b.scheduled_time and Run.objects.count() == 2


def test_a_paused_schedule_can_still_be_triggered_by_hand(tenant, target):
    schedule = make_schedule(tenant, target.url + "/t")
    pause_schedule(schedule, by=ACTOR)
    assert trigger_schedule(schedule, by=ACTOR).state == "ready"
