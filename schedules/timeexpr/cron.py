"""Five-field cron, Debian's dialect, parsed and matched here.

The grammar is the one cronsim accepted (so stored schedules keep parsing), with vixie/Debian
cron's meaning where cronsim differs: a range with a step (``9-9/4``, ``1-5/2``) is the values of
that range, stepped; cronsim before 2.9 read a one-value range with a step as "from that value to the end".

Per field: ``*``, values, names (``JAN``-``DEC``, ``SUN``-``SAT``), ranges ``a-b``, steps
``*/n``, ``a-b/n`` and ``a/n`` (a to the field's end), lists of those. Day-of-month also takes
``L`` (last day) and ``LW`` (last weekday, Monday to Friday); day-of-week also takes ``nL`` (last
such weekday of the month) and ``d#n`` (n-th such weekday, 1-5). Day-of-week 0 and 7 are Sunday.
When day-of-month and day-of-week both start with something other than ``*`` a day matches if
either matches; otherwise both must.

Matching days are computed per month *variant* (its length and the weekday of its 1st), of which
the 400-year Gregorian cycle has at most 12 x 2 x 7; "never fires" is decided over all of them.
"""

from __future__ import annotations

import bisect
import re
from datetime import date, datetime

from .budget import charge
from .days import ALL_DAYS, MONTH_NAMES, DaySearch, WeekdayDays, layout, month_variants, shared
from .types import ExpressionError

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
DAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
# (name, low, high, names, help)
_FIELDS = (
    ("minute", 0, 59, None, "0-59"),
    ("hour", 0, 23, None, "0-23"),
    ("day-of-month", 1, 31, None, "1-31, L or LW"),
    ("month", 1, 12, MONTHS, "1-12 or JAN-DEC"),
    ("day-of-week", 0, 7, DAYS, "0-7 or SUN-SAT (0 and 7 are Sunday), d#n or dL"),
)
_NUM = re.compile(r"^[0-9]{1,6}$")
MAX_CRON_LENGTH = 1000


class _Bad(Exception):
    pass


def cron_text(expression: str) -> str:
    text = expression.strip()
    if text.startswith("@"):
        try:
            return MACROS[text.lower()]
        except KeyError:
            raise ExpressionError(
                f"unknown cron macro {text!r}: use one of {', '.join(MACROS)}"
            ) from None
    return text


def is_fixed_time(text: str) -> bool:
    """Debian cron's rule: the job is fixed-time when minute and hour both start with a digit."""
    minute, hour = text.split()[:2]
    return minute[0] in "0123456789" and hour[0] in "0123456789"


def _value(tok: str, lo: int, hi: int, names) -> int:
    if names and tok in names:
        v = names.index(tok) + (1 if names is MONTHS else 0)
    elif _NUM.match(tok):
        v = int(tok)
    else:
        raise _Bad(f"{tok!r} is not a number" + (" or a name" if names else ""))
    if not lo <= v <= hi:
        raise _Bad(f"{v} is out of range")
    return v


def _term(tok: str, idx: int) -> tuple[set, set, set]:
    """One list item of field ``idx``: (values, last-markers, nth-weekdays)."""
    name, lo, hi, names, _ = _FIELDS[idx]
    if not tok:
        raise _Bad("empty list item")
    if idx == 2 and tok in ("L", "LW"):
        return set(), {tok}, set()
    if idx == 4 and "#" in tok:
        left, _, nth = tok.partition("#")
        if not re.match(r"^[1-5]$", nth):
            raise _Bad(f"{tok!r}: the n in d#n must be 1 to 5")
        return set(), set(), {(_value(left, lo, hi, names) % 7, int(nth))}
    if idx == 4 and tok.endswith("L"):
        left = tok[:-1]
        if not _NUM.match(left):
            raise _Bad(f"{tok!r}: the last weekday of the month is written dL with a number, e.g. 5L")
        return set(), {_value(left, lo, hi, None) % 7}, set()
    step = 1
    stepped = "/" in tok
    if stepped:
        tok, _, step_s = tok.partition("/")
        if not _NUM.match(step_s) or int(step_s) == 0:
            raise _Bad(f"the step {step_s!r} must be a whole number of at least 1")
        step = int(step_s)
    if tok == "*":
        start, end = lo, hi
    elif "-" in tok:
        a, _, b = tok.partition("-")
        start, end = _value(a, lo, hi, names), _value(b, lo, hi, names)
        if end < start:
            raise _Bad(f"the range {tok!r} ends before it starts")
    else:
        start = _value(tok, lo, hi, names)
        # 'a/n' runs from a to the end of the field, as in cronsim and croniter.
        end = hi if stepped else start
    return set(range(start, end + 1, step)), set(), set()


