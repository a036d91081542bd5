"""Hostile input is refused with an ExpressionError naming the field, never another exception
(issue 13, item 6), and rules end cleanly at the ends of the calendar."""

from datetime import datetime, timedelta, timezone

import pytest

from schedules.timeexpr import MAX_INSTANT, MIN_INSTANT, ExpressionError, parse, preview, validate_time_zone

UTC = timezone.utc
ANCHOR = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("expr,zone,fragment", [
    ("rate(1000000000 days)", "UTC", "at most 3660 days"),
    ("rate(99999999999999999999 days)", "UTC", "at most 3660 days"),
    ("rate(5270401 minutes)", "UTC", "5270400 minutes"),
    ("rate(" + "9" * 400 + " minutes)", "UTC", "at most"),
    ("at(9999-12-31T23:59:59)", "America/New_York", "outside the supported range"),
    ("at(0001-01-01T00:00:00)", "Asia/Tokyo", "outside the supported range"),
    ("at(9999-12-31T23:59:59-12:00)", "UTC", "outside the supported range"),
    ("at(0001-01-01T00:00:00+14:00)", "UTC", "outside the supported range"),
    ("at(" + "9" * 400 + ")", "UTC", "bad at() expression"),
    ("RRULE:FREQ=DAILY;INTERVAL=99999999999999999999", "UTC", "INTERVAL"),
    ("RRULE:FREQ=DAILY;INTERVAL=0", "UTC", "INTERVAL=0 must be a whole number from 1"),
    ("RRULE:FREQ=DAILY;INTERVAL=-1", "UTC", "INTERVAL"),
    ("RRULE:FREQ=DAILY;COUNT=0", "UTC", "COUNT"),
    ("RRULE:FREQ=DAILY;COUNT=99999999999999999999", "UTC", "COUNT"),
    ("DTSTART:99991231T230000\nRRULE:FREQ=DAILY", "Etc/GMT-14", "never fires"),
    ("DTSTART:99991231T235959Z\nRRULE:FREQ=DAILY", "Etc/GMT-14", "outside the calendar"),
    ("DTSTART:00010101T000000Z\nRRULE:FREQ=DAILY", "Etc/GMT+12", "outside the calendar"),
    ("DTSTART:20260101T000000\nRRULE:FREQ=DAILY;UNTIL=99991231T235959Z", "Etc/GMT-14", None),
    ("DTSTART:20200101T000000\nRRULE:FREQ=DAILY;UNTIL=20210101T000000Z", "Etc/GMT-14", "never fires"),
    ("RRULE:FREQ=DAILY;BYSECOND=60", "UTC", "BYSECOND"),
    ("RRULE:FREQ=DAILY;BYEASTER=0", "UTC", "BYEASTER"),
    ("RRULE:FREQ=DAILY;BYDAY=0MO", "UTC", "BYDAY"),
    ("RRULE:FREQ=DAILY;FREQ=WEEKLY", "UTC", "given twice"),
    ("RRULE:FREQ=DAILY;X-FOO=1", "UTC", "unknown part"),
    ("x" * 5000, "UTC", "longer than"),
    ("0 0 * * *\x00", "UTC", "day-of-week"),
])
def test_hostile_expressions_are_expression_errors(expr, zone, fragment):
    if fragment is None:
        # Accepted: a far UNTIL is just a bound.
        assert parse(expr, zone, anchor=ANCHOR).next_after(ANCHOR) is not None
        return
    with pytest.raises(ExpressionError) as exc:
        parse(expr, zone, anchor=ANCHOR)
    assert exc.value.field == "expression"
    assert fragment in str(exc.value)


@pytest.mark.parametrize("name", ["zone.tab", "zone1970.tab", "zonenow.tab", "iso3166.tab", "tzdata.zi",
                                  "leapseconds", "America/__init__.py", "__init__.py", "America/__init__",
                                  "../", "../../etc/passwd", "UTC\x00", "UTC\n", "x" * 10_000, "America",
                                  "America/", "/UTC", "America//New_York", "posixrules", "localtime", ""])
def test_files_of_the_tz_database_that_are_not_zones_are_refused(name):
    with pytest.raises(ExpressionError) as exc:
        validate_time_zone(name)
    assert exc.value.field == "timeZone"
    assert "unknown time zone" in str(exc.value)
    assert len(str(exc.value)) < 400


def test_a_non_string_zone_is_refused():
    with pytest.raises(ExpressionError) as exc:
        validate_time_zone(None)
    assert exc.value.field == "timeZone"


@pytest.mark.parametrize("anchor", [datetime(1, 1, 1, tzinfo=UTC), datetime(9999, 12, 31, 23, 0, tzinfo=UTC),
                                    datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5)))])
def test_an_anchor_outside_the_calendar_is_a_start_at_error(anchor):
    with pytest.raises(ExpressionError) as exc:
        parse("0 0 * * *", "UTC", anchor=anchor)
    assert exc.value.field == "startAt"


@pytest.mark.parametrize("expr,zone", [
    ("* * * * *", "Etc/GMT+12"), ("* * * * *", "Etc/GMT-14"), ("0 0 * * *", "America/New_York"),
    ("0 0 31 12 *", "Pacific/Kiritimati"), ("RRULE:FREQ=SECONDLY", "UTC"), ("RRULE:FREQ=YEARLY", "Etc/GMT+12"),
    ("RRULE:FREQ=MINUTELY;INTERVAL=7", "Asia/Manila"), ("rate(1 minute)", "UTC"), ("rate(3660 days)", "UTC"),
    ("at(9999-12-30T12:00:00)", "UTC"),
])
def test_rules_end_cleanly_at_the_end_of_the_calendar(expr, zone):
    rule = parse(expr, zone, anchor=ANCHOR)
    for after in (MAX_INSTANT - timedelta(days=2), MAX_INSTANT - timedelta(seconds=1), MAX_INSTANT,
                  datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)):
        occ = rule.next_after(after)
        assert occ is None or after < occ.at <= MAX_INSTANT
    tail = list(rule.iter_after(MAX_INSTANT - timedelta(hours=6)))
    assert all(o.at <= MAX_INSTANT for o in tail)
    assert preview(rule, datetime(9999, 12, 31, tzinfo=UTC), 5) == []


@pytest.mark.parametrize("expr,zone", [("* * * * *", "Asia/Manila"), ("0 0 * * *", "America/Yakutat"),
                                       ("RRULE:FREQ=YEARLY;BYSECOND=57,5", "Pacific/Apia"),
                                       ("RRULE:FREQ=HOURLY", "Etc/GMT-14")])
def test_asking_from_the_start_of_the_calendar_does_not_underflow(expr, zone):
    # Found by the fuzz test: zones whose largest offset jump is about a day.
    rule = parse(expr, zone, anchor=datetime(1994, 3, 4, tzinfo=UTC))
    occ = rule.next_after(datetime(1, 1, 1, tzinfo=UTC))
    assert occ is not None and occ.at >= MIN_INSTANT
    assert occ.wall[:4].isdigit()  # walls are ISO 8601, years below 1000 padded


def test_at_rules_at_the_edges_that_are_representable_are_kept():
    first = parse("at(0001-01-02T12:00:00Z)", "UTC", anchor=ANCHOR)
    assert first.next_after(datetime(1, 1, 1, tzinfo=UTC)).at == datetime(1, 1, 2, 12, tzinfo=UTC)
    last = parse("at(9999-12-30T12:00:00)", "Etc/GMT-14", anchor=ANCHOR)
    assert last.next_after(ANCHOR).at == datetime(9999, 12, 29, 22, tzinfo=UTC)
