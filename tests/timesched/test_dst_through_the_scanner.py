"""Daylight saving through the scanner: what the occurrence row stores, and the dstPolicy's
drops and doubles as runs. Schedules are created 'as of' a day before the transition and the
scanner (on today's database clock) then works the day off; the catch_up misfire policy runs
every one of the (at most two) missed occurrences, which keeps misfire out of the picture however
long ago the day is."""

from datetime import timedelta

import pytest

from runs.models import Occurrence, Run
from schedules import timeexpr
from tests.helpers import make_schedule, utc
from tests.timesched.support import scan_until_idle, states

pytestmark = pytest.mark.django_db

def new_york_daily(tenant, url, expression, day_before, **fields):
    return make_schedule(tenant, url, expression=expression, tz="America/New_York", now=day_before,
                         end_at=day_before + timedelta(days=1, hours=12), misfire_policy="catch_up", **fields)


def test_a_daily_0230_across_spring_forward_makes_one_run_at_0700z_and_records_what_it_meant(tenant, target):
    schedule = new_york_daily(tenant, target.url + "/d", "30 2 * * *", utc(2026, 3, 7, 12))
    scan_until_idle()
    (run,) = Run.objects.filter(schedule=schedule)
    assert run.scheduled_time == utc(2026, 3, 8, 7, 0) and run.state == "ready"
    occ = Occurrence.objects.get(run=run)
    assert occ.local_wall_time == "2026-03-08T02:30:00"
    assert occ.local_time == "2026-03-08T03:00:00-04:00"
    assert occ.time_zone == "America/New_York"
    assert occ.tzdata_version == timeexpr.tzdata_version() and occ.tzdata_version
    assert occ.note.startswith("moved: 02:30 does not exist on 2026-03-08")
    schedule.refresh_from_db()
    assert schedule.status == "completed"  # endAt reached


def test_dst_policy_skip_records_the_nonexistent_time_as_a_skipped_run(tenant, target):
    schedule = new_york_daily(tenant, target.url + "/d", "30 2 * * *", utc(2026, 3, 7, 12), dst_skipped="skip")
    scan_until_idle()
    assert states(schedule) == [(utc(2026, 3, 8, 7, 0), "skipped", "dst")]
    assert Occurrence.objects.get(schedule=schedule).note.startswith("dropped: 02:30 does not exist")


def test_a_daily_0130_across_fall_back_makes_one_run_at_the_earlier_0130(tenant, target):
    schedule = new_york_daily(tenant, target.url + "/d", "30 1 * * *", utc(2026, 10, 31, 12))
    scan_until_idle()
    assert states(schedule) == [(utc(2026, 11, 1, 5, 30), "ready", "")]


def test_repeated_both_makes_two_runs_one_at_each_offset(tenant, target):
    schedule = new_york_daily(tenant, target.url + "/d", "30 1 * * *", utc(2026, 10, 31, 12), dst_repeated="both")
    scan_until_idle()
    assert states(schedule) == [(utc(2026, 11, 1, 5, 30), "ready", ""), (utc(2026, 11, 1, 6, 30), "ready", "")]
    locals_ = sorted(Occurrence.objects.filter(schedule=schedule).values_list("local_time", flat=True))
    assert locals_ == ["2026-11-01T01:30:00-04:00", "2026-11-01T01:30:00-05:00"]


def test_a_missed_dst_drop_is_still_recorded_as_dst_not_misfire(tenant, target):
    # Without the long grace the spring day is months in the past: misfire applies to real
    # occurrences, but a dropped one was never going to run and keeps its own reason.
    schedule = make_schedule(tenant, target.url + "/d", expression="30 2 * * *", tz="America/New_York",
                             now=utc(2026, 3, 7, 12), end_at=utc(2026, 3, 9), dst_skipped="skip",
                             misfire_policy="skip")
    scan_until_idle()
    assert states(schedule) == [(utc(2026, 3, 8, 7, 0), "skipped", "dst")]
