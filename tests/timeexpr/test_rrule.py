"""RRULE: dateutil's naive wall times resolved through our DST handling."""

import pytest

from schedules.timeexpr import ExpressionError, parse

from .helpers import ats, run, utc

DAILY = [
    ("America/New_York", "DTSTART:20260101T023000\nRRULE:FREQ=DAILY", "2026-03-07T00:00Z", "2026-03-10T00:00Z",
     ["2026-03-07T07:30Z", "2026-03-08T07:00Z", "2026-03-09T06:30Z"]),
    ("America/New_York", "DTSTART;TZID=America/New_York:20260101T013000\nRRULE:FREQ=DAILY",
     "2026-10-31T00:00Z", "2026-11-03T00:00Z", ["2026-10-31T05:30Z", "2026-11-01T05:30Z", "2026-11-02T06:30Z"]),
    ("Europe/London", "RRULE:FREQ=DAILY;BYHOUR=1;BYMINUTE=30;BYSECOND=0", "2026-03-28T00:00Z", "2026-03-31T00:00Z",
     ["2026-03-28T01:30Z", "2026-03-29T01:00Z", "2026-03-30T00:30Z"]),
    ("Europe/London", "RRULE:FREQ=DAILY;BYHOUR=1;BYMINUTE=30;BYSECOND=0", "2026-10-24T00:00Z", "2026-10-27T00:00Z",
     ["2026-10-24T00:30Z", "2026-10-25T00:30Z", "2026-10-26T01:30Z"]),
    ("Australia/Sydney", "RRULE:FREQ=DAILY;BYHOUR=2;BYMINUTE=30;BYSECOND=0", "2026-10-02T12:00Z", "2026-10-05T12:00Z",
     ["2026-10-02T16:30Z", "2026-10-03T16:00Z", "2026-10-04T15:30Z"]),
    ("Australia/Lord_Howe", "RRULE:FREQ=DAILY;BYHOUR=1;BYMINUTE=45;BYSECOND=0", "2026-04-03T12:00Z", "2026-04-06T12:00Z",
     ["2026-04-03T14:45Z", "2026-04-04T14:45Z", "2026-04-05T15:15Z"]),
    ("Asia/Kolkata", "RRULE:FREQ=WEEKLY;BYDAY=MO,TH;BYHOUR=9;BYMINUTE=0;BYSECOND=0", "2026-03-01T00:00Z",
     "2026-03-08T00:00Z", ["2026-03-02T03:30Z", "2026-03-05T03:30Z"]),
]


@pytest.mark.parametrize("zone,expr,start,end,expected", DAILY)
def test_daily_rrule_is_fixed_time(zone, expr, start, end, expected):
    assert ats(expr, zone, start, end) == expected
    assert not parse(expr, zone, anchor=utc("2026-01-01T00:00Z")).sub_daily


HOURLY = [
    # The repeated hour is not lost: 01:00 EDT and 01:00 EST are two occurrences.
    ("America/New_York", "RRULE:FREQ=HOURLY;BYMINUTE=0;BYSECOND=0", "2026-11-01T04:00Z", "2026-11-01T08:00Z",
     ["2026-11-01T04:00Z", "2026-11-01T05:00Z", "2026-11-01T06:00Z", "2026-11-01T07:00Z"]),
    # And nothing at the nonexistent 02:00.
    ("America/New_York", "RRULE:FREQ=HOURLY;BYMINUTE=0;BYSECOND=0", "2026-03-08T05:00Z", "2026-03-08T09:00Z",
     ["2026-03-08T05:00Z", "2026-03-08T06:00Z", "2026-03-08T07:00Z", "2026-03-08T08:00Z"]),
    ("Europe/London", "RRULE:FREQ=HOURLY;BYMINUTE=30;BYSECOND=0", "2026-10-24T23:00Z", "2026-10-25T03:00Z",
     ["2026-10-24T23:30Z", "2026-10-25T00:30Z", "2026-10-25T01:30Z", "2026-10-25T02:30Z"]),
    ("Australia/Lord_Howe", "RRULE:FREQ=HOURLY;BYMINUTE=45;BYSECOND=0", "2026-10-03T14:00Z", "2026-10-03T17:00Z",
     ["2026-10-03T14:15Z", "2026-10-03T15:15Z", "2026-10-03T15:45Z", "2026-10-03T16:45Z"]),
    ("Australia/Sydney", "RRULE:FREQ=HOURLY;BYMINUTE=0;BYSECOND=0", "2026-04-04T14:00Z", "2026-04-04T18:00Z",
     ["2026-04-04T14:00Z", "2026-04-04T15:00Z", "2026-04-04T16:00Z", "2026-04-04T17:00Z"]),
    # Anchor 2026-01-01T00:00Z is 05:30 in Kolkata: every 20 minutes from there.
    ("Asia/Kolkata", "RRULE:FREQ=MINUTELY;INTERVAL=20;BYSECOND=0", "2026-03-08T00:00Z", "2026-03-08T01:00Z",
     ["2026-03-08T00:00Z", "2026-03-08T00:20Z", "2026-03-08T00:40Z"]),
]


