"""The scanner's look-ahead: a burst it could not materialise within the base horizon is made
ahead of its instant; ordinary traffic is not. And a burst of at least SCHEDULER_BURST_SCHEDULES
at one instant is made early from SCHEDULER_BURST_LOOKAHEAD_SECONDS ahead, one run per schedule,
beside the ordinary traffic, by one scanner or two at once."""

from datetime import timedelta

import pytest

from dispatch.loops import Scanner, drain
from runs.models import Occurrence, Run
from scheduler_project.foundation.dbclock import db_now
from schedules.models import Schedule
from tests.helpers import at_once, make_schedule

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.beside_soak]

BURST = 600  # more than the first look-ahead probe (500 schedules)


def burst_due_in(tenant, url, seconds: int, n: int = BURST, at=None, **fields):
    at = at or (db_now() + timedelta(seconds=seconds)).replace(microsecond=0)
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


# --- bursts made early ----------------------------------------------------------------------------


@pytest.fixture
def bursts(settings):
    settings.SCHEDULER_BURST_SCHEDULES = 300
    settings.SCHEDULER_BURST_LOOKAHEAD_SECONDS = 900
    return settings


def test_a_burst_far_beyond_the_look_ahead_is_made_early_and_the_traffic_around_it_waits(bursts, tenant, target):
    first = burst_due_in(tenant, target.url, 600)
    later = burst_due_in(tenant, target.url + "/later", 700, n=20)  # a few, and later: ordinary traffic
    minute = make_schedule(tenant, target.url + "/minute", expression="rate(1 minute)")
    s = scanner(rate=1000, lookahead=120)  # fast enough that the whole-window look-ahead makes nothing
    drain(s.step)
    assert Run.objects.filter(scheduled_time=first, state="ready").count() == BURST
    assert Run.objects.filter(scheduled_time=later).count() == 0
    # The every-minute schedule got what the base horizon gives it, not 600 s of it.
    assert Run.objects.filter(schedule_id=minute.id).count() <= 1
    assert db_now() < first
    assert Schedule.objects.filter(next_run_at=first).count() == 0  # each one advanced past it
    assert s.burst_made == BURST


def test_a_burst_is_made_one_run_each_whatever_the_schedules_period(bursts, tenant, target):
    ids = [make_schedule(tenant, f"{target.url}/m{i}", expression="rate(1 minute)").id for i in range(BURST)]
    at = (db_now() + timedelta(seconds=400)).replace(microsecond=0)
    Schedule.objects.filter(id__in=ids).update(next_run_at=at, anchor_at=at - timedelta(minutes=1))
    drain(scanner(rate=1000).step)
    assert Run.objects.count() == BURST
    assert Run.objects.filter(scheduled_time=at).count() == BURST
    assert set(Schedule.objects.filter(id__in=ids).values_list("next_run_at", flat=True)) == {at + timedelta(minutes=1)}


def test_fewer_than_the_burst_size_at_one_instant_or_beyond_the_burst_window_wait(bursts, tenant, target):
    burst_due_in(tenant, target.url, 600, n=299)
    burst_due_in(tenant, target.url + "/far", 1000)
    drain(scanner(rate=1000).step)
    assert Run.objects.count() == 0


def test_a_burst_size_of_zero_turns_early_bursts_off(bursts, tenant, target):
    bursts.SCHEDULER_BURST_SCHEDULES = 0
    burst_due_in(tenant, target.url, 600)
    drain(scanner(rate=1000).step)
    assert Run.objects.count() == 0


def test_a_burst_of_schedules_that_do_not_allow_overlap_waits_for_its_instant_without_taking_the_others_turn(
        bursts, tenant, target):
    skipping = burst_due_in(tenant, target.url + "/skip", 600, overlap_policy="skip")
    allowing = burst_due_in(tenant, target.url, 600, at=skipping)
    s = scanner(rate=1000)
    steps = 1
    while s.step():
        steps += 1
        assert steps < 20, "the scanner keeps reporting work it does not do"
    # The allowing ones all made, though the batch (200) would have filled with skipping ones first.
    assert Run.objects.count() == BURST
    assert set(Run.objects.values_list("schedule__current__overlap_policy", flat=True)) == {"allow"}
    assert Schedule.objects.filter(next_run_at=allowing).count() == BURST  # the skipping ones wait


def test_two_scanners_making_one_burst_at_once_make_one_run_per_schedule(bursts, tenant, target):
    at = burst_due_in(tenant, target.url, 600, n=1500)

    def one_scanner():
        s = scanner(rate=1000)
        drain(s.step)
        return s.burst_made

    assert sum(at_once(one_scanner)) == 1500
    assert Run.objects.filter(scheduled_time=at).count() == Occurrence.objects.count() == 1500
    assert Run.objects.values("schedule_id").distinct().count() == 1500


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
