"""RRULE COUNT and UNTIL across DST transitions (issue 13, items 2 and 3).

COUNT counts wall-clock recurrences (RFC 5545): a sub-daily rule's wall time in a repeated hour
happens twice and is one recurrence, so it adds an occurrence; UNTIL in UTC is an instant that
bounds the occurrences whatever the dstPolicy did to them.
"""

from datetime import datetime, timezone

import pytest

from schedules.timeexpr import DstPolicy, parse

from .helpers import utc

UTC = timezone.utc
NY = "America/New_York"
POLICIES = [DstPolicy(s, r) for s in ("next_valid", "shift", "skip") for r in ("earlier", "later", "both")]


def _all(expr, zone=NY, policy=None, anchor="2026-01-01T00:00Z"):
    rule = parse(expr, zone, anchor=utc(anchor), dst_policy=policy)
    return [(o.at.strftime("%Y-%m-%dT%H:%MZ"), o.dropped) for o in rule.iter_after(utc("2025-01-01T00:00Z"))]


def test_hourly_count_across_a_repeated_hour_adds_its_second_pass():
    got = _all("DTSTART:20261101T000000\nRRULE:FREQ=HOURLY;COUNT=2")
    assert [a for a, _ in got] == ["2026-11-01T04:00Z", "2026-11-01T05:00Z", "2026-11-01T06:00Z"]


def test_hourly_until_across_a_repeated_hour_keeps_its_second_pass():
    got = _all("DTSTART:20261101T000000\nRRULE:FREQ=HOURLY;UNTIL=20261101T060000Z")
    assert [a for a, _ in got] == ["2026-11-01T04:00Z", "2026-11-01T05:00Z", "2026-11-01T06:00Z"]


def test_hourly_count_across_a_skipped_hour_loses_it():
    # Wall times 00:00, 01:00, 02:00 (does not exist on 2026-03-08), 03:00.
    got = _all("DTSTART:20260308T000000\nRRULE:FREQ=HOURLY;COUNT=4")
    assert [a for a, _ in got] == ["2026-03-08T05:00Z", "2026-03-08T06:00Z", "2026-03-08T07:00Z"]


def test_daily_until_in_utc_includes_the_repeated_morning_before_it():
    # Issue: DTSTART:20261025T013000 + UNTIL=20261101T060000Z missed 2026-11-01T05:30Z.
    got = _all("DTSTART:20261025T013000\nRRULE:FREQ=DAILY;UNTIL=20261101T060000Z")
    assert got[-1] == ("2026-11-01T05:30Z", False)
    assert len(got) == 8


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: f"{p.skipped}-{p.repeated}")
def test_daily_until_in_utc_never_fires_after_it_under_any_policy(policy):
    # Issue: UNTIL=20261101T054500Z with repeated=later fired 06:30Z.
    until = utc("2026-11-01T05:45Z")
    got = _all("DTSTART:20261025T013000\nRRULE:FREQ=DAILY;UNTIL=20261101T054500Z", policy=policy)
    assert all(utc(a) <= until for a, _ in got)
    last_day = [a for a, _ in got if a.startswith("2026-11-01")]
    assert last_day == ([] if policy.repeated == "later" else ["2026-11-01T05:30Z"])
    assert len([a for a, _ in got if a < "2026-11-01"]) == 7


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: f"{p.skipped}-{p.repeated}")
def test_daily_until_in_utc_in_spring_under_any_policy(policy):
    # Issue: DTSTART:20260301T023000 + UNTIL=20260308T070000Z with skipped=shift fired 07:30Z.
    until = utc("2026-03-08T07:00Z")
    got = _all("DTSTART:20260301T023000\nRRULE:FREQ=DAILY;UNTIL=20260308T070000Z",
               policy=policy, anchor="2026-02-01T00:00Z")
    assert all(utc(a) <= until for a, _ in got)
    spring = [(a, d) for a, d in got if a.startswith("2026-03-08")]
    if policy.skipped == "shift":
        assert spring == []  # 02:30 keeps EST: 07:30Z, after UNTIL
    else:
        assert spring == [("2026-03-08T07:00Z", policy.skipped == "skip")]
    assert len(got) == 7 + len(spring)


def test_count_counts_wall_times_of_a_fixed_time_rule_even_when_policy_doubles_one():
    got = _all("DTSTART:20261030T013000\nRRULE:FREQ=DAILY;COUNT=3", policy=DstPolicy("next_valid", "both"))
    assert [a for a, _ in got] == ["2026-10-30T05:30Z", "2026-10-31T05:30Z", "2026-11-01T05:30Z",
                                   "2026-11-01T06:30Z"]


def test_until_as_a_local_wall_time_bounds_wall_times():
    # Without Z, UNTIL is the zone's wall time, like DTSTART: 01:30 on 1 November is included
    # and both of its instants fire under repeated=both.
    got = _all("DTSTART:20261030T013000\nRRULE:FREQ=DAILY;UNTIL=20261101T013000",
               policy=DstPolicy("next_valid", "both"))
    assert [a for a, _ in got][-2:] == ["2026-11-01T05:30Z", "2026-11-01T06:30Z"]


def test_lord_howe_half_hour_repeat_adds_one_to_a_minutely_count():
    # 2026-04-05 02:00 (+11:00) falls back to 01:30 (+10:30) at 15:00Z: wall 01:45 happens at
    # 14:45Z and 15:15Z, wall 02:00 only after the change (15:30Z). Two wall times, three instants.
    got = _all("DTSTART:20260405T014500\nRRULE:FREQ=MINUTELY;INTERVAL=15;COUNT=2", zone="Australia/Lord_Howe")
    assert [a for a, _ in got] == ["2026-04-04T14:45Z", "2026-04-04T15:15Z", "2026-04-04T15:30Z"]


def test_until_given_as_an_instant_is_compared_as_one_in_any_zone():
    for zone in ("UTC", "Asia/Kolkata", "Pacific/Kiritimati", "America/Adak"):
        rule = parse("DTSTART:20260101T000000\nRRULE:FREQ=HOURLY;UNTIL=20260102T000000Z", zone,
                     anchor=datetime(2026, 1, 1, tzinfo=UTC))
        ats = [o.at for o in rule.iter_after(datetime(2025, 1, 1, tzinfo=UTC))]
        assert ats[-1] <= datetime(2026, 1, 2, tzinfo=UTC) < ats[-1] + (ats[1] - ats[0]) + (ats[1] - ats[0])
