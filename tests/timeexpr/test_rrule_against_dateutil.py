"""The RRULE evaluator against python-dateutil, the library the engine used before.

Random rules are compared wall time by wall time in UTC (so only the rule's arithmetic is
compared, not DST). dateutil's cost grows with the number of periods it walks, so a rule is only
compared when dateutil can answer it quickly. Not compared, because the engine deliberately
differs (module docstring of schedules/timeexpr/rrule.py): BYWEEKNO near New Year (checked
against date.isocalendar() below instead), BYSETPOS with WEEKLY, and BYDAY mixing plain and
numbered weekdays.
"""

from datetime import date, datetime, timedelta, timezone

from dateutil import rrule as du
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedules.timeexpr import ExpressionError, parse
from schedules.timeexpr.days import KEYS, jan1, layout, year_of

UTC = timezone.utc
FREQS = ["YEARLY", "MONTHLY", "WEEKLY", "DAILY", "HOURLY", "MINUTELY", "SECONDLY"]
WD = ["MO", "TU", "WE", "TH", "FR", "SA", "SU"]
PERIOD_SECONDS = {"YEARLY": 365 * 86400, "MONTHLY": 28 * 86400, "WEEKLY": 7 * 86400, "DAILY": 86400,
                  "HOURLY": 3600, "MINUTELY": 60, "SECONDLY": 1}


def _csv(draw, values, k):
    return ",".join(map(str, sorted(draw(st.lists(st.sampled_from(values), min_size=1, max_size=k, unique=True)))))


@st.composite
def rules(draw):
    f = draw(st.sampled_from(FREQS))
    parts = [f"FREQ={f}"]
    if draw(st.booleans()):
        sub = f in ("HOURLY", "MINUTELY", "SECONDLY")
        parts.append(f"INTERVAL={draw(st.sampled_from([2, 3, 5, 7, 13, 23, 25, 61, 1439, 1441] if sub else [2, 3, 5, 7, 13]))}")
    if draw(st.integers(0, 3)) == 0:
        parts.append(f"BYMONTH={_csv(draw, list(range(1, 13)), 3)}")
    if draw(st.integers(0, 3)) == 0:
        parts.append(f"BYMONTHDAY={_csv(draw, [1, 2, 15, 28, 29, 30, 31, -1, -2, -15], 3)}")
    if draw(st.integers(0, 2)) == 0:
        if f in ("MONTHLY", "YEARLY") and draw(st.booleans()):
            parts.append("BYDAY=" + ",".join(f"{draw(st.sampled_from([1, 2, 3, 4, -1, -2]))}{draw(st.sampled_from(WD))}"
                                             for _ in range(draw(st.integers(1, 2)))))
        else:
            parts.append(f"BYDAY={_csv(draw, WD, 3)}")
    if f == "YEARLY" and draw(st.integers(0, 5)) == 0:
        parts.append(f"BYYEARDAY={_csv(draw, [1, 100, 200, 365, 366, -1, -100], 2)}")
    if draw(st.integers(0, 2)) == 0:
        parts.append(f"BYHOUR={_csv(draw, list(range(24)), 3)}")
    if draw(st.integers(0, 2)) == 0:
        parts.append(f"BYMINUTE={_csv(draw, [0, 7, 15, 30, 45], 2)}")
    if draw(st.integers(0, 4)) == 0:
        parts.append(f"BYSECOND={_csv(draw, [0, 30, 59], 2)}")
    if f != "WEEKLY" and draw(st.integers(0, 4)) == 0:
        parts.append(f"BYSETPOS={_csv(draw, [1, 2, 3, -1, -2], 2)}")
    if draw(st.integers(0, 4)) == 0:
        parts.append(f"WKST={draw(st.sampled_from(WD))}")
    if draw(st.integers(0, 3)) == 0:
        parts.append(f"COUNT={draw(st.sampled_from([1, 2, 5, 30]))}")
    return ";".join(parts)


DTSTARTS = st.datetimes(min_value=datetime(1995, 1, 1), max_value=datetime(2030, 12, 31)).map(
    lambda d: d.replace(microsecond=0, second=d.second - d.second % 15))


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(rules(), DTSTARTS)
def test_rrule_wall_times_match_dateutil(rule, dtstart):
    text = f"DTSTART:{dtstart:%Y%m%dT%H%M%S}\nRRULE:{rule}"
    try:
        ours_rule = parse(text, "UTC", anchor=dtstart.replace(tzinfo=UTC))
    except ExpressionError:
        return  # never fires or too dear: dateutil would walk to year 9999 to agree
    ours, t = [], dtstart.replace(tzinfo=UTC) - timedelta(seconds=1)
    for _ in range(20):
        occ = ours_rule.next_after(t)
        if occ is None:
            break
        ours.append(occ.at.replace(tzinfo=None))
        t = occ.at
    assert ours
    freq = rule.split(";")[0][5:]
    if (ours[-1] - dtstart).total_seconds() / PERIOD_SECONDS[freq] > 50_000:
        return
    theirs = du.rrulestr(rule, dtstart=dtstart).between(dtstart, ours[-1], inc=True)[:20]
    assert ours == theirs[: len(ours)] and len(theirs) >= len(ours), text


def test_week_numbers_match_iso_8601_for_monday_weeks():
    for y in range(1990, 2040):
        lay = layout(KEYS[y % 400])
        weeks = lay.week_numbers(0)
        for i in range(lay.length):
            d = date.fromordinal(jan1(y) + i)
            iso_year, iso_week, _ = d.isocalendar()
            n_weeks = date(iso_year, 12, 28).isocalendar()[1]
            assert weeks[i] == (iso_week, iso_week - n_weeks - 1), (d, weeks[i])


def test_byweekno_selects_iso_weeks_near_new_year():
    # 2011-01-01 is in ISO week 52 of 2010 (dateutil says 53); 2015 has a week 53.
    rule = parse("DTSTART:20090101T000000\nRRULE:FREQ=YEARLY;BYWEEKNO=53", "UTC", anchor=datetime(2009, 1, 1, tzinfo=UTC))
    days = [o.at.date() for o in rule.between(datetime(2009, 1, 1, tzinfo=UTC), datetime(2017, 1, 1, tzinfo=UTC), 100)]
    assert days == [date(2009, 12, 28) + timedelta(days=k) for k in range(7)] + \
                   [date(2015, 12, 28) + timedelta(days=k) for k in range(7)]
    assert all(d.isocalendar()[1] == 53 for d in days)
    last = parse("DTSTART:20090101T000000\nRRULE:FREQ=YEARLY;BYWEEKNO=-1;BYDAY=SA", "UTC",
                 anchor=datetime(2009, 1, 1, tzinfo=UTC))
    sats = [o.at.date() for o in last.between(datetime(2010, 6, 1, tzinfo=UTC), datetime(2012, 6, 1, tzinfo=UTC), 10)]
    assert sats == [date(2011, 1, 1), date(2011, 12, 31)]
    assert year_of(jan1(2011)) == 2011
