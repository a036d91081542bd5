"""Every rejection is an ExpressionError naming the field at fault."""

import pytest

from schedules.timeexpr import DstPolicy, ExpressionError, parse, validate_time_zone

from .helpers import ANCHOR


@pytest.mark.parametrize("expr,fragment", [
    ("", "empty"),
    ("* * * *", "5 fields"),
    ("* * * * * *", "5 fields"),
    ("61 * * * *", "minute"),
    ("0 24 * * *", "hour"),
    ("0 0 0 * *", "day-of-month"),
    ("0 0 * 13 *", "month"),
    ("0 0 * * 8", "day-of-week"),
    ("0 0 * FOO *", "month"),
    ("*/0 * * * *", "minute"),
    ("@reboot", "macro"),
    ("0 0 30 2 *", "never fires"),
    ("0 0 31 4,6 *", "never fires"),
    ("rate(0 minutes)", "at least 1"),
    ("rate(5 seconds)", "rate("),
    ("rate(fast)", "rate("),
    ("at(tomorrow)", "at("),
    ("at(2026-12-01)", "time of day"),
])
def test_bad_expressions_say_what_is_wrong(expr, fragment):
    with pytest.raises(ExpressionError) as exc:
        parse(expr, "UTC", anchor=ANCHOR)
    assert exc.value.field == "expression"
    assert fragment in str(exc.value)


@pytest.mark.parametrize("zone", ["Mars/Olympus", "", "localtime", "../etc/passwd", "EST5EDT/"])
def test_unknown_zone(zone):
    with pytest.raises(ExpressionError) as exc:
        parse("0 0 * * *", zone, anchor=ANCHOR)
    assert exc.value.field == "timeZone"
    with pytest.raises(ExpressionError):
        validate_time_zone(zone)


def test_known_zone_comes_from_the_tzdata_package():
    assert validate_time_zone("Australia/Lord_Howe").key == "Australia/Lord_Howe"


@pytest.mark.parametrize("policy", [
    {"skipped": "later"}, {"repeated": "never"}, {"skipped": 1}, {"skiped": "skip"}, "skip",
])
def test_bad_dst_policy(policy):
    with pytest.raises(ExpressionError) as exc:
        DstPolicy.from_dict(policy)
    assert exc.value.field == "dstPolicy"


def test_default_dst_policy():
    assert DstPolicy.from_dict(None) == DstPolicy("next_valid", "earlier")
    assert DstPolicy.from_dict({"repeated": "both"}) == DstPolicy("next_valid", "both")


def test_naive_anchor_is_a_start_at_error():
    from datetime import datetime

    with pytest.raises(ExpressionError) as exc:
        parse("0 0 * * *", "UTC", anchor=datetime(2026, 1, 1))
    assert exc.value.field == "startAt"
