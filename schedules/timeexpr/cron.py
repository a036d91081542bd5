"""Five-field cron. cronsim parses and matches the fields; stepping is ours (see rules.py)."""

from __future__ import annotations

import bisect
from datetime import date, datetime, timedelta

from cronsim import CronSim, CronSimError
from cronsim.cronsim import Field

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

_FIELDS = [
    (Field.MINUTE, "minute", "0-59"),
    (Field.HOUR, "hour", "0-23"),
    (Field.DAY, "day-of-month", "1-31"),
    (Field.MONTH, "month", "1-12 or JAN-DEC"),
    (Field.DOW, "day-of-week", "0-7 or SUN-SAT"),
]
_ONE_DAY = timedelta(days=1)
# The longest honest gap between cron matches is eight years ('0 0 29 2 *' across 2100).
_MAX_YEARS = 10


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
    return minute[0].isdigit() and hour[0].isdigit()


class CronWalls:
    """Matching naive wall times of a cron rule, found field by field without a time zone."""

    def __init__(self, text: str):
        parts = text.split()
        if len(parts) != 5:
            raise ExpressionError(
                f"a cron expression has 5 fields (minute hour day-of-month month day-of-week); "
                f"{text!r} has {len(parts)}"
            )
        for (field, name, allowed), part in zip(_FIELDS, parts):
            try:
                field.parse(part.upper())
            except (CronSimError, ValueError, IndexError):
                raise ExpressionError(
                    f"bad {name} field {part!r} in cron expression {text!r} "
                    f"(allowed: {allowed}, with lists a,b, ranges a-b and steps */n)"
                ) from None
        try:
            # A fixed UTC start keeps cronsim from doing any DST handling of its own: we only
            # use its parsed fields and its day matcher.
            sim = CronSim(text, datetime(2000, 1, 1))
        except (CronSimError, ValueError) as e:
            raise ExpressionError(
                f"cron expression {text!r} never fires: day-of-month {parts[2]} never occurs in "
                f"month {parts[4]}" if "day-of-month" in str(e) else f"bad cron expression {text!r}: {e}"
            ) from None
        self.text = text
        self._months = frozenset(sim.months)
        self._match_day = sim.match_day
        self._times = sorted(h * 60 + m for h in sim.hours for m in sim.minutes)
        self._last_time = self._times[-1]
        # Day matching is the slow part (calendar arithmetic for L/W/#); a small cache makes the
        # daily scanner call cheap. Bounded because rules live as long as the process.
        self._days: dict[date, bool] = {}

    def _day_ok(self, d: date) -> bool:
        ok = self._days.get(d)
        if ok is None:
            if len(self._days) > 4096:
                self._days.clear()
            ok = self._days[d] = d.month in self._months and self._match_day(d)
        return ok

    def next(self, w: datetime, inclusive: bool) -> datetime | None:
        times = self._times
        mod = w.hour * 60 + w.minute
        if inclusive and not w.second and not w.microsecond:
            i = bisect.bisect_left(times, mod)
        else:
            i = bisect.bisect_right(times, mod)
        d = w.date()
        stop_year = d.year + _MAX_YEARS
        while d.year < stop_year:
            if d.month not in self._months:
                if d.year >= 9999 and d.month == 12:
                    return None
                d = date(d.year + (d.month == 12), d.month % 12 + 1, 1)
                i = 0
                continue
            if i < len(times) and self._day_ok(d):
                t = times[i]
                return datetime(d.year, d.month, d.day, t // 60, t % 60)
            if d >= date(9999, 12, 31):
                return None
            d += _ONE_DAY
            i = 0
        return None
