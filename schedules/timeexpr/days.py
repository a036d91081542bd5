"""Gregorian calendar arithmetic shared by cron and RRULE day filters.

The Gregorian calendar repeats every 400 years (146,097 days, a whole number of weeks), and
everything a day filter can ask about a day (month, day of month, weekday, day of year, week
number, "last Friday", "fifth Monday") depends only on its year's *shape*: whether the year and
its neighbours are leap years and the weekday of January 1st. There are at most 28 shapes, and
year Y's shape is that of Y % 400. So a rule's matching days are computed once per shape, and
"does this rule ever fire" and "when does it fire next" become questions about at most 400
years of shapes, answered without walking days one by one.
"""

from __future__ import annotations

import bisect
import threading
from array import array
from collections import OrderedDict
from datetime import date
from functools import lru_cache

from .budget import charge

MIN_YEAR = 1
MAX_YEAR = 9999
CYCLE_YEARS = 400
CYCLE_DAYS = 146_097
MAX_ORDINAL = date(MAX_YEAR, 12, 31).toordinal()
MONTH_NAMES = ("January", "February", "March", "April", "May", "June", "July", "August",
               "September", "October", "November", "December")
_MDAYS = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def is_leap(y: int) -> bool:
    return y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)


def jan1(y: int) -> int:
    """Ordinal (date.toordinal) of January 1st of year y; works for any integer year."""
    y1 = y - 1
    return y1 * 365 + y1 // 4 - y1 // 100 + y1 // 400 + 1


def weekday(ordinal: int) -> int:
    """Monday = 0, as date.weekday(); ordinal 1 (0001-01-01) was a Monday."""
    return (ordinal - 1) % 7


def month_len(y: int, m: int) -> int:
    return 29 if m == 2 and is_leap(y) else _MDAYS[m - 1]


def year_of(ordinal: int) -> int:
    return date.fromordinal(ordinal).year


# Shape of a year: (previous year leap, this year leap, next year leap, weekday of January 1st).
Key = tuple


def _key(y: int) -> Key:
    return (is_leap(y - 1), is_leap(y), is_leap(y + 1), weekday(jan1(y)))


# Shapes by y % 400, computed from years 400..799 (the same residues, clear of year 0).
KEYS: tuple = tuple(_key(400 + r) for r in range(CYCLE_YEARS))


def key_of(y: int) -> Key:
    return KEYS[y % CYCLE_YEARS]


class Layout:
    """Per-day facts of a year of one shape, indexed by day of year (0-based)."""

    def __init__(self, key: Key):
        prev_leap, leap, next_leap, wd1 = key
        self.key = key
        self.leap = leap
        self.length = 366 if leap else 365
        lens = [29 if (m == 2 and leap) else _MDAYS[m - 1] for m in range(1, 13)]
        self.month_lens = tuple(lens)
        starts = [0]
        for n in lens:
            starts.append(starts[-1] + n)
        self.month_starts = tuple(starts)  # 13 entries; month m spans [starts[m-1], starts[m])
        self.jan1_weekday = wd1
        self.prev_length = 366 if prev_leap else 365
        self.next_length = 366 if next_leap else 365
        month, mday, wday = [], [], []
        for m in range(12):
            for d in range(lens[m]):
                month.append(m + 1)
                mday.append(d + 1)
        for i in range(self.length):
            wday.append((wd1 + i) % 7)
        self.month = tuple(month)
        self.mday = tuple(mday)
        self.wday = tuple(wday)

    def month_first_weekday(self, m: int) -> int:
        return (self.jan1_weekday + self.month_starts[m - 1]) % 7

    def week_numbers(self, wkst: int) -> tuple[tuple[int, int], ...]:
        """(week number, negative week number) of each day, RFC 5545 numbering with ``wkst``.

        Week 1 is the first week (starting on wkst) with at least four days in the year. Days
        before it belong to the previous year's last week, days from the next year's week 1 on
        belong to that week; both are numbered in their own week-year, as RFC 5545 says.
        """
        return _week_numbers(self.key, wkst)


def _week1_start(jan1_wd: int, wkst: int) -> int:
    back = (jan1_wd - wkst) % 7
    return -back if back <= 3 else 7 - back


def _weeks_in(length: int, jan1_wd: int, next_jan1_wd: int, wkst: int) -> int:
    start = _week1_start(jan1_wd, wkst)
    nxt = length + _week1_start(next_jan1_wd, wkst)
    return (nxt - start) // 7


@lru_cache(maxsize=None)
def _week_numbers(key: Key, wkst: int):
    prev_leap, leap, next_leap, wd1 = key
    length = 366 if leap else 365
    prev_len = 366 if prev_leap else 365
    next_len = 366 if next_leap else 365
    prev_wd1 = (wd1 - prev_len) % 7
    next_wd1 = (wd1 + length) % 7
    next_next_wd1 = (next_wd1 + next_len) % 7
    start = _week1_start(wd1, wkst)
    n_this = _weeks_in(length, wd1, next_wd1, wkst)
    n_prev = _weeks_in(prev_len, prev_wd1, wd1, wkst)
    n_next = _weeks_in(next_len, next_wd1, next_next_wd1, wkst)
    next_start = length + _week1_start(next_wd1, wkst)
    out = []
    for i in range(length):
        if i < start:
            out.append((n_prev, -1))
        elif i >= next_start:
            out.append((1, -n_next))
        else:
            w = (i - start) // 7 + 1
            out.append((w, w - n_this - 1))
    return tuple(out)


