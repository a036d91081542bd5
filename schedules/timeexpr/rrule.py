"""RRULE (RFC 5545) rules, evaluated here with bounded work.

The rule generates NAIVE wall times; WallRule resolves them in the schedule's zone. The meaning
follows RFC 5545 as python-dateutil implements it (the library this engine used before, and the
reference the tests compare against), with these differences, each because dateutil's answer
is not RFC 5545's:

- ``BYDAY=MO,1TU`` (plain and numbered weekdays together) is their union; dateutil intersects.
- ``BYSETPOS`` with ``FREQ=WEEKLY`` selects from the whole week of DTSTART; dateutil uses only
  the part of that first week from DTSTART on.
- ``BYWEEKNO`` numbers every day in its own week-year, negative numbers included.
- ``UNTIL`` in UTC (``...Z``) is an instant: it bounds the resolved occurrences, not wall times.

How it stays cheap. Occurrences are (day, time of day) pairs. Days come from the date filters
(BYMONTH, BYWEEKNO, BYYEARDAY, BYMONTHDAY, BYDAY), computed once per year shape (days.py), and
from a *lattice*: the periods FREQ and INTERVAL select counted from DTSTART (every n-th year,
month, week, day, or hour/minute/second slot). The next day is found by leapfrogging between
the next filtered day and the next day on the lattice, so a rule that fires every few decades
costs a few steps, not a walk through the decades. BYSETPOS of DAILY and shorter frequencies
picks the same positions in every period and is applied once to the times of a period.
COUNT is turned into the wall time of the COUNT-th occurrence when the rule is parsed, by
arithmetic for plain rules and by counting whole years for the others, so evaluating a COUNT
rule never re-reads its history. What cannot be decided within the work budget is refused as
TooExpensive rather than evaluated slowly.
"""

from __future__ import annotations

import bisect
import math
import re
from datetime import date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

from .budget import charge
from .days import (
    ALL_DAYS,
    CYCLE_YEARS,
    KEYS,
    MAX_ORDINAL,
    MAX_YEAR,
    DaySearch,
    WeekdayDays,
    jan1,
    layout,
    shared,
    weekday,
    year_of,
)
from .rules import WallRule
from .types import DstPolicy, ExpressionError

UTC = timezone.utc

FREQS = ("YEARLY", "MONTHLY", "WEEKLY", "DAILY", "HOURLY", "MINUTELY", "SECONDLY")
YEARLY, MONTHLY, WEEKLY, DAILY, HOURLY, MINUTELY, SECONDLY = range(7)
WEEKDAYS = ("MO", "TU", "WE", "TH", "FR", "SA", "SU")
_UNIT_SECONDS = {HOURLY: 3600, MINUTELY: 60, SECONDLY: 1}
_DAY_SECONDS = 86_400
# INTERVAL may span at most about a hundred years of its FREQ.
MAX_INTERVAL = {YEARLY: 100, MONTHLY: 1_200, WEEKLY: 5_218, DAILY: 36_524, HOURLY: 876_576,
                MINUTELY: 52_594_560, SECONDLY: 3_155_673_600}
MAX_COUNT = 10**12
_SUPPORTED = ("FREQ", "INTERVAL", "COUNT", "UNTIL", "WKST", "BYSECOND", "BYMINUTE", "BYHOUR",
              "BYDAY", "BYMONTHDAY", "BYYEARDAY", "BYWEEKNO", "BYMONTH", "BYSETPOS")
_DT = re.compile(r"^([0-9]{8})(?:T([0-9]{6})(Z?))?$")
_INT = re.compile(r"^[+-]?[0-9]{1,12}$")
_BYDAY = re.compile(r"^(?:([+-]?[0-9]{1,2})?(MO|TU|WE|TH|FR|SA|SU)|(MO|TU|WE|TH|FR|SA|SU)\(([+-]?[0-9]{1,2})\))$")


def _bad(msg: str) -> ExpressionError:
    return ExpressionError(f"bad RRULE: {msg}")


# -- parsing -----------------------------------------------------------------------------------

def _parse_naive(value: str, what: str) -> tuple[datetime, bool, bool]:
    """(naive datetime, had a Z suffix, had a time part) from YYYYMMDD[THHMMSS[Z]]."""
    m = _DT.match(value.strip())
    if not m:
        raise _bad(f"{what} {value!r} is not YYYYMMDD or YYYYMMDDTHHMMSS")
    day, tod, z = m.groups()
    try:
        naive = datetime.strptime(day + (tod or "000000"), "%Y%m%d%H%M%S")
    except ValueError:
        raise _bad(f"{what} {value!r} is not a valid date-time") from None
    return naive, bool(z), tod is not None


def _to_zone_wall(instant_naive_utc: datetime, zone: ZoneInfo, what: str, value: str) -> datetime:
    try:
        return instant_naive_utc.replace(tzinfo=UTC).astimezone(zone).replace(tzinfo=None)
    except OverflowError:
        raise _bad(f"{what} {value!r} is outside the calendar in {zone.key}") from None


def _parse_dtstart(line: str, zone: ZoneInfo) -> datetime:
    head, _, value = line.partition(":")
    params = head.split(";")[1:]
    tzid = None
    for p in params:
        k, _, v = p.partition("=")
        if k.upper() == "TZID":
            tzid = v
        elif k.upper() != "VALUE":
            raise _bad(f"unsupported DTSTART parameter {p!r}")
    naive, z, _ = _parse_naive(value, "DTSTART")
    if z:
        if tzid:
            raise _bad("DTSTART cannot have both TZID and a Z suffix")
        return _to_zone_wall(naive, zone, "DTSTART", value)
    if tzid is not None and tzid != zone.key:
        raise _bad(f"DTSTART TZID={tzid} differs from the schedule's timeZone {zone.key}; "
                   "omit TZID or make them the same")
    return naive


def _ints(name: str, value: str, lo: int, hi: int, signed: bool) -> frozenset:
    out = set()
    for item in value.split(","):
        item = item.strip()
        if not _INT.match(item):
            raise _bad(f"{name}={value!r}: {item!r} is not a whole number")
        v = int(item)
        ok = (lo <= abs(v) <= hi) if signed else (lo <= v <= hi)
        if not ok or (signed and v == 0):
            rng = f"{lo} to {hi} or -{hi} to -{lo}" if signed else f"{lo} to {hi}"
            raise _bad(f"{name}={value!r}: {v} is out of range ({rng})")
        out.add(v)
    return frozenset(out)


