"""The scanner's look-ahead: a burst it could not materialise within the base horizon is made
ahead of its instant, one run per schedule, as early as the pace it can spare beside the steady
traffic needs; ordinary traffic is not."""

import time
from datetime import timedelta

import pytest

from dispatch.loops import Scanner, drain
from runs.models import Run
from scheduler_project.foundation.dbclock import db_now
from schedules.models import Schedule
from tests.helpers import make_schedule

pytestmark = pytest.mark.django_db(transaction=True)

BURST = 600  # more than queue.BURST_SCHEDULES (500) at one instant


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


def test_a_burst_that_would_be_made_just_too_late_is_made_early(tenant, target):
    at = burst_due_in(tenant, target.url, 60)
    # At a quarter of 44/s = 11/s, 500 runs can be made in the 50 s left but not all 600.
    s = scanner(rate=44)
    drain(s.step)
    assert Run.objects.filter(scheduled_time=at).count() == BURST
    assert db_now() < at


def test_only_the_burst_is_made_early_and_ordinary_schedules_around_it_wait_for_their_horizon(tenant, target):
    first = burst_due_in(tenant, target.url, 60)
    later = burst_due_in(tenant, target.url + "/later", 100, n=20)  # a few, and later: fine on its own
    s = scanner(rate=10)
    drain(s.step)
    assert Run.objects.filter(scheduled_time=first).count() == BURST
    assert Run.objects.filter(scheduled_time=later).count() == 0
    assert db_now() < first


def test_a_burst_of_every_minute_schedules_is_made_one_run_each(tenant, target):
    # Made early up to its own instant: not every occurrence up to the window's end.
    ids = [make_schedule(tenant, f"{target.url}/m{i}", expression="rate(1 minute)").id for i in range(BURST)]
    at = (db_now() + timedelta(seconds=60)).replace(microsecond=0)
    Schedule.objects.filter(id__in=ids).update(next_run_at=at, anchor_at=at - timedelta(minutes=1))
    s = scanner(rate=10, lookahead=600)
    drain(s.step)
    assert Run.objects.count() == BURST
    assert Run.objects.filter(scheduled_time=at).count() == BURST
    assert set(Schedule.objects.filter(id__in=ids).values_list("next_run_at", flat=True)) == {at + timedelta(minutes=1)}


def test_a_later_burst_that_can_still_wait_is_left_until_it_cannot(tenant, target):
    first = burst_due_in(tenant, target.url, 60)
    later = burst_due_in(tenant, target.url + "/later", 600)
    s = scanner(rate=40, lookahead=900)  # 10/s planned: 600 need 60 s (too late), 1,200 need 120 s of 590
    drain(s.step)
    assert Run.objects.filter(scheduled_time=first).count() == BURST
    assert Run.objects.filter(scheduled_time=later).count() == 0


def test_steady_traffic_taking_most_of_the_scanners_pace_makes_a_burst_start_earlier(tenant, target):
    at = burst_due_in(tenant, target.url, 120)
    idle = scanner(rate=100)  # 25/s planned: 600 in 24 s, well inside the 110 s left
    drain(idle.step)
    assert Run.objects.count() == 0
    busy = scanner(rate=100)
    # As if its ordinary passes had made 90 runs a second for the last half minute: 10/s spare, 2.5/s planned.
    busy.started = time.monotonic() - 60
    busy.steady.append((time.monotonic(), 90 * 30))
    assert busy.spare_rate() == pytest.approx(2.5, rel=0.05)
    drain(busy.step)
    assert Run.objects.filter(scheduled_time=at).count() == BURST
    assert db_now() < at


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


def test_the_due_instants_read_counts_each_instant_within_its_window_and_cap(tenant, target):
    from runs.store import store

    first = burst_due_in(tenant, target.url, 60)
    later = burst_due_in(tenant, target.url + "/later", 100, n=20)
    now = db_now()

    def read(until=200, cap=10_000, at_least=1):
        return store().schedule_due_instants(now, beyond=now + timedelta(seconds=10), until=now + timedelta(seconds=until),
                                             cap=cap, at_least=at_least)

    assert read() == [(first, BURST), (later, 20)]
    assert read(at_least=500) == [(first, BURST)]
    assert read(until=80) == [(first, BURST)]
    assert read(cap=BURST + 5) == [(first, BURST), (later, 5)]
    assert read(cap=300) == [(first, 300)]
