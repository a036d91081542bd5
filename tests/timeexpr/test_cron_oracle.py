"""Our cron results against an independent oracle written from time.md, across DST transitions.

The oracle knows nothing of the engine. Expressions are generated together with the sets they
mean (so the oracle does not share our field parser), and the oracle walks real time minute by
minute, reading the zone's wall clock with zoneinfo:

- sub-daily rules (minute or hour field starting with '*') fire at every real minute whose wall
  time matches, so both passes of a repeated hour and nothing in a gap;
- fixed-time rules fire, for every matching wall time, at its only instant, at the earlier of
  two (repeated), or at the first instant after the gap (skipped), each instant once.

Windows are centred on real transitions of zones with 1-hour, 30-minute and midnight shifts,
so both sides of each transition are covered.
"""

from __future__ import annotations

import calendar
from datetime import date, datetime, timedelta, timezone

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from schedules.timeexpr import ExpressionError, parse, validate_time_zone

UTC = timezone.utc
MINUTE = timedelta(minutes=1)
ZONES = ["America/New_York", "Europe/London", "Australia/Lord_Howe", "Australia/Sydney", "America/Sao_Paulo",
         "Pacific/Chatham", "America/St_Johns", "Asia/Kolkata"]
YEARS = [2026, 2011, 1999]


def _transitions(zone: str) -> list[datetime]:
    z = validate_time_zone(zone)
    out = []
    for year in YEARS:
        t = datetime(year, 1, 1, tzinfo=UTC)
        end = datetime(year + 1, 1, 1, tzinfo=UTC)
        off = t.astimezone(z).utcoffset()
        while t < end:
            nxt = t + timedelta(hours=6)
            if nxt.astimezone(z).utcoffset() != off:
                lo = t
                while nxt - lo > MINUTE:
                    mid = lo + (nxt - lo) // 2
                    mid = mid.replace(second=0, microsecond=0)
                    if mid.astimezone(z).utcoffset() == off:
                        lo = mid
                    else:
                        nxt = mid
                out.append(nxt)
                off = nxt.astimezone(z).utcoffset()
            t = nxt
    # Kolkata has none: use plain days so the oracle still runs there.
    return out or [datetime(y, 3, 8, 7, tzinfo=UTC) for y in YEARS]


TRANSITIONS = {z: _transitions(z) for z in ZONES}


# -- expressions with their meaning ---------------------------------------------------------------

@st.composite
def _field(draw, lo: int, hi: int, star_ok: bool = True):
    """(text, values) for one numeric cron field, Debian meaning: a-b/s is range(a, b+1, s)."""
    kind = draw(st.sampled_from(["star", "star_step", "list", "range_step"] if star_ok else ["list", "range_step"]))
    if kind == "star":
        return "*", set(range(lo, hi + 1))
    if kind == "star_step":
        s = draw(st.integers(1, hi - lo + 1))
        return f"*/{s}", set(range(lo, hi + 1, s))
    if kind == "list":
        vals = draw(st.lists(st.integers(lo, hi), min_size=1, max_size=4))
        return ",".join(map(str, vals)), set(vals)
    a = draw(st.integers(lo, hi))
    b = draw(st.integers(a, hi))
    s = draw(st.integers(1, 6))
    return f"{a}-{b}/{s}", set(range(a, b + 1, s))


@st.composite
def cron_with_meaning(draw):
    sub_daily = draw(st.booleans())
    if sub_daily:
        minute = draw(_field(0, 59))
        hour = draw(_field(0, 23))
        if not (minute[0].startswith("*") or hour[0].startswith("*")):
            minute = draw(_field(0, 59).filter(lambda f: f[0].startswith("*")))
    else:
        minute = draw(_field(0, 59, star_ok=False))
        hour = draw(_field(0, 23, star_ok=False))
    dom = draw(st.one_of(_field(1, 31), st.just(("L", {"L"}))))
    month = ("*", set(range(1, 13)))
    dow_kind = draw(st.sampled_from(["field", "nth", "last"]))
    if dow_kind == "field":
        dow = draw(_field(0, 7))
        dow = (dow[0], {("wd", d % 7) for d in dow[1]})
    elif dow_kind == "nth":
        d, n = draw(st.integers(0, 6)), draw(st.integers(1, 5))
        dow = (f"{d}#{n}", {("nth", d, n)})
    else:
        d = draw(st.integers(0, 7))
        dow = (f"{d}L", {("last", d % 7)})
    text = " ".join([minute[0], hour[0], dom[0], month[0], dow[0]])
    meaning = {"minutes": minute[1], "hours": hour[1], "dom": dom[1], "dom_star": dom[0].startswith("*"),
               "dow": dow[1], "dow_star": dow[0].startswith("*"),
               "sub_daily": minute[0].startswith("*") or hour[0].startswith("*")}
    return text, meaning


