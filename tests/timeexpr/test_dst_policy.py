"""Every dstPolicy combination on the spring and fall days, for fixed-time rules."""

import itertools

import pytest

from .helpers import run

SKIPPED = {
    # zone, expression, window, {skipped: [(at, local, note kind, dropped)]}
    ("America/New_York", "30 2 * * *", "2026-03-08T00:00Z", "2026-03-09T00:00Z"): {
        "next_valid": [("2026-03-08T07:00Z", "2026-03-08T03:00-0400", "moved")],
        "shift": [("2026-03-08T07:30Z", "2026-03-08T03:30-0400", "shifted")],
        "skip": [("2026-03-08T07:00Z", "2026-03-08T03:00-0400", "dropped")],
    },
    ("Australia/Lord_Howe", "15 2 * * *", "2026-10-03T12:00Z", "2026-10-04T12:00Z"): {
        "next_valid": [("2026-10-03T15:30Z", "2026-10-04T02:30+1100", "moved")],
        "shift": [("2026-10-03T15:45Z", "2026-10-04T02:45+1100", "shifted")],
        "skip": [("2026-10-03T15:30Z", "2026-10-04T02:30+1100", "dropped")],
    },
    ("America/New_York", "at(2026-03-08T02:30:00)", "2026-03-08T00:00Z", "2026-03-09T00:00Z"): {
        "next_valid": [("2026-03-08T07:00Z", "2026-03-08T03:00-0400", "moved")],
        "shift": [("2026-03-08T07:30Z", "2026-03-08T03:30-0400", "shifted")],
        "skip": [("2026-03-08T07:00Z", "2026-03-08T03:00-0400", "dropped")],
    },
    ("Europe/London", "DTSTART:20260101T013000\nRRULE:FREQ=DAILY", "2026-03-29T00:00Z", "2026-03-30T00:00Z"): {
        "next_valid": [("2026-03-29T01:00Z", "2026-03-29T02:00+0100", "moved")],
        "shift": [("2026-03-29T01:30Z", "2026-03-29T02:30+0100", "shifted")],
        "skip": [("2026-03-29T01:00Z", "2026-03-29T02:00+0100", "dropped")],
    },
}

REPEATED = {
    ("America/New_York", "30 1 * * *", "2026-11-01T00:00Z", "2026-11-02T00:00Z"): {
        "earlier": [("2026-11-01T05:30Z", "2026-11-01T01:30-0400", "repeated")],
        "later": [("2026-11-01T06:30Z", "2026-11-01T01:30-0500", "repeated")],
        "both": [("2026-11-01T05:30Z", "2026-11-01T01:30-0400", "repeated"),
                 ("2026-11-01T06:30Z", "2026-11-01T01:30-0500", "repeated")],
    },
    ("Australia/Lord_Howe", "45 1 * * *", "2026-04-04T12:00Z", "2026-04-05T12:00Z"): {
        "earlier": [("2026-04-04T14:45Z", "2026-04-05T01:45+1100", "repeated")],
        "later": [("2026-04-04T15:15Z", "2026-04-05T01:45+1030", "repeated")],
        "both": [("2026-04-04T14:45Z", "2026-04-05T01:45+1100", "repeated"),
                 ("2026-04-04T15:15Z", "2026-04-05T01:45+1030", "repeated")],
    },
    ("Australia/Sydney", "at(2026-04-05T02:30:00)", "2026-04-04T12:00Z", "2026-04-05T12:00Z"): {
        "earlier": [("2026-04-04T15:30Z", "2026-04-05T02:30+1100", "repeated")],
        "later": [("2026-04-04T16:30Z", "2026-04-05T02:30+1000", "repeated")],
        "both": [("2026-04-04T15:30Z", "2026-04-05T02:30+1100", "repeated"),
                 ("2026-04-04T16:30Z", "2026-04-05T02:30+1000", "repeated")],
    },
    ("Europe/London", "DTSTART:20260101T013000\nRRULE:FREQ=DAILY", "2026-10-25T00:00Z", "2026-10-26T00:00Z"): {
        "earlier": [("2026-10-25T00:30Z", "2026-10-25T01:30+0100", "repeated")],
        "later": [("2026-10-25T01:30Z", "2026-10-25T01:30+0000", "repeated")],
        "both": [("2026-10-25T00:30Z", "2026-10-25T01:30+0100", "repeated"),
                 ("2026-10-25T01:30Z", "2026-10-25T01:30+0000", "repeated")],
    },
}

COMBOS = list(itertools.product(["next_valid", "shift", "skip"], ["earlier", "later", "both"]))


@pytest.mark.parametrize("skipped,repeated", COMBOS)
@pytest.mark.parametrize("case", list(SKIPPED))
def test_spring_day_follows_skipped_whatever_repeated_says(case, skipped, repeated):
    zone, expr, start, end = case
    got = run(expr, zone, start, end, policy={"skipped": skipped, "repeated": repeated})
    assert got == SKIPPED[case][skipped]


@pytest.mark.parametrize("skipped,repeated", COMBOS)
@pytest.mark.parametrize("case", list(REPEATED))
def test_fall_day_follows_repeated_whatever_skipped_says(case, skipped, repeated):
    zone, expr, start, end = case
    got = run(expr, zone, start, end, policy={"skipped": skipped, "repeated": repeated})
    assert got == REPEATED[case][repeated]


def test_skip_returns_the_dropped_occurrence_flagged_for_the_scheduler():
    from schedules.timeexpr import DstPolicy, parse

    from .helpers import ANCHOR, utc

    rule = parse("30 2 * * *", "America/New_York", anchor=ANCHOR, dst_policy=DstPolicy(skipped="skip"))
    occ = rule.next_after(utc("2026-03-07T12:00Z"))
    assert occ.dropped and occ.note == "dropped: 02:30 does not exist on 2026-03-08 (dstPolicy skipped=skip)"
    assert occ.wall == "2026-03-08T02:30:00"
    assert not rule.next_after(occ.at).dropped


@pytest.mark.parametrize("skipped,repeated", COMBOS)
def test_policy_never_touches_sub_daily_rules(skipped, repeated):
    policy = {"skipped": skipped, "repeated": repeated}
    assert run("30 * * * *", "America/New_York", "2026-11-01T04:00Z", "2026-11-01T08:00Z", policy=policy) == \
        run("30 * * * *", "America/New_York", "2026-11-01T04:00Z", "2026-11-01T08:00Z")


def test_gap_times_that_collapse_to_one_instant_fire_once_and_real_time_wins():
    # 02:00, 02:30 and 03:00 all land on 03:00 EDT under next_valid; one occurrence, the real 03:00.
    got = run("0,30 2,3 * * *", "America/New_York", "2026-03-08T06:00Z", "2026-03-08T08:00Z")
    assert got == [("2026-03-08T07:00Z", "2026-03-08T03:00-0400", None),
                   ("2026-03-08T07:30Z", "2026-03-08T03:30-0400", None)]
    # Under shift 02:30 -> 03:30 ties with the real 03:30 and 02:00 -> 03:00 with the real 03:00.
    shifted = run("0,30 2,3 * * *", "America/New_York", "2026-03-08T06:00Z", "2026-03-08T08:00Z",
                  policy={"skipped": "shift"})
    assert shifted == got