@pytest.mark.parametrize("zone,expr,start,end,expected", HOURLY)
def test_hourly_rrule_steps_through_real_instants(zone, expr, start, end, expected):
    anchor = utc("2026-01-01T00:00Z")
    assert ats(expr, zone, start, end, anchor=anchor) == expected
    assert parse(expr, zone, anchor=anchor).sub_daily


def test_default_dtstart_is_the_anchor_wall_time():
    # Anchor 14:15Z = 09:15 EST: a bare FREQ=DAILY fires at 09:15 wall time, EDT included.
    got = ats("RRULE:FREQ=DAILY", "America/New_York", "2026-03-07T00:00Z", "2026-03-10T00:00Z",
              anchor=utc("2026-01-05T14:15:00Z"))
    assert got == ["2026-03-07T14:15Z", "2026-03-08T13:15Z", "2026-03-09T13:15Z"]


def test_count_and_until_are_respected():
    rule = parse("DTSTART:20260101T090000\nRRULE:FREQ=DAILY;COUNT=3", "Europe/Paris", anchor=utc("2025-06-01T00:00Z"))
    assert [o.at for o in rule.iter_after(utc("2025-01-01T00:00Z"))] == [
        utc("2026-01-01T08:00Z"), utc("2026-01-02T08:00Z"), utc("2026-01-03T08:00Z")]
    assert rule.next_after(utc("2026-01-03T08:00Z")) is None
    # UNTIL in UTC is an instant: 08:00Z on the 3rd is 09:00 Paris, included.
    until = parse("DTSTART:20260101T090000\nRRULE:FREQ=DAILY;UNTIL=20260103T080000Z", "Europe/Paris",
                  anchor=utc("2025-06-01T00:00Z"))
    assert len(list(until.iter_after(utc("2025-01-01T00:00Z")))) == 3


def test_count_counts_wall_times_so_a_repeated_hour_adds_one():
    got = run("DTSTART:20261101T000000\nRRULE:FREQ=HOURLY;COUNT=3", "America/New_York",
              "2026-10-01T00:00Z", "2026-12-01T00:00Z", anchor=utc("2026-10-01T00:00Z"))
    assert [a for a, _, _ in got] == ["2026-11-01T04:00Z", "2026-11-01T05:00Z", "2026-11-01T06:00Z", "2026-11-01T07:00Z"]


def test_asking_backwards_after_a_far_jump_still_sees_early_occurrences():
    rule = parse("RRULE:FREQ=MINUTELY;INTERVAL=7", "UTC", anchor=utc("2020-01-01T00:03Z"))
    far = rule.next_after(utc("2026-06-01T00:00Z")).at
    assert (far - utc("2020-01-01T00:03Z")).total_seconds() % 420 == 0
    assert rule.next_after(utc("2020-01-01T00:00Z")).at == utc("2020-01-01T00:03Z")
    assert rule.next_after(utc("2023-01-01T00:00Z")).at > utc("2023-01-01T00:00Z")


@pytest.mark.parametrize("expr,fragment", [
    ("RRULE:FREQ=FORTNIGHTLY", "FREQ"),
    ("RRULE:FREQ=DAILY;COUNT=2;UNTIL=20260101T000000Z", "COUNT and UNTIL"),
    ("DTSTART:2026\nRRULE:FREQ=DAILY", "DTSTART"),
    ("DTSTART;TZID=Europe/Paris:20260101T090000\nRRULE:FREQ=DAILY", "differs"),
    ("RRULE:FREQ=DAILY\nEXDATE:20260101T090000", "unsupported line"),
    ("RRULE:FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=30", "never fires"),
    ("RRULE:FREQ=MINUTELY;BYMONTH=2;BYMONTHDAY=30", "never fires"),
    ("DTSTART:20200101T090000\nRRULE:FREQ=DAILY;COUNT=2", "never fires"),
    ("RRULE:FREQ=DAILY;BYHOUR=25", "bad RRULE"),
])
def test_bad_rrules(expr, fragment):
    with pytest.raises(ExpressionError) as exc:
        parse(expr, "America/New_York", anchor=utc("2026-01-01T00:00Z"))
    assert exc.value.field == "expression"
    assert fragment in str(exc.value)
