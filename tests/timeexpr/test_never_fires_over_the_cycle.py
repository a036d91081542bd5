"""'Never fires' is decided over the Gregorian calendar's 400-year cycle, not a horizon, and far
occurrences are found by calendar arithmetic (issue 13, item 4)."""

from datetime import datetime, timezone

import pytest

from schedules.timeexpr import ExpressionError, budget, parse
from schedules.timeexpr.days import KEYS, jan1, weekday

from .helpers import ats

UTC = timezone.utc
ANCHOR = datetime(2026, 1, 1, tzinfo=UTC)


def _units(fn):
    with budget.metered("test", 10**9, 100) as m:
        got = fn()
    return got, m.used


def test_leap_day_on_a_sunday_keeps_firing_after_2032():
    # '*/7' starts with '*', so both day fields must match: 29 February that is a Sunday.
    assert ats("0 0 29 2 */7", "UTC", "2026-01-01T00:00Z", "2200-01-01T00:00Z") == [
        "2032-02-29T00:00Z", "2060-02-29T00:00Z", "2088-02-29T00:00Z", "2128-02-29T00:00Z",
        "2156-02-29T00:00Z", "2184-02-29T00:00Z"]


def test_fifth_monday_of_february_is_valid_and_next_in_2044():
    assert ats("0 0 * 2 MON#5", "UTC", "2026-01-01T00:00Z", "2101-01-01T00:00Z") == [
        "2044-02-29T00:00Z", "2072-02-29T00:00Z"]


def test_thirtieth_of_february_or_a_fifth_monday_fires_on_the_fifth_monday():
    # Both day fields are restricted, so Debian's rule is OR: day 30 never occurs in February,
    # but the fifth Monday does (29 February 2044). time.md's dialect, so this is accepted.
    assert ats("0 0 30 2 MON#5", "UTC", "2026-01-01T00:00Z", "2073-01-01T00:00Z") == [
        "2044-02-29T00:00Z", "2072-02-29T00:00Z"]


@pytest.mark.parametrize("expr,fragment", [
    ("0 0 30 2 *", "day-of-month 30 never occurs in February"),
    ("0 0 31 2,4 *", "day-of-month 31 never occurs in February or April"),
    ("0 0 */30 2 MON#5", "never fall on the same day"),        # {1, 31} AND a fifth Monday
    ("0 0 30-31 2 */2", "day-of-month 30-31 never occurs in February"),
])
def test_rules_matching_no_day_of_the_cycle_are_refused(expr, fragment):
    with pytest.raises(ExpressionError) as exc:
        parse(expr, "UTC", anchor=ANCHOR)
    assert fragment in str(exc.value)


@pytest.mark.parametrize("expr", [
    "RRULE:FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=29;BYDAY=MO",
    "RRULE:FREQ=DAILY;BYMONTH=2;BYMONTHDAY=29;BYDAY=MO",
    "RRULE:FREQ=MINUTELY;BYMONTH=2;BYMONTHDAY=29;BYDAY=MO;BYHOUR=3",
])
def test_rrules_firing_every_few_decades_are_valid(expr):
    got = ats(expr, "UTC", "2026-01-01T00:00Z", "2080-01-01T00:00Z", limit=3)
    assert got[0].startswith("2044-02-29")


@pytest.mark.parametrize("expr,fragment", [
    ("RRULE:FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=30", "no day of the 400-year Gregorian cycle"),
    ("RRULE:FREQ=DAILY;BYMONTH=4;BYMONTHDAY=31", "no day of the 400-year Gregorian cycle"),
    ("RRULE:FREQ=YEARLY;BYYEARDAY=366;BYMONTH=1", "no day of the 400-year Gregorian cycle"),
    ("DTSTART:20250101T000000\nRRULE:FREQ=YEARLY;INTERVAL=4;BYMONTH=2;BYMONTHDAY=29", "no kept year"),
    ("DTSTART:20260107T090000\nRRULE:FREQ=DAILY;INTERVAL=14;BYDAY=MO", "whole weeks"),
    ("DTSTART:19700101T000000\nRRULE:FREQ=HOURLY;INTERVAL=7;BYDAY=SU;BYHOUR=1,2,3", "never land on BYDAY=SU"),
    ("DTSTART:20260101T000000\nRRULE:FREQ=HOURLY;INTERVAL=2;BYHOUR=1,3,5", "never reach"),
])
def test_rrules_matching_nothing_in_the_cycle_are_refused_at_once(expr, fragment):
    rule_text = expr
    with pytest.raises(ExpressionError) as exc:
        _units(lambda: parse(rule_text, "UTC", anchor=ANCHOR))
    assert "never fires" in str(exc.value) and fragment in str(exc.value)


def test_decades_away_costs_a_few_units_not_a_walk():
    rule = parse("0 0 29 2 */7", "America/New_York", anchor=ANCHOR)
    occ, used = _units(lambda: rule.next_after(datetime(2032, 3, 1, tzinfo=UTC)))
    assert occ.local.date().isoformat() == "2060-02-29"
    assert used < 100
    rr = parse("RRULE:FREQ=MINUTELY;BYMONTH=2;BYMONTHDAY=29;BYDAY=MO;BYHOUR=3", "UTC", anchor=ANCHOR)
    occ, used = _units(lambda: rr.next_after(datetime(2044, 3, 1, tzinfo=UTC)))
    assert occ.at.isoformat().startswith("2072-02-29T03:00")
    assert used < 100


def test_every_year_shape_of_the_cycle_is_one_of_the_keys():
    # The engine's premise: a year's shape (neighbouring leap years, weekday of 1 January)
    # depends on the year mod 400, and the 400-year cycle is a whole number of weeks.
    assert (jan1(2426) - jan1(2026)) % 7 == 0 and jan1(2426) - jan1(2026) == 146_097
    for y in range(1, 2500, 7):
        assert KEYS[y % 400][3] == weekday(jan1(y))
    assert len(set(KEYS)) <= 28
