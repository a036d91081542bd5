"""at() and rate()."""

from datetime import datetime, timedelta

import pytest

from schedules.timeexpr import parse

from .helpers import UTC, ats, run, utc

AT = [
    # Local wall time in the zone, default policy, both sides of the New York transitions.
    ("America/New_York", "at(2026-03-07T02:30:00)", ["2026-03-07T07:30Z"]),
    ("America/New_York", "at(2026-03-08T02:30:00)", ["2026-03-08T07:00Z"]),
    ("America/New_York", "at(2026-11-01T01:30:00)", ["2026-11-01T05:30Z"]),
    ("America/New_York", "at(2026-11-02T01:30:00)", ["2026-11-02T06:30Z"]),
    ("Europe/London", "at(2026-03-29T01:30:00)", ["2026-03-29T01:00Z"]),
    ("Europe/London", "at(2026-10-25T01:30:00)", ["2026-10-25T00:30Z"]),
    ("Australia/Sydney", "at(2026-10-04T02:30:00)", ["2026-10-03T16:00Z"]),
    ("Australia/Sydney", "at(2026-04-05T02:30:00)", ["2026-04-04T15:30Z"]),
    ("Australia/Lord_Howe", "at(2026-10-04T02:15:00)", ["2026-10-03T15:30Z"]),
    ("Australia/Lord_Howe", "at(2026-04-05T01:45:00)", ["2026-04-04T14:45Z"]),
    ("Asia/Kolkata", "at(2026-12-01T09:00:00)", ["2026-12-01T03:30Z"]),
    # An offset or Z makes it an absolute instant whatever the zone.
    ("Asia/Kolkata", "at(2026-12-01T09:00:00Z)", ["2026-12-01T09:00Z"]),
    ("America/New_York", "at(2026-03-08T02:30:00-05:00)", ["2026-03-08T07:30Z"]),
]


@pytest.mark.parametrize("zone,expr,expected", AT)
def test_at_is_one_instant(zone, expr, expected):
    assert ats(expr, zone, "2026-01-01T00:00Z", "2027-01-01T00:00Z") == expected


def test_at_returns_nothing_once_passed():
    rule = parse("at(2026-12-01T09:00:00)", "Europe/Paris", anchor=utc("2026-01-01T00:00Z"))
    occ = rule.next_after(utc("2026-12-01T07:59:59Z"))
    assert occ.at == utc("2026-12-01T08:00:00Z")
    assert rule.next_after(occ.at) is None


def test_at_in_the_past_still_parses():
    rule = parse("at(2020-01-01T00:00:00Z)", "UTC", anchor=utc("2026-01-01T00:00Z"))
    assert rule.next_after(utc("2026-01-01T00:00Z")) is None
    assert rule.next_after(utc("2019-12-31T00:00Z")).at == utc("2020-01-01T00:00Z")


RATE_ZONES = ["America/New_York", "Europe/London", "Australia/Sydney", "Australia/Lord_Howe", "Asia/Kolkata"]


@pytest.mark.parametrize("zone", RATE_ZONES)
@pytest.mark.parametrize("window", [("2026-03-08T05:00Z", "2026-03-08T09:00Z"),
                                    ("2026-11-01T04:00Z", "2026-11-01T08:00Z"),
                                    ("2026-10-03T14:00Z", "2026-10-03T18:00Z"),
                                    ("2026-04-04T13:00Z", "2026-04-04T17:00Z")])
def test_rate_is_elapsed_time_whatever_the_zone(zone, window):
    anchor = utc("2026-01-01T00:07Z")
    got = ats("rate(1 hour)", zone, *window, anchor=anchor)
    start = utc(window[0])
    expected = [(start + timedelta(minutes=7 + 60 * k)).strftime("%Y-%m-%dT%H:%MZ") for k in range(4)]
    assert got == expected


def test_rate_counts_the_anchor_itself_and_whole_intervals_from_it():
    anchor = datetime(2026, 3, 7, 12, 0, 30, 999_999, tzinfo=UTC)
    rule = parse("rate(2 days)", "America/New_York", anchor=anchor)
    # Truncated to the second; the anchor is the first occurrence.
    first = rule.next_after(anchor - timedelta(seconds=5))
    assert first.at == datetime(2026, 3, 7, 12, 0, 30, tzinfo=UTC)
    second = rule.next_after(first.at)
    assert second.at - first.at == timedelta(days=2)
    # Across the spring change: 48 real hours, so 08:00:30 EST then 09:00:30 EDT on the wall.
    assert (first.local.hour, second.local.hour) == (7, 8)
    assert second.note is None


@pytest.mark.parametrize("text,interval", [
    ("rate(1 minute)", timedelta(minutes=1)), ("rate(15 minutes)", timedelta(minutes=15)),
    ("rate(1 hour)", timedelta(hours=1)), ("rate(3 hours)", timedelta(hours=3)),
    ("rate(1 day)", timedelta(days=1)), ("rate(2 days)", timedelta(days=2)),
    ("RATE( 5  Minutes )", timedelta(minutes=5)),
])
def test_rate_units(text, interval):
    anchor = utc("2026-01-01T00:00Z")
    rule = parse(text, "UTC", anchor=anchor)
    assert rule.next_after(anchor).at - anchor == interval
    assert rule.sub_daily == (interval < timedelta(days=1))


def test_rate_fires_mid_window_without_drift():
    anchor = utc("2026-01-01T00:00Z")
    rule = parse("rate(7 minutes)", "UTC", anchor=anchor)
    after = anchor + timedelta(days=365, seconds=1)
    occ = rule.next_after(after)
    assert (occ.at - anchor) % timedelta(minutes=7) == timedelta(0)
    assert timedelta(0) < occ.at - after <= timedelta(minutes=7)


def test_wire_form():
    from schedules.timeexpr import to_wire

    rule = parse("30 2 * * *", "America/New_York", anchor=utc("2026-01-01T00:00Z"))
    wire = to_wire(rule.next_after(utc("2026-03-07T12:00Z")))
    assert wire["at"] == "2026-03-08T07:00:00Z"
    assert wire["local"] == "2026-03-08T03:00:00-04:00"
    assert wire["wall"] == "2026-03-08T02:30:00"
    assert wire["note"].startswith("moved: 02:30 does not exist")
    assert run("0 3 * * *", "UTC", "2026-01-01T00:00Z", "2026-01-02T00:00Z") == [
        ("2026-01-01T03:00Z", "2026-01-01T03:00+0000", None)]
