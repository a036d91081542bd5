"""startAt and endAt bound a schedule; a one-time at() schedule completes after it fires."""

from datetime import timedelta

import pytest

from runs.models import Run
from scheduler_project.foundation.dbclock import db_now
from schedules.models import Schedule
from tests.helpers import make_schedule, utc
from tests.timesched.support import scan_until_idle, states

pytestmark = pytest.mark.django_db


def test_nothing_fires_before_start_at_and_the_first_occurrence_is_start_at(tenant, target):
    now = db_now()
    start = (now + timedelta(days=2)).replace(microsecond=0)
    schedule = make_schedule(tenant, target.url + "/b", expression="rate(1 hour)", start_at=start)
    assert schedule.next_run_at == start
    assert scan_until_idle().runs == 0


def test_occurrences_stop_at_end_at_and_the_schedule_completes(tenant, target):
    created = utc(2026, 1, 1, 0, 0)
    schedule = make_schedule(tenant, target.url + "/b", expression="0 * * * *", now=created,
                             end_at=utc(2026, 1, 1, 3, 0), misfire_policy="catch_up")
    scan_until_idle()
    # 01:00 and 02:00; 03:00 is endAt itself, which is excluded.
    assert [t for t, _, _ in states(schedule)] == [utc(2026, 1, 1, 1), utc(2026, 1, 1, 2)]
    schedule.refresh_from_db()
    assert (schedule.status, schedule.next_run_at) == ("completed", None) and schedule.completed_at


def test_a_one_time_schedule_fires_once_then_completes(tenant, target):
    at = (db_now() - timedelta(seconds=5)).replace(microsecond=0)
    schedule = make_schedule(tenant, target.url + "/b", expression=f"at({at.strftime('%Y-%m-%dT%H:%M:%S')}Z)",
                             now=at - timedelta(minutes=1))
    scan_until_idle()
    assert states(schedule) == [(at, "ready", "")]
    schedule.refresh_from_db()
    assert schedule.status == "completed" and schedule.next_run_at is None
    assert scan_until_idle().runs == 0 and Run.objects.count() == 1


def test_a_one_time_schedule_in_the_future_waits_and_is_not_complete(tenant, target):
    schedule = make_schedule(tenant, target.url + "/b", expression="at(2027-06-01T09:00:00)", tz="Europe/Paris")
    assert schedule.next_run_at == utc(2027, 6, 1, 7, 0)
    scan_until_idle()
    assert Schedule.objects.get(id=schedule.id).status == "active"
