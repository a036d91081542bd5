"""cron under the default DST policy (next_valid, earlier), both sides of each transition."""

import pytest

from .helpers import ats, run

# (zone, expression, window start, window end, expected UTC instants). Windows span the day
# before, the transition day and the day after, so both sides of each transition are covered.
DAILY = [
    # New York spring: 02:30 does not exist on 2026-03-08 -> 03:00 EDT = 07:00Z.
    ("America/New_York", "30 2 * * *", "2026-03-07T00:00Z", "2026-03-10T00:00Z",
     ["2026-03-07T07:30Z", "2026-03-08T07:00Z", "2026-03-09T06:30Z"]),
    # New York fall: 01:30 happens twice on 2026-11-01 -> once, at EDT (05:30Z), not 06:30Z.
    ("America/New_York", "30 1 * * *", "2026-10-31T00:00Z", "2026-11-03T00:00Z",
     ["2026-10-31T05:30Z", "2026-11-01T05:30Z", "2026-11-02T06:30Z"]),
    # Unaffected time on the transition days keeps its wall time.
    ("America/New_York", "0 9 * * *", "2026-03-07T00:00Z", "2026-03-10T00:00Z",
     ["2026-03-07T14:00Z", "2026-03-08T13:00Z", "2026-03-09T13:00Z"]),
    ("America/New_York", "0 9 * * *", "2026-10-31T00:00Z", "2026-11-03T00:00Z",
     ["2026-10-31T13:00Z", "2026-11-01T14:00Z", "2026-11-02T14:00Z"]),
    # London: spring 2026-03-29 01:00 -> 02:00, fall 2026-10-25 02:00 -> 01:00.
    ("Europe/London", "30 1 * * *", "2026-03-28T00:00Z", "2026-03-31T00:00Z",
     ["2026-03-28T01:30Z", "2026-03-29T01:00Z", "2026-03-30T00:30Z"]),
    ("Europe/London", "30 1 * * *", "2026-10-24T00:00Z", "2026-10-27T00:00Z",
     ["2026-10-24T00:30Z", "2026-10-25T00:30Z", "2026-10-26T01:30Z"]),
    # Sydney (southern hemisphere): spring 2026-10-04 02:00 -> 03:00, fall 2026-04-05 03:00 -> 02:00.
    ("Australia/Sydney", "30 2 * * *", "2026-10-02T12:00Z", "2026-10-05T12:00Z",
     ["2026-10-02T16:30Z", "2026-10-03T16:00Z", "2026-10-04T15:30Z"]),
    ("Australia/Sydney", "30 2 * * *", "2026-04-03T12:00Z", "2026-04-06T12:00Z",
     ["2026-04-03T15:30Z", "2026-04-04T15:30Z", "2026-04-05T16:30Z"]),
    # Lord Howe: 30-minute shift. Spring 2026-10-04 02:00 -> 02:30, fall 2026-04-05 02:00 -> 01:30.
    ("Australia/Lord_Howe", "15 2 * * *", "2026-10-02T12:00Z", "2026-10-05T12:00Z",
     ["2026-10-02T15:45Z", "2026-10-03T15:30Z", "2026-10-04T15:15Z"]),
    ("Australia/Lord_Howe", "45 1 * * *", "2026-04-03T12:00Z", "2026-04-06T12:00Z",
     ["2026-04-03T14:45Z", "2026-04-04T14:45Z", "2026-04-05T15:15Z"]),
    # Kolkata: no DST, +05:30 all year.
    ("Asia/Kolkata", "30 2 * * *", "2026-03-07T00:00Z", "2026-03-10T00:00Z",
     ["2026-03-07T21:00Z", "2026-03-08T21:00Z", "2026-03-09T21:00Z"]),
]


@pytest.mark.parametrize("zone,expr,start,end,expected", DAILY)
def test_daily_fixed_time_cron(zone, expr, start, end, expected):
    assert ats(expr, zone, start, end) == expected


