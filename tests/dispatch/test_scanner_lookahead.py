"""The scanner's look-ahead: a burst it could not materialise within the base horizon is made
ahead of its instant; ordinary traffic is not."""

from datetime import timedelta

import pytest

from dispatch.loops import Scanner, drain
from runs.models import Run
from scheduler_project.foundation.dbclock import db_now
from schedules.models import Schedule
from tests.helpers import make_schedule

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.beside_soak]

BURST = 600  # more than the first look-ahead probe (500 schedules)


def burst_due_in(tenant, url, seconds: int, n: int = BURST, **fields):
    at = (db_now() + timedelta(seconds=seconds)).replace(microsecond=0)
    ids = [make_schedule(tenant, f"{url}/b{i}", expression="rate(1 day)", **fields).id for i in range(n)]
    # rate() counts from its anchor: one period before the instant makes the instant the next one.
    Schedule.objects.filter(id__in=ids).update(next_run_at=at, anchor_at=at - timedelta(days=1))
    return at


def scanner(rate: float, *, lookahead: int = 120) -> Scanner:
    s = Scanner(batch=200, horizon_seconds=10, lookahead_seconds=lookahead)
    s.rate = rate  # as if it had measured itself this fast
    return s


def test_a_burst_the_scanner_could_not_make_in_time_is_made_before_its_instant(tenant, target):
    at = burst_due_in(tenant, target.url, 60)
    s = scanner(rate=10)  # 500 runs at a quarter of 10/s: 200 s, more than the 50 s left
    drain(s.step)
    assert Run.objects.count() == BURST
    assert Run.objects.filter(scheduled_time=at, state="ready").count() == BURST
    assert db_now() < at  # all of it made ahead of the instant
    assert s.rate > 10  # and the scanner measured its own pace while at it


def test_a_burst_the_scanner_can_make_in_time_waits_for_the_horizon(tenant, target):
    burst_due_in(tenant, target.url, 60)
    s = scanner(rate=1000)  # 600 runs at 250/s: 2.4 s, well inside the 50 s left
    drain(s.step)
    assert Run.objects.count() == 0


def test_a_burst_past_the_last_probe_position_is_seen_by_the_count_of_the_window(tenant, target):
    at = burst_due_in(tenant, target.url, 60)
    # At a quarter of 44/s = 11/s, the 500th run can be made in the 50 s left but not all 600.
    s = scanner(rate=44)
    drain(s.step)
    assert Run.objects.filter(scheduled_time=at).count() == BURST
    assert db_now() < at


def test_once_a_burst_is_seen_the_whole_window_is_made(tenant, target):
    first = burst_due_in(tenant, target.url, 60)
    later = burst_due_in(tenant, target.url + "/later", 100, n=20)  # a few, and later: fine on its own
    s = scanner(rate=10)
    drain(s.step)
    assert Run.objects.filter(scheduled_time=first).count() == BURST
    assert Run.objects.filter(scheduled_time=later).count() == 20
    assert db_now() < first


def test_nothing_beyond_the_look_ahead_window_is_made_early(tenant, target):
    burst_due_in(tenant, target.url, 300)
    s = scanner(rate=10, lookahead=120)
    drain(s.step)
    assert Run.objects.count() == 0


def test_a_burst_of_schedules_that_do_not_allow_overlap_is_left_for_its_instant(tenant, target):
    # Their overlap policy is decided when they are due, so they are never made early; the
    # look-ahead must then neither make them nor spin.
    burst_due_in(tenant, target.url, 60, overlap_policy="skip")
    s = scanner(rate=10)
    steps = 1
    while s.step():
        steps += 1
        assert steps < 10, "the scanner keeps reporting work it does not do"
    assert Run.objects.count() == 0
    assert s.step() is False  # probed a moment ago: no second probe within the second
