"""Hypothesis strategies over the expression grammar, valid and hostile, shared by the fuzz tests."""

from __future__ import annotations

import importlib.resources
from datetime import datetime, timedelta, timezone

from hypothesis import strategies as st

UTC = timezone.utc
MONTH_NAMES = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]
DAY_NAMES = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]
RRULE_DAYS = ["MO", "TU", "WE", "TH", "FR", "SA", "SU"]
# (low, high, names) per cron field; values a little outside the range are drawn too.
CRON_FIELDS = [(0, 59, None), (0, 23, None), (1, 31, None), (1, 12, MONTH_NAMES), (0, 7, DAY_NAMES)]


def _tzdata_files() -> list[str]:
    """Every file under the installed tzdata package's zoneinfo directory, zones or not."""
    root = importlib.resources.files("tzdata.zoneinfo")
    out = []

    def walk(node, prefix):
        for child in node.iterdir():
            name = prefix + child.name
            if child.is_dir():
                if child.name != "__pycache__":
                    walk(child, name + "/")
            else:
                out.append(name)

    walk(root, "")
    return sorted(out)


TZDATA_FILES = _tzdata_files()
ZONE_NAMES = st.one_of(
    st.sampled_from(TZDATA_FILES),
    st.sampled_from(["UTC", "America/New_York", "Australia/Lord_Howe", "Pacific/Apia", "Etc/GMT-14",
                     "Etc/GMT+12", "Asia/Kolkata", "Europe/London"]),
    st.sampled_from(["../", "UTC\x00", "x" * 300, "", "America/", "/UTC", "America//New_York",
                     "america/new_york", "localtime", "posixrules", "Factory", "zone.tab", "tzdata.zi",
                     "leapseconds", "America/__init__.py", "__init__.py", " UTC", "UTC ", "GMT+0"]),
    st.text(max_size=40),
)


def _cron_value(idx: int):
    lo, hi, names = CRON_FIELDS[idx]
    nums = st.integers(lo - 2, hi + 2).map(str)
    return st.one_of(nums, st.sampled_from(names)) if names else nums


@st.composite
def cron_term(draw, idx: int) -> str:
    lo, hi, names = CRON_FIELDS[idx]
    kind = draw(st.sampled_from(["star", "value", "range", "step", "special", "junk"]))
    v = _cron_value(idx)
    if kind == "star":
        return "*"
    if kind == "value":
        return draw(v)
    if kind == "range":
        return f"{draw(v)}-{draw(v)}"
    if kind == "step":
        base = draw(st.one_of(st.just("*"), v, st.builds(lambda a, b: f"{a}-{b}", v, v)))
        step = draw(st.one_of(st.integers(0, 70).map(str), st.just("99999999999999999999")))
        return f"{base}/{step}"
    if kind == "special":
        if idx == 2:
            return draw(st.sampled_from(["L", "LW", "W", "15W", "L-2", "L/2", "?"]))
        if idx == 4:
            return draw(st.sampled_from(["5L", "0L", "7L", "MONL", "L", "MON#1", "1#5", "5#5", "1#6", "1#0",
                                         "MON#2,FRI#4", "#", "3#", "?"]))
        return draw(st.sampled_from(["L", "#", "?"]))
    return draw(st.text(alphabet="0123456789*/-,#LW?¹٣ ", min_size=1, max_size=6))


@st.composite
def cron_expressions(draw) -> str:
    if draw(st.integers(0, 30)) == 0:
        return draw(st.sampled_from(["@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight",
                                     "@hourly", "@reboot", "@every", "@"]))
    fields = []
    for idx in range(5):
        terms = draw(st.lists(cron_term(idx), min_size=1, max_size=3))
        fields.append(",".join(terms))
    if draw(st.integers(0, 20)) == 0:
        fields = fields[: draw(st.integers(0, 6))]
    return " ".join(fields)


# -- RRULE -------------------------------------------------------------------------------------

def _dt_text(d: datetime) -> str:
    return d.strftime("%Y%m%dT%H%M%S")


DATETIMES = st.one_of(
    st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59)),
    st.datetimes(min_value=datetime(1960, 1, 1), max_value=datetime(2100, 1, 1)),
    st.sampled_from([datetime(1, 1, 1), datetime(9999, 12, 31, 23, 59, 59), datetime(9999, 12, 31),
                     datetime(1970, 1, 1), datetime(2026, 11, 1, 1, 30), datetime(2026, 3, 8, 2, 30)]),
).map(lambda d: d.replace(microsecond=0))