def _bydays(value: str) -> tuple[frozenset, frozenset]:
    plain, nth = set(), set()
    for item in value.split(","):
        m = _BYDAY.match(item.strip())
        if not m:
            raise _bad(f"BYDAY={value!r}: {item!r} is not a weekday like MO, 1MO or -1FR")
        n_s, wd_s = (m.group(1), m.group(2)) if m.group(2) else (m.group(4), m.group(3))
        wd = WEEKDAYS.index(wd_s)
        if n_s is None:
            plain.add(wd)
            continue
        n = int(n_s)
        if n == 0 or abs(n) > 53:
            raise _bad(f"BYDAY={value!r}: the number in {item!r} must be 1 to 53 or -53 to -1")
        nth.add((wd, n))
    return frozenset(plain), frozenset(nth)


class Spec:
    """A parsed RRULE with dateutil's defaults filled in from DTSTART."""

    def __init__(self, parts: dict, dtstart: datetime):
        freq_s = parts.get("FREQ")
        if freq_s not in FREQS:
            raise _bad(f"FREQ must be one of {', '.join(FREQS)}, not {freq_s!r}")
        self.freq = freq = FREQS.index(freq_s)
        self.dtstart = dtstart
        if "COUNT" in parts and "UNTIL" in parts:
            raise _bad("COUNT and UNTIL cannot both be given")
        self.interval = 1
        if "INTERVAL" in parts:
            v = parts["INTERVAL"]
            top = MAX_INTERVAL[freq]
            if not re.match(r"^[0-9]{1,12}$", v) or not 1 <= int(v) <= top:
                raise _bad(f"INTERVAL={v} must be a whole number from 1 to {top} "
                           f"(at most about 100 years of FREQ={freq_s})")
            self.interval = int(v)
        self.count = None
        if "COUNT" in parts:
            v = parts["COUNT"]
            if not re.match(r"^[0-9]{1,13}$", v) or not 1 <= int(v) <= MAX_COUNT:
                raise _bad(f"COUNT={v} must be a whole number from 1 to {MAX_COUNT}")
            self.count = int(v)
        self.until_wall = None
        self.until_instant = None
        if "UNTIL" in parts:
            naive, z, _ = _parse_naive(parts["UNTIL"], "UNTIL")
            if z:
                self.until_instant = naive.replace(tzinfo=UTC)
            else:
                self.until_wall = naive
        self.wkst = 0
        if "WKST" in parts:
            if parts["WKST"] not in WEEKDAYS:
                raise _bad(f"WKST={parts['WKST']} must be one of {', '.join(WEEKDAYS)}")
            self.wkst = WEEKDAYS.index(parts["WKST"])
        g = parts.get
        self.bymonth = _ints("BYMONTH", g("BYMONTH"), 1, 12, False) if "BYMONTH" in parts else None
        self.byweekno = _ints("BYWEEKNO", g("BYWEEKNO"), 1, 53, True) if "BYWEEKNO" in parts else None
        self.byyearday = _ints("BYYEARDAY", g("BYYEARDAY"), 1, 366, True) if "BYYEARDAY" in parts else None
        self.bymonthday = _ints("BYMONTHDAY", g("BYMONTHDAY"), 1, 31, True) if "BYMONTHDAY" in parts else None
        self.byhour = _ints("BYHOUR", g("BYHOUR"), 0, 23, False) if "BYHOUR" in parts else None
        self.byminute = _ints("BYMINUTE", g("BYMINUTE"), 0, 59, False) if "BYMINUTE" in parts else None
        self.bysecond = _ints("BYSECOND", g("BYSECOND"), 0, 59, False) if "BYSECOND" in parts else None
        self.bysetpos = _ints("BYSETPOS", g("BYSETPOS"), 1, 366, True) if "BYSETPOS" in parts else None
        plain = nth = None
        if "BYDAY" in parts:
            plain, nth = _bydays(parts["BYDAY"])
            if freq >= WEEKLY and nth:
                # RFC 5545 allows numbered weekdays only with MONTHLY and YEARLY; dateutil (and
                # so this engine's earlier releases) read them as plain weekdays otherwise.
                plain = plain | {wd for wd, _ in nth}
                nth = frozenset()
            plain = plain or None
            nth = nth or None
        # dateutil's defaults: a rule with no day filter fires on DTSTART's month day / weekday.
        if not (self.byweekno or self.byyearday or self.bymonthday or plain or nth):
            if freq == YEARLY:
                if not self.bymonth:
                    self.bymonth = frozenset({dtstart.month})
                self.bymonthday = frozenset({dtstart.day})
            elif freq == MONTHLY:
                self.bymonthday = frozenset({dtstart.day})
            elif freq == WEEKLY:
                plain = frozenset({dtstart.weekday()})
        self.byday_plain = plain
        self.byday_nth = nth
        if self.byhour is None and freq < HOURLY:
            self.byhour = frozenset({dtstart.hour})
        if self.byminute is None and freq < MINUTELY:
            self.byminute = frozenset({dtstart.minute})
        if self.bysecond is None and freq < SECONDLY:
            self.bysecond = frozenset({dtstart.second})


def parse_rrule(text: str, zone: ZoneInfo, policy: DstPolicy, anchor: datetime) -> WallRule:
    lines = [ln.strip() for ln in text.replace("\\n", "\n").splitlines() if ln.strip()]
    dtstart = None
    rule_line = None
    for ln in lines:
        up = ln.upper()
        if up.startswith("DTSTART"):
            if dtstart is not None:
                raise _bad("more than one DTSTART line")
            dtstart = _parse_dtstart(ln, zone)
        elif up.startswith("RRULE:"):
            if rule_line is not None:
                raise _bad("more than one RRULE line; give one rule per schedule")
            rule_line = ln[len("RRULE:"):]
        else:
            raise _bad(f"unsupported line {ln[:80]!r}: only DTSTART and one RRULE line are allowed")
    if rule_line is None:
        raise _bad("no RRULE: line, e.g. RRULE:FREQ=DAILY;BYHOUR=9;BYMINUTE=0")
    parts: dict = {}
    for p in rule_line.split(";"):
        if not p.strip():
            continue
        k, eq, v = p.partition("=")
        k = k.strip().upper()
        if not eq:
            raise _bad(f"{p[:40]!r} is not NAME=VALUE")
        if k == "BYEASTER":
            raise _bad("BYEASTER is a python-dateutil extension, not RFC 5545, and is not supported")
        if k not in _SUPPORTED:
            raise _bad(f"unknown part {k[:40]!r}; supported: {', '.join(_SUPPORTED)}")
        if k in parts:
            raise _bad(f"{k} is given twice")
        parts[k] = v.strip().upper()
    if dtstart is None:
        dtstart = anchor.astimezone(zone).replace(tzinfo=None, microsecond=0)
    spec = Spec(parts, dtstart)
    walls = RRuleWalls(spec, text)
    return WallRule("rrule", text, zone, policy, walls, sub_daily=spec.freq >= HOURLY,
                    until=spec.until_instant)


