"""The forecast counts a rule's occurrences by arithmetic where the rule allows it (rate(), cron
away from UTC-offset changes, RRULEs that repeat within a day): the instants and every range's count equal those of walking the
rule one next_after at a time, on random rules in zones with and without DST (half-hour and
45-minute offsets too), over weeks that hold DST days, under every DST policy."""

import random
from datetime import datetime, timedelta, timezone

import pytest

from dispatch import forecast_counts as fcounts
from schedules import timeexpr
from schedules.timeexpr.types import REPEATED_CHOICES, SKIPPED_CHOICES

UTC = timezone.utc
ZONES = ("UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata",
         "America/St_Johns", "Pacific/Chatham", "America/Santiago")
# Weeks holding a DST change in several of the zones above (both directions), and a quiet one.
WEEK_STARTS = (datetime(2026, 3, 5, 7, 13, tzinfo=UTC), datetime(2026, 3, 26, 22, 0, tzinfo=UTC),
               datetime(2026, 4, 2, 0, 30, tzinfo=UTC), datetime(2026, 9, 30, 11, 0, tzinfo=UTC),
               datetime(2026, 10, 22, 3, 47, tzinfo=UTC), datetime(2026, 10, 29, 0, 0, tzinfo=UTC),
               datetime(2026, 6, 10, 12, 0, tzinfo=UTC))


def _field(rng, lo, hi, star_weight=0.4):
    r = rng.random()
    if r < star_weight:
        return "*"
    if r < star_weight + 0.15:
        return f"*/{rng.choice((2, 3, 5, 7, 10, 15, 20))}"
    if r < star_weight + 0.3:
        a = rng.randint(lo, hi)
        b = rng.randint(a, hi)
        return f"{a}-{b}" + (f"/{rng.randint(1, 4)}" if rng.random() < 0.3 else "")
    return ",".join(str(v) for v in sorted(rng.sample(range(lo, hi + 1), rng.randint(1, 3))))


def _cron(rng):
    minute = _field(rng, 0, 59, 0.2)
    hour = _field(rng, 0, 23, 0.3)
    dom = "*" if rng.random() < 0.7 else _field(rng, 1, 28, 0.0)
    dow = "*" if rng.random() < 0.6 else _field(rng, 0, 6, 0.0)
    return f"{minute} {hour} {dom} * {dow}"


def _check(rule, lo, hi, rng):
    got = fcounts.occurrence_counts(rule, lo, hi)
    walked, cut = fcounts.walk(rule, lo, hi, limit=10 ** 9)
    assert not cut
    assert got.between(-10 ** 12, 10 ** 12) == walked, (rule, lo)
    assert len(got) == len(walked)
    lo_s, hi_s = fcounts.seconds(lo), fcounts.seconds(hi)
    for _ in range(30):
        a = rng.randint(lo_s - 3600, hi_s + 3600)
        b = a + rng.choice((60, 300, 3600, rng.randint(1, 200_000)))
        assert got.count(a, b) == sum(1 for t in walked if a <= t < b)
        first = got.first_at_or_after(a)
        assert first == next((t for t in walked if t >= a), None)


@pytest.mark.parametrize("seed", range(12))
def test_cron_counted_by_arithmetic_equals_the_walk(seed):
    rng = random.Random(seed)
    for _ in range(6):
        expression = _cron(rng)
        zone = rng.choice(ZONES)
        policy = timeexpr.DstPolicy(rng.choice(SKIPPED_CHOICES), rng.choice(REPEATED_CHOICES))
        try:
            rule = timeexpr.parse(expression, zone, anchor=datetime(2026, 1, 1, tzinfo=UTC), dst_policy=policy)
        except timeexpr.ExpressionError:
            continue  # a random rule that never fires
        lo = rng.choice(WEEK_STARTS) + timedelta(seconds=rng.randint(0, 86_400))
        _check(rule, lo, lo + timedelta(days=7, hours=1), rng)


@pytest.mark.parametrize("zone", ZONES)
def test_every_minute_and_fixed_times_across_each_zones_dst_days(zone):
    rng = random.Random(zone)
    for expression in ("* * * * *", "*/5 * * * *", "30 2 * * *", "0 1,2,3 * * *", "15 0-4 * * 0,6", "0 0 * * *"):
        for policy in (timeexpr.DstPolicy("next_valid", "earlier"), timeexpr.DstPolicy(SKIPPED_CHOICES[-1],
                                                                                       REPEATED_CHOICES[-1])):
            rule = timeexpr.parse(expression, zone, anchor=datetime(2026, 1, 1, tzinfo=UTC), dst_policy=policy)
            for lo in WEEK_STARTS:
                _check(rule, lo, lo + timedelta(days=7, hours=1), rng)


@pytest.mark.parametrize("seed", range(6))
def test_rate_counted_by_arithmetic_equals_the_walk(seed):
    rng = random.Random(seed)
    for _ in range(8):
        unit, n = rng.choice((("minute", rng.randint(1, 90)), ("hour", rng.randint(1, 30)), ("day", rng.randint(1, 3))))
        anchor = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=rng.randint(0, 90 * 86_400),
                                                              microseconds=rng.randint(0, 999_999))
        rule = timeexpr.parse(f"rate({n} {unit}{'s' if n > 1 else ''})", rng.choice(ZONES), anchor=anchor)
        lo = rng.choice(WEEK_STARTS) + timedelta(seconds=rng.randint(0, 86_400))
        _check(rule, lo, lo + timedelta(days=7, hours=1), rng)
        # A window before the anchor counts from the anchor on.
        _check(rule, anchor - timedelta(days=2), anchor + timedelta(days=5), rng)