@lru_cache(maxsize=None)
def layout(key: Key) -> Layout:
    return Layout(key)


def layout_of(y: int) -> Layout:
    return layout(KEYS[y % CYCLE_YEARS])


@lru_cache(maxsize=None)
def month_variants(m: int) -> frozenset:
    """Every (length, weekday of the 1st) month m takes in the 400-year cycle."""
    out = set()
    for r in range(CYCLE_YEARS):
        lay = layout(KEYS[r])
        out.add((lay.month_lens[m - 1], lay.month_first_weekday(m)))
    return frozenset(out)


def cycle_keys() -> frozenset:
    return frozenset(KEYS)


class DaySearch:
    """The days of a filter, found year by year through per-shape day lists.

    ``days_of(key)`` returns the sorted days of year (0-based) that match in a year of that
    shape; lists are computed when first needed and kept compactly. Empty years are skipped
    with a table over the 400-year cycle, so finding a day decades away costs a few lookups,
    not a walk through the days in between. Filters are shared between rules (see shared()),
    and everything cached is a pure function of the filter, so sharing across threads is safe.
    """

    def __init__(self, days_of):
        self._days_of = days_of
        self._lists: dict = {}
        self._skip: list | None = None

    def days(self, y: int):
        key = KEYS[y % CYCLE_YEARS]
        lst = self._lists.get(key)
        if lst is None:
            charge(20)
            lst = self._lists[key] = array("H", self._days_of(key))
        return lst

    def ever(self) -> bool:
        """Whether any year of the cycle has a matching day."""
        return any(step is not None for step in self._skip_table())

    def _skip_table(self) -> list:
        """For each y % 400: how many years from y to the next year with a matching day."""
        if self._skip is None:
            charge(CYCLE_YEARS)
            nonempty = [bool(self.days(400 + r)) for r in range(CYCLE_YEARS)]
            skip: list = [None] * CYCLE_YEARS
            if any(nonempty):
                # Two passes around the cycle so every residue sees the next nonempty one.
                nxt = None
                for i in range(2 * CYCLE_YEARS - 1, -1, -1):
                    r = i % CYCLE_YEARS
                    if nonempty[r]:
                        nxt = i
                    if nxt is not None and i < CYCLE_YEARS:
                        skip[r] = nxt - i
            self._skip = skip
        return self._skip

    def is_day(self, ordinal: int) -> bool:
        y = year_of(ordinal)
        lst = self.days(y)
        yd = ordinal - jan1(y)
        i = bisect.bisect_left(lst, yd)
        return i < len(lst) and lst[i] == yd

    def next_day(self, ordinal: int) -> int | None:
        """The first matching day at or after ``ordinal``, or None before the calendar ends."""
        if ordinal > MAX_ORDINAL:
            return None
        if ordinal < 1:
            ordinal = 1
        y = year_of(ordinal)
        yd = ordinal - jan1(y)
        while y <= MAX_YEAR:
            charge()
            lst = self.days(y)
            i = bisect.bisect_left(lst, yd)
            if i < len(lst):
                return jan1(y) + lst[i]
            step = self._skip_table()[(y + 1) % CYCLE_YEARS]
            if step is None:
                return None
            y += 1 + step
            yd = 0
        return None


class WeekdayDays:
    """Every day whose weekday is in a set (also every day, with all seven): plain arithmetic."""

    def __init__(self, weekdays):
        self.weekdays = frozenset(weekdays)
        self._lists: dict = {}

    def ever(self) -> bool:
        return bool(self.weekdays)

    def is_day(self, ordinal: int) -> bool:
        return weekday(ordinal) in self.weekdays

    def next_day(self, ordinal: int) -> int | None:
        if ordinal < 1:
            ordinal = 1
        wd = weekday(ordinal)
        got = ordinal + min((w - wd) % 7 for w in self.weekdays)
        return got if got <= MAX_ORDINAL else None

    def days(self, y: int):
        key = KEYS[y % CYCLE_YEARS]
        lst = self._lists.get(key)
        if lst is None:
            lay = layout(key)
            if len(self.weekdays) == 7:
                lst = range(lay.length)
            else:
                lst = array("H", sorted(i for w in self.weekdays
                                        for i in range((w - lay.jan1_weekday) % 7, lay.length, 7)))
            self._lists[key] = lst
        return lst


ALL_DAYS = WeekdayDays(range(7))

_shared: OrderedDict = OrderedDict()
_shared_lock = threading.Lock()
_SHARED_MAX = 1024


def shared(key, make):
    """One object per key, kept for the last _SHARED_MAX keys used: rules with the same filter
    (most schedules use a handful) share its tables instead of each holding a copy."""
    with _shared_lock:
        got = _shared.get(key)
        if got is not None:
            _shared.move_to_end(key)
            return got
    got = make()
    with _shared_lock:
        got = _shared.setdefault(key, got)
        _shared.move_to_end(key)
        while len(_shared) > _SHARED_MAX:
            _shared.popitem(last=False)
    return got