def _day_matches(m: dict, d: date) -> bool:
    last = calendar.monthrange(d.year, d.month)[1]
    dom_ok = any(v == "L" and d.day == last or v == d.day for v in m["dom"])
    cron_wd = (d.weekday() + 1) % 7  # cron: Sunday 0
    dow_ok = False
    for item in m["dow"]:
        if item[0] == "wd" and item[1] == cron_wd:
            dow_ok = True
        elif item[0] == "nth" and item[1] == cron_wd and (d.day - 1) // 7 + 1 == item[2]:
            dow_ok = True
        elif item[0] == "last" and item[1] == cron_wd and d.day + 7 > last:
            dow_ok = True
    if m["dom_star"] or m["dow_star"]:
        return dom_ok and dow_ok
    return dom_ok or dow_ok


def _wall_matches(m: dict, w: datetime) -> bool:
    return w.minute in m["minutes"] and w.hour in m["hours"] and _day_matches(m, w.date())


def oracle(m: dict, zone: str, start: datetime, end: datetime) -> list[datetime]:
    """Instants in [start, end), by walking real minutes (see the module docstring)."""
    z = validate_time_zone(zone)
    if m["sub_daily"]:
        out, t = [], start
        while t < end:
            if _wall_matches(m, t.astimezone(z).replace(tzinfo=None)):
                out.append(t)
            t += MINUTE
        return out
    # Map each wall minute of a wider stretch to the real minutes showing it.
    lo, hi = start - timedelta(hours=30), end + timedelta(hours=30)
    shown: dict[datetime, list[datetime]] = {}
    order = []
    t = lo
    while t < hi:
        w = t.astimezone(z).replace(tzinfo=None)
        shown.setdefault(w, []).append(t)
        order.append((t, w))
        t += MINUTE
    first_wall, last_wall = order[0][1], order[-1][1]
    instants = set()
    w, last = min(shown), max(shown)
    while w <= last:
        if first_wall + timedelta(hours=2) <= w <= last_wall - timedelta(hours=2) and _wall_matches(m, w):
            real = shown.get(w)
            if real:
                instants.add(min(real))
            else:
                # Skipped: the first real minute whose wall clock is past w.
                instants.add(next(t for t, shown_w in order if shown_w > w))
        w += MINUTE
    return sorted(i for i in instants if start <= i < end)


SETTINGS = settings(max_examples=80, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@SETTINGS
@given(cron_with_meaning(), st.sampled_from(ZONES), st.data())
@example(("30 * * * *", {"minutes": {30}, "hours": set(range(24)), "dom": set(range(1, 32)), "dom_star": True,
                         "dow": {("wd", d) for d in range(7)}, "dow_star": True, "sub_daily": True}),
         "America/New_York", None)
@example(("15 2 * * *", {"minutes": {15}, "hours": {2}, "dom": set(range(1, 32)), "dom_star": True,
                         "dow": {("wd", d) for d in range(7)}, "dow_star": True, "sub_daily": False}),
         "Australia/Lord_Howe", None)
def test_cron_agrees_with_a_minute_walk_on_both_sides_of_transitions(expr, zone, data):
    text, meaning = expr
    transitions = TRANSITIONS[zone]
    if data is None:
        centre = transitions[0]
        shift = timedelta(0)
    else:
        centre = data.draw(st.sampled_from(transitions))
        shift = timedelta(minutes=data.draw(st.integers(-20 * 60, 20 * 60)))
    start = (centre + shift - timedelta(hours=14)).replace(second=0, microsecond=0)
    end = start + timedelta(hours=28)
    try:
        rule = parse(text, zone, anchor=datetime(1990, 1, 1, tzinfo=UTC))
    except ExpressionError as e:
        # Refused as never firing over the whole cycle (e.g. '* * */8 * 0#5'): the walk must
        # find nothing either.
        assert "never fires" in str(e)
        assert oracle(meaning, zone, start, end) == []
        return
    assert rule.sub_daily == meaning["sub_daily"]
    got = [o.at for o in rule.between(start, end, 5000) if not o.dropped]
    assert got == oracle(meaning, zone, start, end), (text, zone, start)