def test_an_end_bounds_the_counts():
    rule = timeexpr.parse("*/10 * * * *", "Europe/Berlin", anchor=datetime(2026, 1, 1, tzinfo=UTC))
    lo = datetime(2026, 3, 28, tzinfo=UTC)
    end = lo + timedelta(hours=30)
    got = fcounts.occurrence_counts(rule, lo, lo + timedelta(days=7), end_at=end)
    assert got.between(-10 ** 12, 10 ** 12) == fcounts.walk(rule, lo, end, limit=10 ** 9)[0]


def test_other_rules_are_walked_and_bounded():
    # A month-day filter makes days differ: walked, and cut at the bound.
    rule = timeexpr.parse("RRULE:FREQ=SECONDLY;BYMONTHDAY=1,2,3,4,5,6,7,8", "UTC", anchor=datetime(2026, 1, 1, tzinfo=UTC))
    lo = datetime(2026, 3, 1, tzinfo=UTC)
    got = fcounts.occurrence_counts(rule, lo, lo + timedelta(days=7))
    assert fcounts.rrule_period(rule) is None
    assert got.truncated and len(got) == fcounts.RULE_OCCURRENCES


def test_a_periodic_rule_with_more_in_one_period_than_the_bound_is_cut_there():
    rule = timeexpr.parse("RRULE:FREQ=SECONDLY;BYHOUR=1,2,3,4,5,6,7,8,9,10", "UTC", anchor=datetime(2026, 1, 1, tzinfo=UTC))
    lo = datetime(2026, 3, 1, tzinfo=UTC)
    got = fcounts.occurrence_counts(rule, lo, lo + timedelta(days=7))
    assert fcounts.rrule_period(rule) == 86_400
    assert got.truncated and got.between(-10 ** 12, 10 ** 12) == fcounts.walk(rule, lo, lo + timedelta(days=7))[0]


def test_an_every_second_rule_is_counted_without_listing_its_week():
    rule = timeexpr.parse("RRULE:FREQ=SECONDLY", "UTC", anchor=datetime(2026, 1, 1, tzinfo=UTC))
    lo = datetime(2026, 3, 1, tzinfo=UTC)
    got = fcounts.occurrence_counts(rule, lo, lo + timedelta(days=7))
    assert isinstance(got, fcounts.PeriodicCounts) and not got.truncated
    assert len(got) == 7 * 86_400 and got.walked == 1
    assert got.count(fcounts.seconds(lo) + 10, fcounts.seconds(lo) + 70) == 60


def _rrule(rng):
    """A random RRULE, most of them of the shapes that repeat within a day."""
    freq = rng.choice(("SECONDLY", "MINUTELY", "MINUTELY", "HOURLY", "HOURLY", "DAILY"))
    parts = [f"FREQ={freq}"]
    if rng.random() < 0.4:
        parts.append(f"INTERVAL={rng.choice((1, 2, 3, 5, 7, 10, 15, 20, 45, 90))}")
    if freq != "SECONDLY" and rng.random() < 0.6:
        parts.append("BYSECOND=" + ",".join(str(v) for v in sorted(rng.sample(range(60), rng.randint(1, 2)))))
    if freq in ("HOURLY", "DAILY") and rng.random() < 0.6:
        parts.append("BYMINUTE=" + ",".join(str(v) for v in sorted(rng.sample(range(60), rng.randint(1, 3)))))
    if rng.random() < 0.3:
        parts.append("BYHOUR=" + ",".join(str(v) for v in sorted(rng.sample(range(24), rng.randint(1, 4)))))
    if freq == "SECONDLY":
        parts.append("BYMINUTE=" + ",".join(str(v) for v in sorted(rng.sample(range(60), 2))))
        parts.append("BYHOUR=" + str(rng.randint(0, 23)))
    if rng.random() < 0.15:
        parts.append("BYDAY=" + rng.choice(("MO,TU", "SA,SU", "WE")))
    if rng.random() < 0.1:
        parts.append(f"BYMONTHDAY={rng.randint(1, 28)}")
    return "RRULE:" + ";".join(parts)


@pytest.mark.parametrize("seed", range(10))
def test_rrules_counted_by_period_equal_the_walk(seed):
    rng = random.Random(seed)
    periodic = 0
    for _ in range(8):
        expression = _rrule(rng)
        zone = rng.choice(ZONES)
        policy = timeexpr.DstPolicy(rng.choice(SKIPPED_CHOICES), rng.choice(REPEATED_CHOICES))
        anchor = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=rng.randint(0, 300 * 86_400))
        try:
            rule = timeexpr.parse(expression, zone, anchor=anchor, dst_policy=policy)
        except timeexpr.ExpressionError:
            continue
        periodic += fcounts.rrule_period(rule) is not None
        lo = rng.choice(WEEK_STARTS) + timedelta(seconds=rng.randint(0, 86_400))
        if fcounts.walk(rule, lo, lo + timedelta(days=7, hours=1), limit=fcounts.RULE_OCCURRENCES)[1]:
            continue  # a rule counted by walking is cut at RULE_OCCURRENCES (its own test above)
        _check(rule, lo, lo + timedelta(days=7, hours=1), rng)
        # A window that starts before the rule's first instant counts from it on.
        _check(rule, anchor - timedelta(days=1, seconds=rng.randint(0, 3600)), anchor + timedelta(days=6), rng)
    assert periodic  # the seeds reach the arithmetic path
