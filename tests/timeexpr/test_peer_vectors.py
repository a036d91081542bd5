"""Test vectors from other projects' suites, where their dialect is ours.

Sources (read, then re-expressed here as data): cronsim's tests/test_cronsim.py (cuu508/cronsim),
croniter's src/croniter/tests/test_croniter.py (kiorky/croniter) and python-dateutil's
tests/test_rrule.py (dateutil/dateutil). Their vectors are naive or in one zone; here each runs
through the whole engine in a zone whose offset does not matter (UTC) unless the vector is about
DST, and the instants are compared.

Left out on purpose: croniter's day_or=False mode and '29-L' ranges, seconds fields;
dateutil's BYEASTER (not RFC 5545), its BYWEEKNO answers at a year's first days (dateutil counts
the previous year's weeks wrongly there; see test_rrule_against_dateutil.py) and its newest
reading of YEARLY;BYMONTHDAY without BYMONTH (see the test at the end).
"""

from datetime import datetime, timedelta, timezone

import pytest

from schedules.timeexpr import ExpressionError, parse, validate_time_zone

UTC = timezone.utc


def _next_n(expr, zone, start, n, anchor=None):
    z = validate_time_zone(zone)
    start = start if start.tzinfo else start.replace(tzinfo=z)
    rule = parse(expr, zone, anchor=anchor or datetime(1990, 1, 1, tzinfo=UTC))
    out, t = [], start
    for _ in range(n):
        occ = rule.next_after(t)
        out.append(occ.at.astimezone(z))
        t = occ.at
    return out


# -- cronsim -------------------------------------------------------------------------------------

CRONSIM = [
    ("1 1 L * *", datetime(2020, 1, 1), ["2020-01-31T01:01"]),
    ("1 1 * * 5L", datetime(2020, 1, 1), ["2020-01-31T01:01", "2020-02-28T01:01", "2020-03-27T01:01",
                                           "2020-04-24T01:01", "2020-05-29T01:01", "2020-06-26T01:01"]),
    ("1 1 * * 0L", datetime(2020, 1, 1), ["2020-01-26T01:01"]),
    ("1 1 * * 7L", datetime(2020, 1, 1), ["2020-01-26T01:01"]),
    ("1 1 * * 1#2", datetime(2020, 1, 1), ["2020-01-13T01:01"]),
    # First Sunday of the month: day-of-week starts with '*', so both fields must match.
    ("1 1 1-7 * */7", datetime(2020, 1, 1), ["2020-01-05T01:01", "2020-02-02T01:01", "2020-03-01T01:01",
                                             "2020-04-05T01:01"]),
    # First Monday: day-of-month starts with '*'.
    ("1 1 */100,1-7 * MON", datetime(2020, 1, 1), ["2020-01-06T01:01", "2020-02-03T01:01", "2020-03-02T01:01",
                                                   "2020-04-06T01:01"]),
    ("5/15 * * * *", datetime(2020, 1, 1), ["2020-01-01T00:05", "2020-01-01T00:20", "2020-01-01T00:35",
                                            "2020-01-01T00:50"]),
]


@pytest.mark.parametrize("expr,start,expected", CRONSIM)
def test_cronsim_iterator_vectors(expr, start, expected):
    got = _next_n(expr, "UTC", start.replace(tzinfo=UTC), len(expected))
    assert [g.strftime("%Y-%m-%dT%H:%M") for g in got] == expected


def test_cronsim_no_match_vector_is_refused_as_never_firing():
    # "The first date of the month *and* the fourth Monday of the month will never yield results."
    with pytest.raises(ExpressionError) as exc:
        parse("1 1 */100 * MON#4", "UTC", anchor=datetime(2020, 1, 1, tzinfo=UTC))
    assert "never fires" in str(exc.value) and "day-of-month */100" in str(exc.value)


