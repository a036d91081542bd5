"""Pausing cancels unstarted runs as paused and stops new occurrences; resuming computes the
next occurrence from the moment of resume, without replaying the paused interval."""

from datetime import timedelta

import pytest

from runs.actions import pause_schedule, resume_schedule
from runs.models import Run
from runs.queue import claim
from scheduler_project.foundation.dbclock import db_now
from schedules.models import Schedule
from tests.helpers import ACTOR, make_due, make_schedule
from tests.timesched.support import scan_until_idle

pytestmark = pytest.mark.django_db


def test_pause_cancels_unstarted_runs_as_paused_and_leaves_the_leased_one(tenant, target):
    schedule = make_schedule(tenant, target.url + "/p", expression="rate(1 minute)", misfire_policy="catch_up")
    make_due(schedule, db_now() - timedelta(minutes=2))
    scan_until_idle()
    (leased,) = claim("w-1", 1)
    pause_schedule(schedule, by=ACTOR)
    assert set(Run.objects.exclude(id=leased.run_id).values_list("state", "reason")) == {("canceled", "paused")}
    assert Run.objects.get(id=leased.run_id).state == "leased"
    make_due(schedule)  # even with an instant in the past, a paused schedule is not scanned
    assert scan_until_idle().runs == 0


def test_due_but_unmade_occurrences_at_pause_are_recorded_as_paused(tenant, target):
    schedule = make_schedule(tenant, target.url + "/p", expression="rate(1 minute)")
    make_due(schedule, db_now() - timedelta(seconds=70))
    pause_schedule(schedule, by=ACTOR)
    assert list(Run.objects.filter(schedule=schedule).values_list("state", "reason")) == [("canceled", "paused")] * 2


def test_resume_computes_from_the_moment_of_resume_and_does_not_replay_the_pause(tenant, target):
    schedule = make_schedule(tenant, target.url + "/p", expression="*/15 * * * *")
    pause_schedule(schedule, by=ACTOR)
    # Pretend the pause lasted a day: where the schedule stood then no longer matters.
    Schedule.objects.filter(id=schedule.id).update(next_run_at=None, paused_at=db_now() - timedelta(days=1))
    resumed = resume_schedule(schedule, by=ACTOR)
    now = db_now()
    quarter = now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0) + timedelta(minutes=15)
    assert resumed.enabled and resumed.next_run_at == quarter
    assert scan_until_idle().runs == 0 and not Run.objects.filter(schedule=schedule).exists()


def test_a_rate_schedule_keeps_its_phase_across_a_pause(tenant, target):
    anchor = (db_now() - timedelta(hours=5, minutes=20)).replace(microsecond=0)
    schedule = make_schedule(tenant, target.url + "/p", expression="rate(1 hour)", start_at=anchor,
                             now=anchor - timedelta(seconds=1))
    pause_schedule(schedule, by=ACTOR)
    resumed = resume_schedule(schedule, by=ACTOR)
    assert resumed.next_run_at == anchor + timedelta(hours=6)
