"""Issue 26, finding 10, through the scanner: Antarctica/Troll's repeated hours (01:00-02:59 on the
last Sunday of October, once at +02 and again at +00; its daylight time exists only in the tz
file's footer) become runs like any other zone's. Before the engine read the footer, the second
pass was lost: `repeated=both` made one run, and a sub-daily COUNT ending in the repeated hours
lost its second passes. Expected instants are zoneinfo's own (both folds of the wall time)."""

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from runs.models import Occurrence
from tests.helpers import make_schedule, utc
from tests.timesched.support import scan_until_idle, states

pytestmark = pytest.mark.django_db

TROLL = ZoneInfo("Antarctica/Troll")
DAY_BEFORE = utc(2026, 10, 24, 12)  # Troll falls back on 2026-10-25 at 01:00Z


def both_passes(wall: datetime) -> list[datetime]:
    return sorted({wall.replace(tzinfo=TROLL, fold=f).astimezone(timezone.utc) for f in (0, 1)})


def troll(tenant, url, expression, **fields):
    return make_schedule(tenant, url, expression=expression, tz="Antarctica/Troll", now=DAY_BEFORE,
                         end_at=DAY_BEFORE + timedelta(days=1, hours=12), misfire_policy="catch_up", **fields)


def test_finding_10_repeated_both_in_troll_makes_a_run_at_each_pass(tenant, target):
    schedule = troll(tenant, target.url + "/d", "30 1 * * *", dst_repeated="both")
    scan_until_idle()
    expected = both_passes(datetime(2026, 10, 25, 1, 30))
    assert expected == [utc(2026, 10, 24, 23, 30), utc(2026, 10, 25, 1, 30)]
    assert states(schedule) == [(at, "ready", "") for at in expected]
    locals_ = sorted(Occurrence.objects.filter(schedule=schedule).values_list("local_time", flat=True))
    assert locals_ == ["2026-10-25T01:30:00+00:00", "2026-10-25T01:30:00+02:00"]


def test_finding_10_an_hourly_count_ending_in_trolls_repeated_hour_runs_both_passes(tenant, target):
    schedule = troll(tenant, target.url + "/h", "DTSTART:20261025T000000\nRRULE:FREQ=HOURLY;COUNT=2")
    scan_until_idle()
    expected = sorted({*both_passes(datetime(2026, 10, 25, 0)), *both_passes(datetime(2026, 10, 25, 1))})
    assert [at for at, _, _ in states(schedule)] == expected
    assert len(expected) == 3