@st.composite
def rrule_parts(draw) -> list[str]:
    freq = draw(st.sampled_from(["YEARLY", "MONTHLY", "WEEKLY", "DAILY", "HOURLY", "MINUTELY", "SECONDLY",
                                 "FORTNIGHTLY", "daily", ""]))
    parts = [f"FREQ={freq}"]
    ints = lambda lo, hi: st.one_of(st.integers(lo, hi), st.sampled_from([0, -1, 99999999999999999999]))

    def listed(strategy, n=3):
        return st.lists(strategy, min_size=1, max_size=n).map(lambda xs: ",".join(map(str, xs)))

    options = {
        "INTERVAL": st.one_of(ints(1, 30), st.sampled_from([1439, 1441, 86399, 86401, 3660, 100000, -5])),
        "COUNT": st.one_of(ints(1, 50), st.sampled_from([2000000000, 100000000, 10**12, 10**13])),
        "UNTIL": DATETIMES.flatmap(lambda d: st.sampled_from([_dt_text(d), _dt_text(d) + "Z", d.strftime("%Y%m%d"),
                                                              "garbage"])),
        "BYMONTH": listed(ints(1, 13)),
        "BYMONTHDAY": listed(st.integers(-32, 32)),
        "BYYEARDAY": listed(st.integers(-367, 367)),
        "BYWEEKNO": listed(st.integers(-54, 54)),
        "BYDAY": listed(st.builds(lambda n, d: f"{n}{d}", st.sampled_from(["", "", "+1", "-1", "2", "5", "-5", "53", "0", "54"]),
                                  st.sampled_from(RRULE_DAYS + ["XX"]))),
        "BYHOUR": listed(st.integers(-1, 24)),
        "BYMINUTE": listed(st.integers(-1, 60), 4),
        "BYSECOND": listed(st.integers(-1, 61), 4),
        "BYSETPOS": listed(st.integers(-367, 367)),
        "WKST": st.sampled_from(RRULE_DAYS + ["XX"]),
        "BYEASTER": st.just("0"),
        "X-NAME": st.just("1"),
    }
    chosen = draw(st.lists(st.sampled_from(sorted(options)), max_size=6, unique=True))
    for name in chosen:
        parts.append(f"{name}={draw(options[name])}")
    return parts


@st.composite
def rrule_expressions(draw) -> str:
    rule = "RRULE:" + ";".join(draw(rrule_parts()))
    dtstart = draw(st.one_of(
        st.none(),
        DATETIMES.map(lambda d: f"DTSTART:{_dt_text(d)}"),
        DATETIMES.map(lambda d: f"DTSTART:{_dt_text(d)}Z"),
        DATETIMES.map(lambda d: f"DTSTART;TZID=America/New_York:{_dt_text(d)}"),
        DATETIMES.map(lambda d: f"DTSTART;VALUE=DATE:{d:%Y%m%d}"),
        st.sampled_from(["DTSTART:garbage", "DTSTART:00000101T000000", "DTSTART:20261301T000000"]),
    ))
    return rule if dtstart is None else f"{dtstart}\n{rule}"


# -- at() and rate() ---------------------------------------------------------------------------

AT_EXPRESSIONS = st.one_of(
    DATETIMES.map(lambda d: f"at({d.isoformat()})"),
    st.builds(lambda d, off: f"at({d.isoformat()}{off})", DATETIMES,
              st.sampled_from(["Z", "+14:00", "-12:00", "+05:30", "-23:59", "+00:00"])),
    st.sampled_from(["at()", "at(tomorrow)", "at(2026-12-01)", "at(9999-12-31T23:59:59)",
                     "at(0001-01-01T00:00:00)", "at(9999-12-31T23:59:59-12:00)", "at(0001-01-01T00:00:00+14:00)",
                     "at(2026-02-30T00:00:00)", "at(" + "9" * 5000 + ")"]),
)
RATE_EXPRESSIONS = st.builds(
    lambda n, unit: f"rate({n} {unit})",
    st.one_of(st.integers(0, 10**7), st.sampled_from([99999999999999999999, 10**9, 5270400, 5270401, 87840, 3660, 3661])),
    st.sampled_from(["minute", "minutes", "hour", "hours", "day", "days", "seconds", "weeks"]),
)

EXPRESSIONS = st.one_of(cron_expressions(), rrule_expressions(), AT_EXPRESSIONS, RATE_EXPRESSIONS,
                        st.text(max_size=30))

ANCHORS = st.one_of(
    st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(2040, 1, 1), timezones=st.just(UTC)),
    st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31), timezones=st.just(UTC)),
)
AFTERS = st.one_of(
    st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59), timezones=st.just(UTC)),
    st.sampled_from([datetime(9999, 12, 30, 23, 59, 58, tzinfo=UTC), datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC),
                     datetime(1, 1, 1, tzinfo=UTC), datetime(1, 1, 2, tzinfo=UTC)]),
)
FAR = timedelta(days=365 * 300)