# cronsim's Europe/Riga DST vectors (2021: spring 03:00 -> 04:00 on 28 March, autumn 04:00 -> 03:00
# on 31 October). Each is (expression, local start, fold, expected local times with offsets). They
# follow Debian's split between fixed-time and sub-daily rules, as ours does.
RIGA = [
    ("0 * * * *", (2021, 3, 28, 1, 30), 0, ["02:00+02:00", "04:00+03:00"]),
    ("0 * * * *", (2021, 10, 31, 1, 30), 0, ["02:00+03:00", "03:00+03:00", "03:00+02:00", "04:00+02:00"]),
    ("*/30 * * * *", (2021, 3, 28, 2, 10), 0, ["02:30+02:00", "04:00+03:00", "04:30+03:00"]),
    ("*/30 * * * *", (2021, 10, 31, 2, 10), 0, ["02:30+03:00", "03:00+03:00", "03:30+03:00", "03:00+02:00",
                                                "03:30+02:00", "04:00+02:00"]),
    ("0 */2 * * *", (2021, 3, 28, 1, 30), 0, ["02:00+02:00", "04:00+03:00", "06:00+03:00"]),
    ("0 */2 * * *", (2021, 10, 31, 1, 30), 0, ["02:00+03:00", "04:00+02:00", "06:00+02:00"]),
    ("0 */3 * * *", (2021, 10, 31, 1, 30), 0, ["03:00+03:00", "03:00+02:00", "06:00+02:00"]),
    ("0 1,2,3,4,5 * * *", (2021, 3, 28, 1, 30), 0, ["02:00+02:00", "04:00+03:00", "05:00+03:00"]),
    ("0 1,2,3,4,5 * * *", (2021, 10, 31, 1, 30), 0, ["02:00+03:00", "03:00+03:00", "04:00+02:00"]),
    ("30 1,2,3,4,5 * * *", (2021, 3, 28, 1, 30), 0, ["02:30+02:00", "04:00+03:00", "04:30+03:00"]),
    ("30 1,2,3,4,5 * * *", (2021, 10, 31, 1, 30), 0, ["02:30+03:00", "03:30+03:00", "04:30+02:00"]),
    ("0 3 * * *", (2021, 3, 27, 1, 30), 0, ["03:00+02:00", "04:00+03:00", "03:00+03:00"]),
    ("0 3 * * *", (2021, 10, 31, 1, 30), 0, ["03:00+03:00", "03:00+02:00"]),
    ("0 4 * * *", (2021, 10, 30, 1, 30), 0, ["04:00+03:00", "04:00+02:00", "04:00+02:00"]),
    ("15 3 * * *", (2021, 3, 27, 0, 0), 0, ["03:15+02:00", "04:00+03:00", "03:15+03:00"]),
    ("15 3 * * *", (2021, 10, 30, 0, 0), 0, ["03:15+03:00", "03:15+03:00", "03:15+02:00"]),
    ("0 1-5 * * *", (2021, 3, 28, 1, 30), 0, ["02:00+02:00", "04:00+03:00", "05:00+03:00"]),
    ("0 1-5 * * *", (2021, 10, 31, 1, 30), 0, ["02:00+03:00", "03:00+03:00", "04:00+02:00"]),
    ("* * * * *", (2021, 3, 28, 2, 58), 0, ["02:59+02:00", "04:00+03:00"]),
    ("* * * * *", (2021, 10, 31, 3, 58), 0, ["03:59+03:00", "03:00+02:00", "03:01+02:00"]),
    ("* 1-6 * * *", (2021, 10, 31, 3, 58), 0, ["03:59+03:00", "03:00+02:00", "03:01+02:00"]),
]


@pytest.mark.parametrize("expr,start,fold,expected", RIGA)
def test_cronsim_riga_dst_vectors(expr, start, fold, expected):
    z = validate_time_zone("Europe/Riga")
    got = _next_n(expr, "Europe/Riga", datetime(*start, tzinfo=z, fold=fold), len(expected))
    assert [g.strftime("%H:%M%z")[:-2] + ":" + g.strftime("%z")[-2:] for g in got] == expected


# -- croniter ------------------------------------------------------------------------------------