SUB_DAILY = [
    # Fall: both passes of 01:30 fire.
    ("America/New_York", "30 * * * *", "2026-11-01T04:00Z", "2026-11-01T08:00Z",
     ["2026-11-01T04:30Z", "2026-11-01T05:30Z", "2026-11-01T06:30Z", "2026-11-01T07:30Z"]),
    # Spring: nothing at the nonexistent 02:30.
    ("America/New_York", "30 * * * *", "2026-03-08T05:00Z", "2026-03-08T09:00Z",
     ["2026-03-08T05:30Z", "2026-03-08T06:30Z", "2026-03-08T07:30Z", "2026-03-08T08:30Z"]),
    ("Europe/London", "0 * * * *", "2026-03-29T00:00Z", "2026-03-29T03:00Z",
     ["2026-03-29T00:00Z", "2026-03-29T01:00Z", "2026-03-29T02:00Z"]),
    ("Europe/London", "30 1 * * *", "2026-10-24T00:00Z", "2026-10-24T00:00Z", []),
    ("Europe/London", "*/30 1 * * *", "2026-10-25T00:00Z", "2026-10-25T03:00Z",
     ["2026-10-25T00:00Z", "2026-10-25T00:30Z", "2026-10-25T01:00Z", "2026-10-25T01:30Z"]),
    ("Australia/Sydney", "0 * * * *", "2026-10-03T14:00Z", "2026-10-03T18:00Z",
     ["2026-10-03T14:00Z", "2026-10-03T15:00Z", "2026-10-03T16:00Z", "2026-10-03T17:00Z"]),
    ("Australia/Sydney", "0 * * * *", "2026-04-04T14:00Z", "2026-04-04T18:00Z",
     ["2026-04-04T14:00Z", "2026-04-04T15:00Z", "2026-04-04T16:00Z", "2026-04-04T17:00Z"]),
    # Lord Howe spring: 01:45 (+10:30) then, 30 real minutes later, 02:45 (+11:00).
    ("Australia/Lord_Howe", "45 * * * *", "2026-10-03T14:00Z", "2026-10-03T17:00Z",
     ["2026-10-03T14:15Z", "2026-10-03T15:15Z", "2026-10-03T15:45Z", "2026-10-03T16:45Z"]),
    # Lord Howe fall: 01:45 happens at +11:00 and again 30 real minutes later at +10:30.
    ("Australia/Lord_Howe", "45 * * * *", "2026-04-04T13:00Z", "2026-04-04T17:00Z",
     ["2026-04-04T13:45Z", "2026-04-04T14:45Z", "2026-04-04T15:15Z", "2026-04-04T16:15Z"]),
    ("Asia/Kolkata", "*/20 * * * *", "2026-03-08T00:00Z", "2026-03-08T01:00Z",
     ["2026-03-08T00:10Z", "2026-03-08T00:30Z", "2026-03-08T00:50Z"]),
]


@pytest.mark.parametrize("zone,expr,start,end,expected", SUB_DAILY)
def test_sub_daily_cron_fires_at_every_real_matching_instant(zone, expr, start, end, expected):
    assert ats(expr, zone, start, end) == expected


def test_the_moved_and_repeated_occurrences_say_why():
    spring = run("30 2 * * *", "America/New_York", "2026-03-08T00:00Z", "2026-03-09T00:00Z")
    assert spring == [("2026-03-08T07:00Z", "2026-03-08T03:00-0400", "moved")]
    fall = run("30 1 * * *", "America/New_York", "2026-11-01T00:00Z", "2026-11-02T00:00Z")
    assert fall == [("2026-11-01T05:30Z", "2026-11-01T01:30-0400", "repeated")]


def test_macros_are_cron_text():
    assert ats("@daily", "Europe/London", "2026-03-28T00:00Z", "2026-03-31T00:00Z") == [
        "2026-03-28T00:00Z", "2026-03-29T00:00Z", "2026-03-29T23:00Z", "2026-03-30T23:00Z"]
    assert ats("@hourly", "UTC", "2026-01-01T00:00Z", "2026-01-01T03:00Z") == [
        "2026-01-01T00:00Z", "2026-01-01T01:00Z", "2026-01-01T02:00Z"]
    assert ats("@weekly", "UTC", "2026-01-01T00:00Z", "2026-01-15T00:00Z") == [
        "2026-01-04T00:00Z", "2026-01-11T00:00Z"]
    assert ats("@monthly", "UTC", "2026-01-01T00:00Z", "2026-03-01T00:00Z") == [
        "2026-01-01T00:00Z", "2026-02-01T00:00Z"]
    assert ats("@yearly", "UTC", "2026-01-01T00:00Z", "2028-01-01T00:00Z") == [
        "2026-01-01T00:00Z", "2027-01-01T00:00Z"]


def test_names_ranges_lists_and_steps():
    assert ats("0 9-17/4 * JAN MON-FRI", "UTC", "2026-01-02T00:00Z", "2026-01-06T00:00Z") == [
        "2026-01-02T09:00Z", "2026-01-02T13:00Z", "2026-01-02T17:00Z",
        "2026-01-05T09:00Z", "2026-01-05T13:00Z", "2026-01-05T17:00Z"]
    # Debian: when neither day field starts with '*', day-of-month OR day-of-week.
    assert ats("0 0 13 * FRI", "UTC", "2026-02-01T00:00Z", "2026-02-15T00:00Z") == [
        "2026-02-06T00:00Z", "2026-02-13T00:00Z"]


def test_leap_day_rule_crosses_the_eight_year_gap_of_2100():
    assert ats("0 0 29 2 *", "UTC", "2096-03-01T00:00Z", "2105-01-01T00:00Z") == ["2104-02-29T00:00Z"]


def test_classification_follows_debian():
    from schedules.timeexpr import parse

    from .helpers import ANCHOR

    assert not parse("30 2 * * *", "UTC", anchor=ANCHOR).sub_daily
    assert not parse("0,30 1-3 * * *", "UTC", anchor=ANCHOR).sub_daily
    assert parse("*/5 2 * * *", "UTC", anchor=ANCHOR).sub_daily
    assert parse("0 */2 * * *", "UTC", anchor=ANCHOR).sub_daily
    assert parse("@hourly", "UTC", anchor=ANCHOR).sub_daily
    assert not parse("@daily", "UTC", anchor=ANCHOR).sub_daily
