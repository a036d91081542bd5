"""An edit while runs are pending: the older version's unstarted runs are canceled as
superseded, in-flight ones finish under their version, the new version starts from the edit."""

from datetime import timedelta

import pytest

from runs.actions import edit_schedule
from runs.models import Run
from runs.queue import Result, claim, complete
from scheduler_project.foundation.dbclock import db_now
from scheduler_project.foundation.errors import StaleVersion
from schedules.models import Schedule, ScheduleVersion
from tests.helpers import ACTOR, make_due, make_schedule
from tests.timesched.support import scan_until_idle

pytestmark = pytest.mark.django_db


def test_superseded_runs_are_canceled_in_flight_ones_finish_and_the_new_first_occurrence_is_right(tenant, target):
    schedule = make_schedule(tenant, target.url + "/v1", expression="* * * * *")
    # Three occurrences on time (the last 3 minutes, grace stretched so none is missed).
    Schedule.objects.filter(id=schedule.id).update(next_run_at=(db_now() - timedelta(minutes=3)).replace(second=0, microsecond=0))
    ScheduleVersion.objects.filter(id=schedule.current_id).update(misfire_grace_seconds=3600)
    scan_until_idle()
    (in_flight,) = claim("w-1", 1)
    pending = set(Run.objects.filter(schedule=schedule, state="ready").values_list("id", flat=True))
    assert len(pending) >= 2

    edited = edit_schedule(schedule, expected_version=1, by=ACTOR,
                           changes={"expression": "0 * * * *", "target_url": target.url + "/v2"})
    now = db_now()

    assert edited.version == 2
    assert set(Run.objects.filter(id__in=pending).values_list("state", "reason")) == {("canceled", "superseded")}
    # The leased run is untouched and still completes under version 1.
    applied, fenced = complete([Result(in_flight, "succeeded", http_status=200)])
    assert (applied, fenced) == (1, 0)
    done = Run.objects.get(id=in_flight.run_id)
    assert (done.state, done.schedule_version, done.version.target_url) == ("succeeded", 1, target.url + "/v1")
    # Version 2's first occurrence: the next top of the hour after the edit.
    top = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    assert Schedule.objects.get(id=schedule.id).next_run_at == top
    # History is immutable: version 1 still says what it said.
    v1, v2 = ScheduleVersion.objects.filter(schedule=schedule).order_by("version")
    assert (v1.expression, v2.expression) == ("* * * * *", "0 * * * *")
    assert v2.changes["expression"] == ["* * * * *", "0 * * * *"]


def test_due_occurrences_the_scanner_had_not_made_yet_are_recorded_as_superseded(tenant, target):
    schedule = make_schedule(tenant, target.url + "/v1", expression="rate(1 minute)")
    make_due(schedule, db_now() - timedelta(seconds=130))  # three due, none materialised
    edit_schedule(schedule, expected_version=1, by=ACTOR, changes={"expression": "rate(5 minutes)"})
    rows = list(Run.objects.filter(schedule=schedule).values_list("schedule_version", "state", "reason"))
    assert rows == [(1, "canceled", "superseded")] * 3
    assert Schedule.objects.get(id=schedule.id).next_run_at > db_now()


def test_a_stale_expected_version_is_refused_and_changes_nothing(tenant, target):
    schedule = make_schedule(tenant, target.url + "/v1")
    edit_schedule(schedule, expected_version=1, by=ACTOR, changes={"name": "renamed"})
    with pytest.raises(StaleVersion) as e:
        edit_schedule(schedule, expected_version=1, by=ACTOR, changes={"name": "again"})
    assert e.value.current_version == 2
    assert ScheduleVersion.objects.filter(schedule=schedule).count() == 2


def test_an_edit_that_moves_end_at_into_the_past_completes_the_schedule(tenant, target):
    schedule = make_schedule(tenant, target.url + "/v1", expression="0 * * * *")
    edit_schedule(schedule, expected_version=1, by=ACTOR, changes={"end_at": db_now() - timedelta(seconds=1)})
    schedule.refresh_from_db()
    assert (schedule.status, schedule.next_run_at) == ("completed", None) and schedule.completed_at