CRONITER = [
    ("*/5 * * * *", datetime(2010, 1, 23, 12, 18), ["2010-01-23T12:20", "2010-01-23T12:25"]),
    ("0 */3 * * *", datetime(2010, 1, 24, 12, 2), ["2010-01-24T15:00", "2010-01-24T18:00", "2010-01-24T21:00",
                                                   "2010-01-25T00:00"]),
    ("0 0 */3 * *", datetime(2010, 2, 24, 12, 9), ["2010-02-25T00:00", "2010-02-28T00:00", "2010-03-01T00:00"]),
    ("0 0 * * *", datetime(1996, 2, 27), ["1996-02-28T00:00", "1996-02-29T00:00"]),
    ("0 0 * * *", datetime(2000, 2, 27), ["2000-02-28T00:00", "2000-02-29T00:00"]),
    ("0 0 * * sat", datetime(2010, 2, 25), ["2010-02-27T00:00", "2010-03-06T00:00"]),
    # Both day fields restricted: either matches (croniter's default, Debian's rule).
    ("0 0 1 * wed", datetime(2010, 1, 25), ["2010-01-27T00:00", "2010-02-01T00:00", "2010-02-03T00:00"]),
    ("0 0 * * sat#1", datetime(2010, 2, 25), ["2010-03-06T00:00", "2010-04-03T00:00"]),
    ("0 0 * * wed#5", datetime(2010, 1, 25), ["2010-03-31T00:00", "2010-06-30T00:00", "2010-09-29T00:00"]),
    ("0 0 1 * *", datetime(2010, 1, 25), ["2010-02-01T00:00", "2010-03-01T00:00"]),
    ("0 0 l * *", datetime(2015, 9, 4), ["2015-09-30T00:00", "2015-10-31T00:00", "2015-11-30T00:00",
                                         "2015-12-31T00:00"]),
    ("30 22 * * sun-thu", datetime(2010, 8, 25, 15, 56), ["2010-08-25T22:30"]),
    ("* 5,5,1-6 * * *", datetime(2010, 1, 1, 6, 59), ["2010-01-02T01:00"]),
]


@pytest.mark.parametrize("expr,start,expected", CRONITER)
def test_croniter_vectors(expr, start, expected):
    got = _next_n(expr, "UTC", start.replace(tzinfo=UTC), len(expected))
    assert [g.strftime("%Y-%m-%dT%H:%M") for g in got] == expected


@pytest.mark.parametrize("expr", ["* * * *", "* * 5-1 * *", "-90 * * * *", "a * * * *", "* * * janu-jun *",
                                  "1-1_0 * * * *", "0-10/ * * * *", "0-1& * * * *"])
def test_croniter_rejected_expressions_are_rejected(expr):
    with pytest.raises(ExpressionError):
        parse(expr, "UTC", anchor=datetime(2020, 1, 1, tzinfo=UTC))


# -- python-dateutil test_rrule.py ----------------------------------------------------------------

D = datetime


def _rr(rule: str, dtstart: datetime, count: int):
    """The first ``count`` wall times of an RRULE with DTSTART, through the engine in UTC."""
    text = f"DTSTART:{dtstart:%Y%m%dT%H%M%S}\nRRULE:{rule}"
    r = parse(text, "UTC", anchor=dtstart.replace(tzinfo=UTC))
    out, t = [], dtstart.replace(tzinfo=UTC) - timedelta(seconds=1)
    for _ in range(count):
        occ = r.next_after(t)
        if occ is None:
            break
        out.append(occ.at.replace(tzinfo=None))
        t = occ.at
    return out