def _field(part: str, idx: int, text: str):
    name, _lo, _hi, _names, allowed = _FIELDS[idx]
    values, lasts, nths = set(), set(), set()
    try:
        for tok in part.split(","):
            v, la, nt = _term(tok, idx)
            values |= v
            lasts |= la
            nths |= nt
    except _Bad as e:
        raise ExpressionError(
            f"bad {name} field {part!r} in cron expression {text!r}: {e} "
            f"(allowed: {allowed}, with lists a,b, ranges a-b and steps */n or a-b/n)"
        ) from None
    return values, lasts, nths


def _last_weekday(mlen: int, first_wd: int) -> int:
    wd = (first_wd + mlen - 1) % 7
    return mlen - 1 if wd == 5 else mlen - 2 if wd == 6 else mlen


class CronWalls:
    """Matching naive wall times of a cron rule, found field by field without a time zone."""

    def __init__(self, text: str):
        if len(text) > MAX_CRON_LENGTH:
            raise ExpressionError(f"cron expression is longer than {MAX_CRON_LENGTH} characters")
        parts = text.upper().split()
        if len(parts) != 5:
            raise ExpressionError(
                f"a cron expression has 5 fields (minute hour day-of-month month day-of-week); "
                f"{text!r} has {len(parts)}"
            )
        minutes, _, _ = _field(parts[0], 0, text)
        hours, _, _ = _field(parts[1], 1, text)
        doms, dom_last, _ = _field(parts[2], 2, text)
        months, _, _ = _field(parts[3], 3, text)
        dows, dow_last, dow_nth = _field(parts[4], 4, text)
        self.text = text
        self.parts = parts
        self.months = frozenset(months)
        self.doms = frozenset(doms)
        self.dom_L = "L" in dom_last
        self.dom_LW = "LW" in dom_last
        # Cron weekdays (Sunday 0 or 7) become date.weekday() numbers (Monday 0).
        self.dows = frozenset((d - 1) % 7 for d in dows)
        self.dow_last = frozenset((d - 1) % 7 for d in dow_last)
        self.dow_nth = frozenset(((d - 1) % 7, n) for d, n in dow_nth)
        # Debian: OR when both day fields are restricted (neither starts with '*'), else AND.
        self.day_and = parts[2].startswith("*") or parts[4].startswith("*")
        self._times = tuple(sorted(h * 60 + m for h in hours for m in minutes))
        # Matching days per month variant (length, weekday of the 1st): at most 14 per month.
        self._variants: dict = {}
        self._check_fires()
        self._search = self._day_search()

    # -- days --------------------------------------------------------------------------------

    def _day_search(self):
        every_dom = self.doms == frozenset(range(1, 32))
        plain_dow = not (self.dow_last or self.dow_nth)
        if len(self.months) == 12 and self.day_and and every_dom and plain_dow:
            # Only the weekday matters (e.g. '* * * * 1-5'): plain arithmetic, no tables.
            return ALL_DAYS if len(self.dows) == 7 else WeekdayDays(self.dows)
        key = ("cron", self.months, self.doms, self.dom_L, self.dom_LW, self.dows, self.dow_last,
               self.dow_nth, self.day_and)
        search = shared(key, lambda: DaySearch(self._days_of))
        # Every year shape's days now (shared, once per filter), so no later next_after pays it.
        search.ever()
        return search

    def _dom_ok(self, d: int, mlen: int, first_wd: int) -> bool:
        return (d in self.doms or (self.dom_L and d == mlen)
                or (self.dom_LW and d == _last_weekday(mlen, first_wd)))

    def _dow_ok(self, d: int, mlen: int, first_wd: int) -> bool:
        wd = (first_wd + d - 1) % 7
        return (wd in self.dows or (wd in self.dow_last and d + 7 > mlen)
                or (wd, (d - 1) // 7 + 1) in self.dow_nth)

    def _month_days(self, mlen: int, first_wd: int) -> tuple[int, ...]:
        got = self._variants.get((mlen, first_wd))
        if got is None:
            charge(mlen)
            if self.day_and:
                got = tuple(d for d in range(1, mlen + 1)
                            if self._dom_ok(d, mlen, first_wd) and self._dow_ok(d, mlen, first_wd))
            else:
                got = tuple(d for d in range(1, mlen + 1)
                            if self._dom_ok(d, mlen, first_wd) or self._dow_ok(d, mlen, first_wd))
            self._variants[(mlen, first_wd)] = got
        return got

    def _days_of(self, key):
        lay = layout(key)
        out = []
        for m in sorted(self.months):
            start = lay.month_starts[m - 1]
            out.extend(start + d - 1 for d in self._month_days(lay.month_lens[m - 1], lay.month_first_weekday(m)))
        return out

    def _check_fires(self) -> None:
        """Refuse a rule that matches no day in the whole 400-year cycle, naming the conflict."""
        for m in self.months:
            for mlen, wd in month_variants(m):
                if self._month_days(mlen, wd):
                    return
        months = sorted(self.months)
        variants = [(mlen, wd) for m in months for mlen, wd in month_variants(m)]
        dom_some = any(self._dom_ok(d, mlen, wd) for mlen, wd in variants for d in range(1, mlen + 1))
        dow_some = any(self._dow_ok(d, mlen, wd) for mlen, wd in variants for d in range(1, mlen + 1))
        dom, dow = self.parts[2], self.parts[4]
        names = [MONTH_NAMES[m - 1] for m in months]
        if len(names) == 12:
            where = "any month"
        elif len(names) == 1:
            where = names[0]
        else:
            where = ", ".join(names[:-1]) + " or " + names[-1]
        longest = max(mlen for mlen, _ in variants)
        head = f"cron expression {self.text!r} never fires: "
        if not dom_some:
            raise ExpressionError(
                head + f"day-of-month {dom} never occurs in {where} (month field {self.parts[3]}; "
                f"{'it has' if len(names) == 1 else 'they have'} at most {longest} days)"
            )
        if not dow_some:
            raise ExpressionError(head + f"day-of-week {dow} never occurs in {where} (month field {self.parts[3]})")
        raise ExpressionError(
            head + f"day-of-month {dom} and day-of-week {dow} never fall on the same day in {where}; "
            "both must match because one of them starts with '*' (Debian cron)"
        )

    # -- walls -------------------------------------------------------------------------------

    def next(self, w: datetime, inclusive: bool) -> datetime | None:
        """First matching naive wall time > w (>= w when inclusive)."""
        times = self._times
        mod = w.hour * 60 + w.minute
        if inclusive and not w.second and not w.microsecond:
            i = bisect.bisect_left(times, mod)
        else:
            i = bisect.bisect_right(times, mod)
        o = w.toordinal()
        if i < len(times) and self._search.is_day(o):
            return _wall(o, times[i])
        nd = self._search.next_day(o + 1)
        if nd is None:
            return None
        return _wall(nd, times[0])


def _wall(ordinal: int, minute_of_day: int) -> datetime:
    d = date.fromordinal(ordinal)
    return datetime(d.year, d.month, d.day, minute_of_day // 60, minute_of_day % 60)