# -- evaluation --------------------------------------------------------------------------------

def _wall(ordinal: int, tod: int) -> datetime:
    d = date.fromordinal(ordinal)
    return datetime(d.year, d.month, d.day, tod // 3600, tod // 60 % 60, tod % 60)


def _tod(w: datetime) -> int:
    return w.hour * 3600 + w.minute * 60 + w.second


def _select(n_items: int, positions) -> list[int]:
    """Indexes BYSETPOS picks from a period of n_items (1-based, negative from the end)."""
    out = set()
    for p in positions:
        i = p - 1 if p > 0 else n_items + p
        if 0 <= i < n_items:
            out.add(i)
    return sorted(out)


def _min_multiple_in(a: int, m: int, lo: int, hi: int) -> int | None:
    """Smallest x >= 0 with (a * x) % m in [lo, hi], for 0 <= lo <= hi < m; None if there is none.

    Euclid-like: if no multiple of a lands in [lo, hi] directly, the wrap-arounds that do are
    found by the same question about m mod a, so it takes O(log m) steps.
    """
    a %= m
    if lo == 0:
        return 0
    if a == 0:
        return None
    x = -(-lo // a)
    if a * x <= hi:
        return x
    y = _min_multiple_in(m % a, a, (-hi) % a, (-lo) % a)
    if y is None:
        return None
    return -(-(lo + m * y) // a)


def first_hit(a: int, b: int, m: int, runs) -> int | None:
    """Smallest x >= 0 with (b + a * x) % m inside one of ``runs`` ([lo, hi] pairs), or None."""
    best = None
    for lo, hi in runs:
        if lo <= b <= hi:
            return 0
        start, end = (lo - b) % m, (hi - b) % m
        x = _min_multiple_in(a, m, start, end) if start <= end else 0
        if x is not None and (best is None or x < best):
            best = x
    return best


def _runs_of(sorted_values, limit: int):
    """Maximal runs of consecutive integers as [lo, hi] pairs, or None past ``limit`` runs."""
    runs = []
    for v in sorted_values:
        if runs and runs[-1][1] == v - 1:
            runs[-1][1] = v
        else:
            if len(runs) >= limit:
                return None
            runs.append([v, v])
    return [tuple(r) for r in runs]


_RUN_LIMIT = 256
# One year residue (mod 400) per distinct year shape.
_SHAPE_RESIDUES = tuple({k: r for r, k in reversed(list(enumerate(KEYS)))}.values())


class _Product:
    """A sorted product set of slot fields, e.g. hours x minutes x seconds, as slot numbers.

    Slot numbers count the smallest unit (a SECONDLY rule's slot is a second of the day). The
    helpers answer "next element at or after x", "how many below x" and "the k-th" without
    listing the product, which can have 86,400 elements.
    """

    def __init__(self, fields: list[tuple[list[int], int]]):
        self.fields = fields  # [(sorted values, radix)], most significant first
        self.size = math.prod(len(v) for v, _ in fields)
        self.sets = [frozenset(v) for v, _ in fields]
        radices = [r for _, r in fields]
        self.weights = [math.prod(radices[i + 1:]) for i in range(len(fields))]
        self.total = math.prod(radices)

    def runs(self, limit: int):
        """The product as runs of consecutive slots, or None past ``limit`` runs."""
        runs: list = []
        last = self.fields[-1][0]
        tail_runs = _runs_of(last, limit)
        if tail_runs is None:
            return None
        w_last = self.weights[-1]
        heads = [0]
        for (vals, _), w in zip(self.fields[:-1], self.weights[:-1]):
            heads = [h + v * w for h in heads for v in vals]
            charge(len(heads) // 16 + 1)
            if len(heads) * len(tail_runs) > 64 * limit:
                return None
        for h in heads:
            for lo, hi in tail_runs:
                a, b = h + lo * w_last, h + hi * w_last
                if runs and runs[-1][1] == a - 1:
                    runs[-1][1] = b
                else:
                    if len(runs) >= limit:
                        return None
                    runs.append([a, b])
        return [tuple(r) for r in runs]

    def digits(self, x: int) -> list[int]:
        return [x // w % r for w, (_, r) in zip(self.weights, self.fields)]

    def contains(self, x: int) -> bool:
        return all(d in s for d, s in zip(self.digits(x), self.sets))

    def next_at_or_after(self, x: int) -> int:
        """Smallest element >= x, or self.total when there is none."""
        if x >= self.total:
            return self.total
        ds = self.digits(x)
        i = 0
        while True:
            vals = self.fields[i][0]
            j = bisect.bisect_left(vals, ds[i])
            if j < len(vals) and vals[j] == ds[i]:
                if i == len(ds) - 1:
                    return x
                i += 1
                continue
            if j < len(vals):
                # Bump this digit up and take the smallest of every lower one.
                out = sum(ds[k] * self.weights[k] for k in range(i)) + vals[j] * self.weights[i]
                return out + sum(self.fields[k][0][0] * self.weights[k] for k in range(i + 1, len(ds)))
            # Carry into a higher digit.
            while True:
                i -= 1
                if i < 0:
                    return self.total
                vals = self.fields[i][0]
                j = bisect.bisect_right(vals, ds[i])
                if j < len(vals):
                    out = sum(ds[k] * self.weights[k] for k in range(i)) + vals[j] * self.weights[i]
                    return out + sum(self.fields[k][0][0] * self.weights[k] for k in range(i + 1, len(ds)))


class RRuleWalls:
    """Naive wall times of one RRULE, found by calendar arithmetic (see the module docstring)."""

    def __init__(self, spec: Spec, text: str):
        self.spec = spec
        self.text = text
        self.freq = freq = spec.freq
        self.n = spec.interval
        self.dtstart = spec.dtstart
        self.d0 = spec.dtstart.toordinal()
        self.setpos = None
        self.last: datetime | None = spec.until_wall
        # Times of day per weekday, when BYSETPOS of a BYDAY-only WEEKLY rule picks different
        # times on different weekdays; else every firing day has self.times.
        self._times_by_wd: tuple | None = None
        self._sel_cache: dict = {}
        self._year_counts: dict = {}
        self._slot_counts: dict = {}
        self._search = None
        if freq >= HOURLY:
            self._init_sub_daily()
        else:
            times = sorted(h * 3600 + m * 60 + s for h in spec.byhour for m in spec.byminute for s in spec.bysecond)
            if spec.bysetpos and freq == DAILY:
                # Every DAILY period holds the same times, so BYSETPOS picks the same ones daily.
                before = len(times)
                times = [times[i] for i in _select(before, spec.bysetpos)]
                if not times:
                    raise self._never(f"BYSETPOS={','.join(map(str, sorted(spec.bysetpos)))} picks nothing: "
                                      f"with FREQ=DAILY a day holds only {before} occurrence(s) of this rule")
            self.times = tuple(times)
            self._pid0 = self._period_id(self.d0)
            if spec.bysetpos and freq == WEEKLY and not any(
                    (spec.bymonth, spec.byweekno, spec.byyearday, spec.bymonthday)):
                self._weekly_picks(spec)
            elif spec.bysetpos and freq != DAILY:
                self.setpos = self._reachable_positions(spec.bysetpos)
        self._check_fires()
        if spec.count is not None:
            last = self._count_last(spec.count)
            if last is not None and (self.last is None or last < self.last):
                self.last = last

    # -- errors ----------------------------------------------------------------------------

    def _never(self, why: str) -> ExpressionError:
        return ExpressionError(f"{self.text!r} never fires: {why}")

    # -- days --------------------------------------------------------------------------------

    @property
    def search(self):
        """The days passing the date filters; shared with every rule that has the same ones."""
        if self._search is None:
            s = self.spec
            if not any((s.bymonth, s.byweekno, s.byyearday, s.bymonthday, s.byday_nth)):
                self._search = ALL_DAYS if s.byday_plain is None else WeekdayDays(s.byday_plain)
            else:
                nth_scope = "month" if self.freq == MONTHLY or (self.freq == YEARLY and s.bymonth) else "year"
                key = ("rrule", nth_scope, s.bymonth, s.byweekno, s.byyearday, s.bymonthday,
                       s.byday_plain, s.byday_nth, s.wkst if s.byweekno else 0)
                self._search = shared(key, lambda: DaySearch(lambda shape: _days_of(key, shape)))
        return self._search

    def _period_id(self, o: int) -> int:
        f = self.freq
        if f == DAILY:
            return o
        if f == WEEKLY:
            return (o - 1 - self.spec.wkst) // 7
        d = date.fromordinal(o)
        return d.year * 12 + d.month - 1 if f == MONTHLY else d.year

    def _period_start(self, pid: int) -> int | None:
        """First ordinal of period ``pid``, or None when it starts after the calendar ends."""
        f = self.freq
        if f == DAILY:
            o = pid
        elif f == WEEKLY:
            o = pid * 7 + 1 + self.spec.wkst
        elif f == MONTHLY:
            y, m = divmod(pid, 12)
            if y > MAX_YEAR:
                return None
            o = jan1(y) + layout(KEYS[y % CYCLE_YEARS]).month_starts[m]
        else:
            if pid > MAX_YEAR:
                return None
            o = jan1(pid)
        return o if o <= MAX_ORDINAL else None

    def _valid_from(self, o: int) -> int | None:
        """The first day >= o in a period the lattice keeps (every INTERVAL-th from DTSTART's)."""
        if self.n == 1:
            return o
        pid = self._period_id(o)
        k = (self._pid0 - pid) % self.n
        return o if k == 0 else self._period_start(pid + k)

    def _next_firing_day(self, o: int) -> int | None:
        """First day >= o that passes the date filters and lies in a kept period (DAILY+)."""
        while True:
            charge()
            c = self.search.next_day(o)
            if c is None:
                return None
            v = self._valid_from(c)
            if v is None:
                return None
            if v == c:
                return c
            o = v

    # -- sub-daily ---------------------------------------------------------------------------

    def _init_sub_daily(self) -> None:
        s = self.spec
        f = self.freq
        self.unit = _UNIT_SECONDS[f]
        self.U = _DAY_SECONDS // self.unit  # slots per day
        hours = sorted(s.byhour) if s.byhour is not None else list(range(24))
        minutes = sorted(s.byminute) if s.byminute is not None else list(range(60))
        seconds = sorted(s.bysecond) if s.bysecond is not None else list(range(60))
        if f == HOURLY:
            self.slots = _Product([(hours, 24)])
            offsets = sorted(m * 60 + sec for m in minutes for sec in seconds)
        elif f == MINUTELY:
            self.slots = _Product([(hours, 24), (minutes, 60)])
            offsets = list(seconds)
        else:
            self.slots = _Product([(hours, 24), (minutes, 60), (seconds, 60)])
            offsets = [0]
        if s.bysetpos:
            # Every slot (hour, minute or second) that fires holds the same offsets, so BYSETPOS
            # picks the same ones in each.
            before = len(offsets)
            offsets = [offsets[i] for i in _select(before, s.bysetpos)]
            if not offsets:
                per = {HOURLY: "an hour", MINUTELY: "a minute", SECONDLY: "a second"}[f]
                raise self._never(f"BYSETPOS={','.join(map(str, sorted(s.bysetpos)))} picks nothing: "
                                  f"with FREQ={FREQS[f]} {per} holds only {before} occurrence(s) of this rule")
        self.offsets = tuple(offsets)
        t0 = _tod(self.dtstart)
        self.slot0 = self.d0 * self.U + t0 // self.unit
        n = self.n
        self.step_seconds = n * self.unit
        # Residues mod n of the slots a day can hold; a day fires when its lattice residue is one.
        self._good = None
        self._good_runs = None
        if n < self.U:
            self._good = self._residues()
            if self._good is not _ALL:
                self._good_runs = _runs_of(sorted(self._good), _RUN_LIMIT)
        self._slot_runs = self.slots.runs(_RUN_LIMIT)
        # With BYDAY as the only date filter, days are found weekday by weekday (see
        # _next_weekday_day), which also sees when a weekday and the lattice never meet.
        self._weekdays = None
        if s.byday_plain is not None and not any((s.bymonth, s.byweekno, s.byyearday, s.bymonthday, s.byday_nth)):
            self._weekdays = tuple(sorted(s.byday_plain))

    def _residues(self):
        """{slot mod n : slot allowed}, built field by field; _ALL once it holds every residue."""
        n = self.n
        acc = {0}
        for (vals, _), weight in zip(self.slots.fields, self.slots.weights):
            charge(len(acc) * len(vals) // 16 + 1)
            acc = {(a + v * weight) % n for a in acc for v in vals}
            if len(acc) == n:
                return _ALL
        return frozenset(acc)

    def _day_residue(self, o: int) -> int:
        """Lattice slots of day o are those a with a = this (mod n)."""
        return (self.slot0 - o * self.U) % self.n

    def _day_fires(self, o: int) -> bool:
        r = self._day_residue(o)
        if self.n >= self.U:
            return r < self.U and self.slots.contains(r)
        return r in self._good

    def _next_firing_day_sub(self, o: int) -> int | None:
        """First day >= o that passes the date filters and holds an allowed lattice slot."""
        n, U = self.n, self.U
        if self._weekdays is not None:
            return self._next_weekday_day(o)
        while True:
            charge()
            c = self.search.next_day(o)
            if c is None:
                return None
            if n >= U:
                # At most one lattice slot a day: the day of the next allowed one.
                s = self._next_allowed_lattice_slot(c * U)
                if s is None:
                    return None
                d = s // U
            else:
                d = self._next_good_day(c)
                if d is None:
                    return None
            if d == c:
                return c
            o = d

    def _next_weekday_day(self, o: int) -> int | None:
        """The first day >= o on one of self._weekdays that holds an allowed lattice slot.

        Days of one weekday are 7 apart, so their lattice residues (or, for INTERVAL of a day or
        more, the lattice slots landing on them) follow an arithmetic progression too: the first
        good one is found with first_hit, weekday by weekday, and is None when they never meet.
        """
        n, U = self.n, self.U
        best = None
        for wd in self._weekdays:
            d = o + (wd - weekday(o)) % 7
            if n >= U:
                # Lattice slots s = slot0 + k*n; s lands on weekday wd with an allowed slot of day
                # when s mod 7U falls in that weekday's copy of the allowed runs.
                runs = self._week_runs(wd)
                if runs is None:
                    got = self._scan_weekday_sparse(d, wd)
                else:
                    k0 = -(-(d * U - self.slot0) // n)
                    b = (self.slot0 + k0 * n) % (7 * U)
                    k = first_hit(n % (7 * U), b, 7 * U, runs)
                    charge(len(runs) // 8 + 1)
                    got = None if k is None else (self.slot0 + (k0 + k) * n) // U
            else:
                if self._good is _ALL:
                    got = d
                elif self._good_runs is None:
                    got = self._scan_weekday_dense(d)
                else:
                    k = first_hit((-7 * U) % n, self._day_residue(d), n, self._good_runs)
                    charge(len(self._good_runs) // 8 + 1)
                    got = None if k is None else d + 7 * k
            if got is not None and (best is None or got < best):
                best = got
        return best if best is not None and best <= MAX_ORDINAL else None

    def _week_runs(self, wd: int):
        """Runs of allowed slots, as positions in a week of slots (s mod 7U), on weekday wd."""
        if self._slot_runs is None:
            return None
        # Ordinal o has weekday (o - 1) % 7, so slot s = o*U + a has s // U = o.
        j = (wd + 1) % 7
        U = self.U
        return [(j * U + lo, j * U + hi) for lo, hi in self._slot_runs]

    def _scan_weekday_sparse(self, d: int, wd: int) -> int | None:
        U = self.U
        s = self._next_allowed_lattice_slot(d * U)
        while s is not None:
            charge()
            if weekday(s // U) == wd:
                return s // U
            s = self._next_allowed_lattice_slot(s + 1)
        return None

    def _scan_weekday_dense(self, d: int) -> int | None:
        while d <= MAX_ORDINAL:
            charge()
            if self._day_residue(d) in self._good:
                return d
            d += 7
        return None

    def _next_allowed_lattice_slot(self, x: int) -> int | None:
        """The first lattice slot >= x (absolute) whose slot of day is allowed (INTERVAL >= a day)."""
        n, U = self.n, self.U
        k0 = -(-(x - self.slot0) // n)
        b = (self.slot0 + k0 * n) % U
        if self._slot_runs is not None:
            k = first_hit(n % U, b, U, self._slot_runs)
            charge(len(self._slot_runs) // 8 + 1)
            if k is None:
                return None
            s = self.slot0 + (k0 + k) * n
        else:
            s = self.slot0 + k0 * n
            while not self.slots.contains(s % U):
                charge()
                s += n
        return s if s // U <= MAX_ORDINAL else None

    def _next_good_day(self, o: int) -> int | None:
        """The first day >= o whose lattice residue some allowed slot has (INTERVAL < a day)."""
        good = self._good
        if good is _ALL:
            return o
        r = self._day_residue(o)
        n = self.n
        step = (-self.U) % n  # a day later, every lattice residue moves by -U (mod n)
        if self._good_runs is not None:
            k = first_hit(step, r, n, self._good_runs)
            charge(len(self._good_runs) // 8 + 1)
            return None if k is None else o + k
        while r not in good:
            charge()
            o += 1
            r = (r + step) % n
        return o

    def _first_slot_time(self, o: int, th: int) -> int | None:
        """First time of day >= th (seconds) on day o that the sub-daily rule holds."""
        unit, U = self.unit, self.U
        r = self._day_residue(o)
        x = th // unit
        offs = self.offsets
        while x < U:
            charge()
            x = self._next_slot_on_day(x, r)
            if x is None:
                return None
            base = x * unit
            if base >= th:
                return base + offs[0]
            i = bisect.bisect_left(offs, th - base)
            if i < len(offs):
                return base + offs[i]
            x += 1
        return None

    def _next_slot_on_day(self, x: int, r: int) -> int | None:
        """The first slot of day >= x on the lattice (= r mod n) and allowed, or None."""
        n, U = self.n, self.U
        y = x + (r - x) % n
        if y >= U:
            return None
        if self._slot_runs is not None:
            k = first_hit(n % U, y, U, self._slot_runs)
            charge(len(self._slot_runs) // 8 + 1)
            # A hit that wrapped past midnight belongs to a later day.
            if k is None or y + k * n >= U:
                return None
            return y + k * n
        while True:
            charge()
            x = self.slots.next_at_or_after(y)
            if x >= U:
                return None
            y = x + (r - x) % n
            if y == x:
                return x

    # -- walls -------------------------------------------------------------------------------

    def next(self, w: datetime, inclusive: bool) -> datetime | None:
        if w < self.dtstart:
            w, inclusive = self.dtstart, True
        th = _tod(w) + (0 if inclusive and not w.microsecond else 1)
        got = self._next_raw(w.toordinal(), th)
        if got is None or (self.last is not None and got > self.last):
            return None
        return got

    def _next_raw(self, o: int, th: int) -> datetime | None:
        """First wall time (day, time) >= (o, th), ignoring COUNT and UNTIL."""
        if th >= _DAY_SECONDS:
            o, th = o + 1, 0
        if self.setpos is not None:
            return self._next_setpos(o, th)
        sub = self.freq >= HOURLY
        while True:
            charge()
            d = self._next_firing_day_sub(o) if sub else self._next_firing_day(o)
            if d is None:
                return None
            t0 = th if d == o else 0
            if sub:
                t = self._first_slot_time(d, t0)
            else:
                times = self._times_on(d)
                i = bisect.bisect_left(times, t0)
                t = times[i] if i < len(times) else None
            if t is not None:
                return _wall(d, t)
            o, th = d + 1, 0

    # -- BYSETPOS for WEEKLY, MONTHLY and YEARLY -------------------------------------------------

    def _period_end(self, pid: int) -> int:
        nxt = self._period_start(pid + 1)
        return MAX_ORDINAL + 1 if nxt is None else nxt

    def _selection(self, pid: int) -> tuple:
        """The (ordinal, time of day) pairs BYSETPOS picks in period ``pid``, sorted."""
        sel = self._sel_cache.get(pid)
        if sel is not None:
            return sel
        start = self._period_start(pid)
        end = self._period_end(pid)
        days = []
        o = start
        while o is not None and o < end:
            charge()
            y = year_of(o)
            base = jan1(y)
            lst = self.search.days(y)
            i = bisect.bisect_left(lst, o - base)
            stop = min(end, jan1(y + 1)) - base
            j = bisect.bisect_left(lst, stop)
            days.extend(base + x for x in lst[i:j])
            o = base + stop
        times = self.times
        nt = len(times)
        charge(6 + len(days) // 2)
        sel = tuple((days[i // nt], times[i % nt]) for i in _select(len(days) * nt, self.setpos))
        if len(self._sel_cache) > 64:
            self._sel_cache.clear()
        self._sel_cache[pid] = sel
        return sel

    def _next_setpos(self, o: int, th: int) -> datetime | None:
        while True:
            charge()
            # Picked days are filtered days of kept periods, so none lies between o and c.
            c = self._next_firing_day(o)
            if c is None:
                return None
            pid = self._period_id(c)
            sel = self._selection(pid)
            i = bisect.bisect_left(sel, (o, th) if c == o else (c, 0))
            if i < len(sel):
                return _wall(*sel[i])
            o, th = self._period_end(pid), 0
            if o > MAX_ORDINAL:
                return None

    def _weekly_picks(self, spec: Spec) -> None:
        """BYSETPOS of a WEEKLY rule filtered by BYDAY alone: every week holds the same items.

        So the positions pick the same (weekday, time) pairs each week, once, here; the rule
        then needs no per-week work.
        """
        wkst = spec.wkst
        wds = sorted(spec.byday_plain, key=lambda wd: (wd - wkst) % 7)
        items = [(wd, t) for wd in wds for t in self.times]
        picked = [items[i] for i in _select(len(items), spec.bysetpos)]
        if not picked:
            raise self._never(f"BYSETPOS={','.join(map(str, sorted(spec.bysetpos)))} picks nothing: "
                              f"a week holds only {len(items)} occurrence(s) of this rule")
        by_wd = [[] for _ in range(7)]
        for wd, t in picked:
            by_wd[wd].append(t)
        spec.byday_plain = frozenset(wd for wd, _ in picked)
        self._times_by_wd = tuple(tuple(sorted(ts)) for ts in by_wd)

    def _times_on(self, o: int) -> tuple:
        tbw = self._times_by_wd
        return self.times if tbw is None else tbw[weekday(o)]

    def _reachable_positions(self, positions) -> frozenset:
        """The BYSETPOS positions some period can hold; refuse the rule when none can.

        A period holds (filtered days in it) x (times) items; its most days is found over the
        year shapes of the whole cycle (a week has at most as many as BYDAY allows).
        """
        s = self.spec
        if self.freq == WEEKLY:
            most_days = len(s.byday_plain) if s.byday_plain else 7
            per = "a week"
        else:
            most_days = 0
            for r in _SHAPE_RESIDUES:
                charge()
                lst = self.search.days(400 + r)
                if self.freq == YEARLY:
                    most_days = max(most_days, len(lst))
                else:
                    starts = layout(KEYS[r]).month_starts
                    for m in range(12):
                        most_days = max(most_days, bisect.bisect_left(lst, starts[m + 1]) - bisect.bisect_left(lst, starts[m]))
            per = "a year" if self.freq == YEARLY else "a month"
        most = most_days * len(self.times)
        keep = frozenset(p for p in positions if abs(p) <= most)
        if not keep:
            raise self._never(f"BYSETPOS={','.join(map(str, sorted(positions)))} picks nothing: "
                              f"{per} holds at most {most} occurrence(s) of this rule")
        return keep

    # -- never fires -------------------------------------------------------------------------

    def _check_fires(self) -> None:
        """Refuse, by reasoning over the calendar's cycle, rules that match nothing at all."""
        s = self.spec
        if not self.search.ever():
            raise self._never("no day of the 400-year Gregorian cycle passes its date filters "
                              f"({self._filters_text()})")
        f, n = self.freq, self.n
        if f == YEARLY and n > 1:
            # Kept years are Y0 + k*n; their shapes repeat after 400 / gcd(400, n) of them.
            y0 = self.dtstart.year
            if not any(self.search.days(y0 + k * n) for k in range(CYCLE_YEARS // math.gcd(CYCLE_YEARS, n))):
                raise self._never(f"no kept year (every {n}th from {y0}) has a day passing its date filters")
        elif f == MONTHLY and n > 1:
            steps = 4800 // math.gcd(4800, n)
            charge(steps // 4)
            ok = False
            for k in range(steps):
                y, m = divmod(self._pid0 + k * n, 12)
                y = 400 + y % CYCLE_YEARS
                lay = layout(KEYS[y % CYCLE_YEARS])
                lst = self.search.days(y)
                if bisect.bisect_left(lst, lay.month_starts[m]) < bisect.bisect_left(lst, lay.month_starts[m + 1]):
                    ok = True
                    break
            if not ok:
                raise self._never(f"no kept month (every {n}th from DTSTART's) has a day passing its date filters")
        step_days = n if f == DAILY else (n * _UNIT_SECONDS[f] // _DAY_SECONDS
                                          if f >= HOURLY and n * _UNIT_SECONDS[f] % _DAY_SECONDS == 0 else 0)
        if step_days and step_days % 7 == 0 and s.byday_plain is not None and weekday(self.d0) not in s.byday_plain:
            # A lattice of whole weeks stays on DTSTART's weekday.
            raise self._never(f"its INTERVAL steps whole weeks from a {WEEKDAYS[weekday(self.d0)]}, "
                              "which BYDAY excludes")
        if f >= HOURLY:
            self._check_slots_reachable()
            if self._weekdays is not None and self._next_weekday_day(self.d0) is None:
                days = ",".join(WEEKDAYS[w] for w in self._weekdays)
                raise self._never(f"its INTERVAL steps from DTSTART never land on BYDAY={days} "
                                  "at one of its BYHOUR/BYMINUTE/BYSECOND times")

    def _check_slots_reachable(self) -> None:
        n, U = self.n, self.U
        g = math.gcd(n, U)
        r = self.slot0 % g
        hours = self.slots.fields[0][0]
        # Some allowed slot of the day must be congruent to the lattice's residue mod gcd(n, U).
        if self.freq == HOURLY:
            ok = any((h - r) % g == 0 for h in hours)
        elif self.freq == MINUTELY:
            minutes = self.slots.fields[1][0]
            ok = any((h * 60 + m - r) % g == 0 for h in hours for m in minutes)
        else:
            minutes, seconds = self.slots.fields[1][0], self.slots.fields[2][0]
            sres = {sec % g for sec in seconds}
            charge(len(hours) * len(minutes) // 8)
            ok = any((r - h * 3600 - m * 60) % g in sres for h in hours for m in minutes)
        if not ok:
            raise self._never(f"INTERVAL={n} steps from DTSTART never reach its BYHOUR/BYMINUTE/BYSECOND times")

    def _filters_text(self) -> str:
        s = self.spec
        out = []
        for name, v in (("BYMONTH", s.bymonth), ("BYWEEKNO", s.byweekno), ("BYYEARDAY", s.byyearday),
                        ("BYMONTHDAY", s.bymonthday)):
            if v:
                out.append(f"{name}={','.join(map(str, sorted(v)))}")
        if s.byday_plain or s.byday_nth:
            days = [WEEKDAYS[d] for d in sorted(s.byday_plain or ())]
            days += [f"{k}{WEEKDAYS[d]}" for d, k in sorted(s.byday_nth or ())]
            out.append("BYDAY=" + ",".join(days))
        return "; ".join(out) or "none"

    # -- COUNT -------------------------------------------------------------------------------

    def _plain_step(self) -> timedelta | None:
        """The distance between consecutive wall times when every lattice point holds exactly one."""
        s = self.spec
        others = any(x is not None for x in (s.bymonth, s.byweekno, s.byyearday, s.bymonthday, s.byday_nth))
        if others:
            return None
        if self.freq >= HOURLY:
            if s.byday_plain is not None or self.slots.size != self.slots.total or len(self.offsets) != 1:
                return None
            return timedelta(seconds=self.step_seconds)
        if self.setpos is not None or self._times_by_wd is not None or len(self.times) != 1:
            return None
        if self.freq == DAILY and s.byday_plain is None:
            return timedelta(days=self.n)
        if self.freq == WEEKLY and s.byday_plain is not None and len(s.byday_plain) == 1:
            return timedelta(weeks=self.n)
        return None

    def _count_last(self, count: int) -> datetime | None:
        """The wall time of the count-th occurrence from DTSTART, or None when the calendar ends first.

        Steps: the first occurrence; then, for a rule whose wall times are evenly spaced, plain
        arithmetic; else the rest of the first day and of the first year, then whole years by
        their count (cached per year shape and lattice phase), then the days of the last year.
        """
        first = self._next_raw(self.d0, _tod(self.dtstart))
        if first is None:
            return None
        if count == 1:
            return first
        step = self._plain_step()
        if step is not None:
            try:
                last = first + (count - 1) * step
            except OverflowError:
                return None
            return last if last.year <= MAX_YEAR else None
        remaining = count
        o = first.toordinal()
        on_first = self._walls_on_day(o, _tod(first))
        if remaining <= on_first:
            return self._kth_on_day(o, _tod(first), remaining)
        remaining -= on_first
        y = year_of(o)
        got = self._walk_days(o + 1, jan1(y + 1), remaining)
        if isinstance(got, datetime):
            return got
        remaining = got
        y += 1
        while y <= MAX_YEAR:
            charge()
            c = self._walls_in_year(y)
            if remaining <= c:
                got = self._walk_days(jan1(y), jan1(y + 1), remaining)
                return got if isinstance(got, datetime) else None
            remaining -= c
            y += 1
        return None

    def _walk_days(self, o: int, end: int, remaining: int):
        """Walk firing days in [o, end): the wall time where ``remaining`` runs out, else what is left."""
        while o < end:
            charge()
            d = self._next_firing_day_sub(o) if self.freq >= HOURLY else self._next_firing_day(o)
            if d is None or d >= end:
                break
            c = self._walls_on_day(d, 0)
            if remaining <= c:
                return self._kth_on_day(d, 0, remaining)
            remaining -= c
            o = d + 1
        return remaining

    def _year_phase(self, y: int):
        f, n = self.freq, self.n
        if f >= HOURLY:
            return (self.slot0 - jan1(y) * self.U) % n
        if f == DAILY:
            return (jan1(y) - self.d0) % n
        if f == WEEKLY:
            return ((jan1(y) - 1 - self.spec.wkst) // 7 - self._pid0) % n
        if f == MONTHLY:
            return (12 * y - self._pid0) % n
        return (y - self._pid0) % n

    def _walls_in_year(self, y: int) -> int:
        # A WEEKLY period with BYSETPOS can straddle New Year, so its count depends on the
        # neighbouring years too: key those by the year's place in the cycle.
        shape = y % CYCLE_YEARS if (self.setpos is not None and self.freq == WEEKLY) else KEYS[y % CYCLE_YEARS]
        key = (shape, self._year_phase(y))
        got = self._year_counts.get(key)
        if got is None:
            got = self._setpos_walls_in_year(y) if self.setpos is not None else self._count_year(y)
            self._year_counts[key] = got
        return got

    def _count_year(self, y: int) -> int:
        """Wall times in year y: one pass over its filtered days, no search."""
        days = self.search.days(y)
        base = jan1(y)
        f, n = self.freq, self.n
        charge(len(days) // 4 + 1)
        if f >= HOURLY:
            U, per = self.U, len(self.offsets)
            ph = (self.slot0 - base * U) % n
            if n >= U:
                contains = self.slots.contains
                return per * sum(1 for i in days if (r := (ph - i * U) % n) < U and contains(r))
            if U % n == 0:
                return per * len(days) * self._slot_count(ph)
            sc = self._slot_count
            return per * sum(sc((ph - i * U) % n) for i in days)
        if f == YEARLY:
            kept = days if (y - self._pid0) % n == 0 else ()
        elif n == 1:
            kept = days
        elif f == DAILY:
            kept = [i for i in days if (base + i - self.d0) % n == 0]
        elif f == WEEKLY:
            w = base - 1 - self.spec.wkst
            kept = [i for i in days if ((w + i) // 7 - self._pid0) % n == 0]
        else:
            month = layout(KEYS[y % CYCLE_YEARS]).month
            kept = [i for i in days if (12 * y + month[i] - 1 - self._pid0) % n == 0]
        tbw = self._times_by_wd
        if tbw is None:
            return len(kept) * len(self.times)
        wd1 = weekday(base)
        return sum(len(tbw[(wd1 + i) % 7]) for i in kept)

    def _setpos_walls_in_year(self, y: int) -> int:
        """Picked wall times dated in year y, period by period."""
        lo, hi = jan1(y), jan1(y + 1)
        pid, last = self._period_id(lo), self._period_id(hi - 1)
        got = 0
        while pid <= last:
            charge()
            k = (pid - self._pid0) % self.n
            if k:
                pid += self.n - k
                continue
            sel = self._selection(pid)
            got += bisect.bisect_left(sel, (hi, 0)) - bisect.bisect_left(sel, (lo, 0))
            pid += self.n
        return got

    def _slot_count(self, r: int) -> int:
        """Allowed lattice slots in a whole day whose lattice residue is r."""
        got = self._slot_counts.get(r)
        if got is None:
            got = self._slots_with(r, 0)
        return got

    def _slots_on_day(self, o: int, from_slot: int) -> int:
        """How many lattice slots >= from_slot day o's allowed slots hold."""
        return self._slots_with(self._day_residue(o), from_slot)

    def _slots_with(self, r: int, from_slot: int) -> int:
        if from_slot == 0:
            got = self._slot_counts.get(r)
            if got is not None:
                return got
        count = 0
        x = from_slot
        n, U = self.n, self.U
        if n == 1:
            count = self._rank_from(x)
        else:
            while x < U:
                charge()
                x = self._next_slot_on_day(x, r)
                if x is None:
                    break
                count += 1
                x += 1
        if from_slot == 0:
            self._slot_counts[r] = count
        return count

    def _rank_from(self, x: int) -> int:
        """How many allowed slots are >= x (every slot is on the lattice when INTERVAL is 1)."""
        below = 0
        ds = self.slots.digits(x) if x < self.slots.total else None
        if ds is None:
            return 0
        mult = self.slots.size
        for (vals, _), d, s in zip(self.slots.fields, ds, self.slots.sets):
            mult //= len(vals)
            below += bisect.bisect_left(vals, d) * mult
            if d not in s:
                break
        return self.slots.size - below

    def _walls_on_day(self, o: int, from_tod: int) -> int:
        if self.setpos is not None:
            sel = self._selection(self._period_id(o))
            return bisect.bisect_left(sel, (o + 1, 0)) - bisect.bisect_left(sel, (o, from_tod))
        if self.freq < HOURLY:
            times = self._times_on(o)
            return len(times) - bisect.bisect_left(times, from_tod)
        first = from_tod // self.unit
        n = self._slots_on_day(o, first) * len(self.offsets)
        # The slot holding from_tod may have offsets before it.
        if first * self.unit < from_tod and self._slot_fires(o, first):
            n -= bisect.bisect_left(self.offsets, from_tod - first * self.unit)
        return n

    def _slot_fires(self, o: int, a: int) -> bool:
        return self.slots.contains(a) and (a - self._day_residue(o)) % self.n == 0

    def _kth_on_day(self, o: int, from_tod: int, k: int) -> datetime:
        """The k-th (1-based) wall time on day o at or after from_tod; the caller knows it exists."""
        if self.setpos is not None:
            sel = self._selection(self._period_id(o))
            return _wall(*sel[bisect.bisect_left(sel, (o, from_tod)) + k - 1])
        if self.freq < HOURLY:
            times = self._times_on(o)
            return _wall(o, times[bisect.bisect_left(times, from_tod) + k - 1])
        unit, offs = self.unit, self.offsets
        a = from_tod // unit
        if a * unit < from_tod:
            # The slot holding from_tod contributes only its offsets from there on.
            if self._slot_fires(o, a):
                i = bisect.bisect_left(offs, from_tod - a * unit)
                if k <= len(offs) - i:
                    return _wall(o, a * unit + offs[i + k - 1])
                k -= len(offs) - i
            a += 1
        q, idx = divmod(k - 1, len(offs))
        return _wall(o, self._qth_slot(o, a, q) * unit + offs[idx])

    def _qth_slot(self, o: int, a: int, q: int) -> int:
        """The q-th (0-based) lattice slot >= a that day o's allowed slots hold."""
        if self.n == 1:
            # Every allowed slot is on the lattice: index straight into the product.
            j = self.slots.size - self._rank_from(a) + q
            val = 0
            mult = self.slots.size
            for (vals, _), w in zip(self.slots.fields, self.slots.weights):
                mult //= len(vals)
                val += vals[j // mult] * w
                j %= mult
            return val
        r = self._day_residue(o)
        x = a
        while True:
            charge()
            x = self._next_slot_on_day(x, r)
            if q == 0:
                return x
            q -= 1
            x += 1


class _AllResidues:
    def __contains__(self, item) -> bool:
        return True


_ALL = _AllResidues()



def _days_of(fkey, shape) -> list[int]:
    """Days of year (0-based) passing every date filter of ``fkey`` in a year of this shape.

    The filters are intersected (dateutil's reading); plain and numbered BYDAY entries are
    united (RFC 5545). Numbered weekdays count within the month for MONTHLY rules and YEARLY
    rules with BYMONTH, within the year otherwise.
    """
    _, nth_scope, bymonth, byweekno, byyearday, bymonthday, byday_plain, byday_nth, wkst = fkey
    lay = layout(shape)
    n = lay.length
    keep = None

    def meet(days):
        nonlocal keep
        keep = set(days) if keep is None else keep & set(days)

    if bymonth:
        meet(i for m in bymonth for i in range(lay.month_starts[m - 1], lay.month_starts[m]))
    if byyearday:
        meet((d - 1 if d > 0 else n + d) for d in byyearday if (d <= n if d > 0 else -d <= n))
    if bymonthday:
        got = []
        for m in range(1, 13):
            start, ml = lay.month_starts[m - 1], lay.month_lens[m - 1]
            for d in bymonthday:
                if 0 < d <= ml:
                    got.append(start + d - 1)
                elif d < 0 and -d <= ml:
                    got.append(start + ml + d)
        meet(got)
    if byweekno:
        wn = lay.week_numbers(wkst)
        meet(i for i in range(n) if wn[i][0] in byweekno or wn[i][1] in byweekno)
    if byday_plain or byday_nth:
        got = []
        for wd in byday_plain or ():
            got.extend(range((wd - lay.jan1_weekday) % 7, n, 7))
        if byday_nth:
            if nth_scope == "month":
                ranges = [(lay.month_starts[m - 1], lay.month_starts[m] - 1) for m in range(1, 13)]
            else:
                ranges = [(0, n - 1)]
            for first, last in ranges:
                for wd, k in byday_nth:
                    if k > 0:
                        i = first + (k - 1) * 7 + (wd - lay.wday[first]) % 7
                    else:
                        i = last + (k + 1) * 7 - (lay.wday[last] - wd) % 7
                    if first <= i <= last:
                        got.append(i)
        meet(got)
    charge(n // 8)
    return sorted(range(n) if keep is None else keep)