S = D(1997, 9, 2, 9, 0)
DATEUTIL = [
    ("FREQ=YEARLY;COUNT=3", [D(1997, 9, 2, 9), D(1998, 9, 2, 9), D(1999, 9, 2, 9)]),
    ("FREQ=YEARLY;INTERVAL=100", [D(1997, 9, 2, 9), D(2097, 9, 2, 9), D(2197, 9, 2, 9)]),
    ("FREQ=YEARLY;BYMONTH=1,3", [D(1998, 1, 2, 9), D(1998, 3, 2, 9), D(1999, 1, 2, 9)]),
    ("FREQ=YEARLY;BYMONTH=1,3;BYMONTHDAY=5,7", [D(1998, 1, 5, 9), D(1998, 1, 7, 9), D(1998, 3, 5, 9)]),
    ("FREQ=YEARLY;BYDAY=TU,TH", [D(1997, 9, 2, 9), D(1997, 9, 4, 9), D(1997, 9, 9, 9)]),
    ("FREQ=YEARLY;BYDAY=1TU,-1TH", [D(1997, 12, 25, 9), D(1998, 1, 6, 9), D(1998, 12, 31, 9)]),
    ("FREQ=YEARLY;BYDAY=3TU,-3TH", [D(1997, 12, 11, 9), D(1998, 1, 20, 9), D(1998, 12, 17, 9)]),
    ("FREQ=YEARLY;BYMONTH=1,3;BYDAY=1TU,-1TH", [D(1998, 1, 6, 9), D(1998, 1, 29, 9), D(1998, 3, 3, 9)]),
    # "Interesting because the TH(-3) ends up before the TU(3)."
    ("FREQ=YEARLY;BYMONTH=1,3;BYDAY=3TU,-3TH", [D(1998, 1, 15, 9), D(1998, 1, 20, 9), D(1998, 3, 12, 9)]),
    ("FREQ=YEARLY;BYMONTH=1,3;BYMONTHDAY=1,3;BYDAY=TU,TH", [D(1998, 1, 1, 9), D(1998, 3, 3, 9), D(2001, 3, 1, 9)]),
    ("FREQ=YEARLY;BYYEARDAY=1,100,200,365", [D(1997, 12, 31, 9), D(1998, 1, 1, 9), D(1998, 4, 10, 9), D(1998, 7, 19, 9)]),
    ("FREQ=YEARLY;BYYEARDAY=-365,-266,-166,-1", [D(1997, 12, 31, 9), D(1998, 1, 1, 9), D(1998, 4, 10, 9), D(1998, 7, 19, 9)]),
    ("FREQ=YEARLY;BYWEEKNO=20", [D(1998, 5, 11, 9), D(1998, 5, 12, 9), D(1998, 5, 13, 9)]),
    # "The first days of week number one may be in the last year."
    ("FREQ=YEARLY;BYWEEKNO=1;BYDAY=MO", [D(1997, 12, 29, 9), D(1999, 1, 4, 9), D(2000, 1, 3, 9)]),
    # "The last days of week number 52/53 may be in the next year."
    ("FREQ=YEARLY;BYWEEKNO=52;BYDAY=SU", [D(1997, 12, 28, 9), D(1998, 12, 27, 9), D(2000, 1, 2, 9)]),
    ("FREQ=YEARLY;BYWEEKNO=-1;BYDAY=SU", [D(1997, 12, 28, 9), D(1999, 1, 3, 9), D(2000, 1, 2, 9)]),
    ("FREQ=YEARLY;BYWEEKNO=53;BYDAY=MO", [D(1998, 12, 28, 9), D(2004, 12, 27, 9), D(2009, 12, 28, 9)]),
    ("FREQ=YEARLY;BYHOUR=6,18;BYMINUTE=6,18", [D(1997, 9, 2, 18, 6), D(1997, 9, 2, 18, 18), D(1998, 9, 2, 6, 6)]),
    ("FREQ=MONTHLY;BYMONTHDAY=13,17;BYHOUR=6,18;BYSETPOS=3,-3", [D(1997, 9, 13, 18), D(1997, 9, 17, 6), D(1997, 10, 13, 18)]),
    ("FREQ=MONTHLY;BYWEEKNO=1;BYDAY=MO", [D(1997, 12, 29, 9), D(1999, 1, 4, 9), D(2000, 1, 3, 9)]),
    ("FREQ=MONTHLY;BYHOUR=6,18", [D(1997, 9, 2, 18), D(1997, 10, 2, 6), D(1997, 10, 2, 18)]),
    ("FREQ=WEEKLY", [D(1997, 9, 2, 9), D(1997, 9, 9, 9), D(1997, 9, 16, 9)]),
    ("FREQ=WEEKLY;INTERVAL=20", [D(1997, 9, 2, 9), D(1998, 1, 20, 9), D(1998, 6, 9, 9)]),
    ("FREQ=WEEKLY;BYMONTH=1,3", [D(1998, 1, 6, 9), D(1998, 1, 13, 9), D(1998, 1, 20, 9)]),
    ("FREQ=WEEKLY;BYMONTHDAY=1,3", [D(1997, 9, 3, 9), D(1997, 10, 1, 9), D(1997, 10, 3, 9)]),
    # Numbered weekdays mean plain ones below MONTHLY (dateutil's reading, kept).
    ("FREQ=WEEKLY;BYDAY=1TU,-1TH", [D(1997, 9, 2, 9), D(1997, 9, 4, 9), D(1997, 9, 9, 9)]),
    # "Crosses the year boundary in a weekly period to find day '1' as a valid recurrence."
    ("FREQ=WEEKLY;BYMONTH=1,3;BYDAY=TU,TH", [D(1998, 1, 1, 9), D(1998, 1, 6, 9), D(1998, 1, 8, 9)]),
    ("FREQ=WEEKLY;BYMONTH=1,7;BYYEARDAY=1,100,200,365", [D(1998, 1, 1, 9), D(1998, 7, 19, 9), D(1999, 1, 1, 9), D(1999, 7, 19, 9)]),
    ("FREQ=DAILY;BYWEEKNO=53;BYDAY=MO", [D(1998, 12, 28, 9), D(2004, 12, 27, 9), D(2009, 12, 28, 9)]),
    ("FREQ=DAILY;BYHOUR=6,18", [D(1997, 9, 2, 18), D(1997, 9, 3, 6), D(1997, 9, 3, 18)]),
    ("FREQ=DAILY;BYMINUTE=6,18;BYSECOND=6,18", [D(1997, 9, 2, 9, 6, 6), D(1997, 9, 2, 9, 6, 18), D(1997, 9, 2, 9, 18, 6)]),
    ("FREQ=DAILY;BYHOUR=6,18;BYMINUTE=15,45;BYSETPOS=3,-3", [D(1997, 9, 2, 18, 15), D(1997, 9, 3, 6, 45), D(1997, 9, 3, 18, 15)]),
    ("FREQ=HOURLY;INTERVAL=2", [D(1997, 9, 2, 9), D(1997, 9, 2, 11), D(1997, 9, 2, 13)]),
    ("FREQ=HOURLY;INTERVAL=769", [D(1997, 9, 2, 9), D(1997, 10, 4, 10), D(1997, 11, 5, 11)]),
    ("FREQ=HOURLY;BYMONTH=1,3", [D(1998, 1, 1, 0), D(1998, 1, 1, 1), D(1998, 1, 1, 2)]),
    ("FREQ=HOURLY;BYMONTHDAY=1,3", [D(1997, 9, 3, 0), D(1997, 9, 3, 1), D(1997, 9, 3, 2)]),
    ("FREQ=HOURLY;BYDAY=1TU,-1TH", [D(1997, 9, 2, 9), D(1997, 9, 2, 10), D(1997, 9, 2, 11)]),
    ("FREQ=HOURLY;BYMONTHDAY=1,3;BYDAY=TU,TH", [D(1998, 1, 1, 0), D(1998, 1, 1, 1), D(1998, 1, 1, 2)]),
    ("FREQ=HOURLY;BYYEARDAY=-365,-266,-166,-1", [D(1997, 12, 31, 0), D(1997, 12, 31, 1), D(1997, 12, 31, 2), D(1997, 12, 31, 3)]),
    ("FREQ=HOURLY;BYWEEKNO=1;BYDAY=MO", [D(1997, 12, 29, 0), D(1997, 12, 29, 1), D(1997, 12, 29, 2)]),
    ("FREQ=HOURLY;BYWEEKNO=53;BYDAY=MO", [D(1998, 12, 28, 0), D(1998, 12, 28, 1), D(1998, 12, 28, 2)]),
]


