"""The cron dialect: Debian's, with cronsim's extensions, parsed by the engine itself."""

from datetime import datetime, timezone
from importlib.metadata import version

import pytest
from cronsim import CronSim

from schedules.timeexpr import ExpressionError, parse

from .helpers import ats

UTC = timezone.utc
ANCHOR = datetime(2026, 1, 1, tzinfo=UTC)


def test_a_one_value_range_with_a_step_is_that_one_value():
    # Debian/vixie cron: 9-9/4 is {9}. Issue 13, item 1.
    assert ats("45 9-9/4 * * *", "UTC", "2026-01-01T00:00Z", "2026-01-03T00:00Z") == [
        "2026-01-01T09:45Z", "2026-01-02T09:45Z"]
    assert ats("0 0 1-1/5 * *", "UTC", "2026-01-01T00:00Z", "2026-03-01T00:00Z") == [
        "2026-01-01T00:00Z", "2026-02-01T00:00Z"]


def test_cronsim_reads_a_one_value_range_with_a_step_as_the_engine_does_from_2_9_on():
    # One reason the engine parses fields itself: cronsim before 2.9 read 9-9/4 as "9 to the end of
    # the field, every 4". 2.9 reads it as Debian cron does. Either way the engine's answer above
    # stands; this records which reading the installed oracle has, so a change is noticed.
    hours = CronSim("45 9-9/4 * * *", datetime(2026, 1, 1)).hours
    if tuple(int(p) for p in version("cronsim").split(".")[:2]) >= (2, 9):
        assert hours == {9}
    else:
        assert hours == {9, 13, 17, 21}


@pytest.mark.parametrize("expr,hours", [
    ("0 1-10/3 * * *", [1, 4, 7, 10]),
    ("0 */6 * * *", [0, 6, 12, 18]),
    ("0 20/2 * * *", [20, 22]),          # 'a/n' runs from a to the end of the field
    ("0 22-23/5 * * *", [22]),
    ("0 5,5,1-2 * * *", [1, 2, 5]),
])
def test_ranges_and_steps_mean_what_debian_cron_means(expr, hours):
    got = ats(expr, "UTC", "2026-01-01T00:00Z", "2026-01-02T00:00Z")
    assert got == [f"2026-01-01T{h:02d}:00Z" for h in hours]


def test_names_are_case_insensitive_and_seven_is_sunday():
    assert ats("0 0 * jan sun", "UTC", "2026-01-01T00:00Z", "2026-01-12T00:00Z") == [
        "2026-01-04T00:00Z", "2026-01-11T00:00Z"]
    assert ats("0 0 * * 7", "UTC", "2026-01-01T00:00Z", "2026-01-12T00:00Z") == [
        "2026-01-04T00:00Z", "2026-01-11T00:00Z"]
    assert ats("0 0 * * MON-FRI", "UTC", "2026-01-09T00:00Z", "2026-01-13T00:00Z") == [
        "2026-01-09T00:00Z", "2026-01-12T00:00Z"]


def test_both_day_fields_restricted_means_either_matches():
    # 13th of the month OR any Friday (Debian: neither field starts with '*').
    assert ats("0 0 13 * FRI", "UTC", "2026-02-01T00:00Z", "2026-02-16T00:00Z") == [
        "2026-02-06T00:00Z", "2026-02-13T00:00Z"]
    # A field starting with '*' makes it AND, even when it is a step: odd days that are Fridays.
    assert ats("0 0 */2 * FRI", "UTC", "2026-02-01T00:00Z", "2026-03-01T00:00Z") == [
        "2026-02-13T00:00Z", "2026-02-27T00:00Z"]


def test_last_day_last_weekday_and_nth_weekday():
    assert ats("0 0 L 2 *", "UTC", "2028-01-01T00:00Z", "2029-01-01T00:00Z") == ["2028-02-29T00:00Z"]
    # LW: last Monday-to-Friday; 2026-05-31 is a Sunday.
    assert ats("0 0 LW 5 *", "UTC", "2026-01-01T00:00Z", "2027-01-01T00:00Z") == ["2026-05-29T00:00Z"]
    assert ats("0 0 * 3 5L", "UTC", "2026-01-01T00:00Z", "2027-01-01T00:00Z") == ["2026-03-27T00:00Z"]
    assert ats("0 0 * 3 MON#2", "UTC", "2026-01-01T00:00Z", "2027-01-01T00:00Z") == ["2026-03-09T00:00Z"]


@pytest.mark.parametrize("expr,fragment", [
    ("45 9-9/4 * * * *", "5 fields"),
    ("0 9-8 * * *", "ends before it starts"),
    ("0 9/0 * * *", "step"),
    ("0 ¹ * * *", "hour"),
    ("0 ٣ * * *", "hour"),
    ("0 0 L/2 * *", "day-of-month"),
    ("0 0 15W * *", "day-of-month"),
    ("0 0 * * MONL", "5L"),
    ("0 0 * * 1#6", "1 to 5"),
    ("0 0 * * 1#0", "1 to 5"),
    ("0 0 ? * *", "day-of-month"),
    ("0 0 * * ,", "empty"),
    ("0 0 * JAN-DEC/0 *", "step"),
])
def test_refused_forms_say_which_field(expr, fragment):
    with pytest.raises(ExpressionError) as exc:
        parse(expr, "UTC", anchor=ANCHOR)
    assert exc.value.field == "expression"
    assert fragment in str(exc.value)


def test_never_firing_day_of_month_names_day_of_month_and_the_month():
    # Issue 13, item 5: not "in month *".
    with pytest.raises(ExpressionError) as exc:
        parse("0 0 30 2 *", "UTC", anchor=ANCHOR)
    msg = str(exc.value)
    assert "never fires" in msg and "day-of-month 30" in msg and "February" in msg and "at most 29 days" in msg
    assert "month *" not in msg


def test_never_firing_day_of_month_in_several_months_names_them_all():
    with pytest.raises(ExpressionError) as exc:
        parse("0 0 31 4,6,9,11 *", "UTC", anchor=ANCHOR)
    msg = str(exc.value)
    assert "day-of-month 31" in msg and "April, June, September or November" in msg
    assert "month field 4,6,9,11" in msg and "at most 30 days" in msg


def test_a_day_of_month_and_day_of_week_that_never_meet_name_both_fields():
    # Both must match because day-of-month starts with '*': the 1st is never the 4th Monday.
    with pytest.raises(ExpressionError) as exc:
        parse("1 1 */100 * MON#4", "UTC", anchor=ANCHOR)
    msg = str(exc.value)
    assert "day-of-month */100 and day-of-week MON#4 never fall on the same day" in msg


def test_macros_and_unknown_macros():
    assert ats("@annually", "UTC", "2026-01-01T00:00Z", "2028-01-01T00:00Z") == [
        "2026-01-01T00:00Z", "2027-01-01T00:00Z"]
    assert ats("@midnight", "UTC", "2026-01-01T00:00Z", "2026-01-03T00:00Z") == [
        "2026-01-01T00:00Z", "2026-01-02T00:00Z"]
    with pytest.raises(ExpressionError) as exc:
        parse("@every_5m", "UTC", anchor=ANCHOR)
    assert "unknown cron macro" in str(exc.value) and "@hourly" in str(exc.value)