@pytest.mark.parametrize("rule,expected", DATEUTIL, ids=[r for r, _ in DATEUTIL])
def test_dateutil_rrule_vectors(rule, expected):
    assert _rr(rule, S, len(expected)) == expected


def test_dateutil_count_vectors_stop_at_count():
    assert _rr("FREQ=YEARLY;COUNT=3", S, 5) == [D(1997, 9, 2, 9), D(1998, 9, 2, 9), D(1999, 9, 2, 9)]
    assert _rr("FREQ=MONTHLY;BYMONTHDAY=13,17;BYHOUR=6,18;BYSETPOS=3,-3;COUNT=3", S, 5) == [
        D(1997, 9, 13, 18), D(1997, 9, 17, 6), D(1997, 10, 13, 18)]


def test_yearly_bymonthday_without_bymonth_expands_to_every_month():
    # dateutil's newest tests (issue #1452) give this rule DTSTART's month; released dateutil,
    # rrule.js and php-rrule read BYMONTHDAY under YEARLY as RFC 5545's table says, "expand",
    # to every month, and so did this engine's earlier releases: stored schedules keep meaning it.
    assert _rr("FREQ=YEARLY;BYMONTHDAY=1,3", S, 3) == [D(1997, 9, 3, 9), D(1997, 10, 1, 9), D(1997, 10, 3, 9)]
    assert _rr("FREQ=YEARLY;BYMONTH=3;BYMONTHDAY=30;COUNT=3", D(2010, 3, 30), 4) == [
        D(2010, 3, 30), D(2011, 3, 30), D(2012, 3, 30)]
