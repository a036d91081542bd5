"""RRULE (RFC 5545) rules.

dateutil generates NAIVE wall times and we resolve them in the schedule's zone ourselves:
dateutil's aware mode does arithmetic on aware datetimes and loses or duplicates the
repeated hour, so its aware output is never used.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

from dateutil import rrule as du

from .rules import WallRule
from .types import DstPolicy, ExpressionError

UTC = timezone.utc

_FREQS = {"YEARLY", "MONTHLY", "WEEKLY", "DAILY", "HOURLY", "MINUTELY", "SECONDLY"}
_SUB_DAILY = {"HOURLY", "MINUTELY", "SECONDLY"}
# Moving DTSTART by whole periods leaves the generated set unchanged for these frequencies
# (their BYxxx defaults come from DTSTART's time of day / weekday, which whole periods keep).
_PERIOD = {
    "SECONDLY": timedelta(seconds=1),
    "MINUTELY": timedelta(minutes=1),
    "HOURLY": timedelta(hours=1),
    "DAILY": timedelta(days=1),
    "WEEKLY": timedelta(weeks=1),
}
_DT = re.compile(r"^(\d{8})(?:T(\d{6})(Z?))?$")


def _bad(msg: str) -> ExpressionError:
    return ExpressionError(f"bad RRULE: {msg}")


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
    m = _DT.match(value.strip())
    if not m:
        raise _bad(f"DTSTART {value!r} is not YYYYMMDD or YYYYMMDDTHHMMSS")
    day, tod, z = m.groups()
    try:
        naive = datetime.strptime(day + (tod or "000000"), "%Y%m%d%H%M%S")
    except ValueError:
        raise _bad(f"DTSTART {value!r} is not a valid date-time") from None
    if z:
        if tzid:
            raise _bad("DTSTART cannot have both TZID and a Z suffix")
        return naive.replace(tzinfo=UTC).astimezone(zone).replace(tzinfo=None)
    if tzid is not None and tzid != zone.key:
        raise _bad(f"DTSTART TZID={tzid} differs from the schedule's timeZone {zone.key}; "
                   "omit TZID or make them the same")
    return naive


def _until_to_wall(rule_line: str, zone: ZoneInfo) -> str:
    """RFC 5545 UNTIL in UTC ('...Z') becomes the zone's wall time, to match naive DTSTART."""

    def repl(m):
        dt = datetime.strptime(m.group(1), "%Y%m%dT%H%M%S").replace(tzinfo=UTC)
        return "UNTIL=" + dt.astimezone(zone).strftime("%Y%m%dT%H%M%S")

    try:
        return re.sub(r"UNTIL=(\d{8}T\d{6})Z", repl, rule_line, flags=re.IGNORECASE)
    except ValueError:
        raise _bad("UNTIL is not a valid date-time") from None


class RRuleWalls:
    """Naive wall times from a dateutil rrule, with a forward cursor.

    dateutil's ``after()`` iterates from DTSTART on every call; the scanner asks for
    ever-later times, so one live iterator resumed where it stopped makes that O(1) amortised.
    Going backwards restarts it (fast-forwarded by whole periods when COUNT allows).
    """

    def __init__(self, rule: du.rrule, freq: str, has_count: bool):
        self.rule = rule
        self.freq = freq
        self.has_count = has_count
        self._it = None
        self._prev: datetime | None = None
        self._cur: datetime | None = None
        period = _PERIOD.get(freq)
        # Set when whole periods can be skipped: resuming far behind w restarts nearer to it.
        self._skippable = period * rule._interval if period is not None and not has_count else None
        self._floor = datetime.min

    def _restart(self, w: datetime):
        rule = self.rule
        period = _PERIOD.get(self.freq)
        dtstart = rule._dtstart
        self._floor = datetime.min
        if period is not None and not self.has_count and w - dtstart > 2 * period * rule._interval:
            step = period * rule._interval
            k = (w - dtstart) // step - 1
            rule = rule.replace(dtstart=dtstart + k * step)
            # Values before the new start were never generated: asking below it must restart.
            self._floor = dtstart + k * step
        self._it = iter(rule)
        self._prev = None
        self._cur = next(self._it, None)

    def next(self, w: datetime, inclusive: bool) -> datetime | None:
        w = w.replace(microsecond=0) if not inclusive and w.microsecond else w
        if (
            self._it is None
            or w < self._floor
            or (self._prev is not None and (self._prev >= w if inclusive else self._prev > w))
            or (self._skippable is not None and self._cur is not None and w - self._cur > 1000 * self._skippable)
        ):
            self._restart(w)
        for _ in range(5_000_000):
            cur = self._cur
            if cur is None:
                return None
            if cur > w or (inclusive and cur == w):
                return cur
            self._prev = cur
            self._cur = next(self._it, None)
        return None


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
            raise _bad(f"unsupported line {ln!r}: only DTSTART and one RRULE line are allowed")
    if rule_line is None:
        raise _bad("no RRULE: line, e.g. RRULE:FREQ=DAILY;BYHOUR=9;BYMINUTE=0")
    parts = {}
    for p in rule_line.split(";"):
        k, eq, v = p.partition("=")
        if not eq:
            raise _bad(f"{p!r} is not NAME=VALUE")
        parts[k.strip().upper()] = v.strip().upper()
    freq = parts.get("FREQ")
    if freq not in _FREQS:
        raise _bad(f"FREQ must be one of {', '.join(sorted(_FREQS))}, not {freq!r}")
    if "COUNT" in parts and "UNTIL" in parts:
        raise _bad("COUNT and UNTIL cannot both be given")
    if dtstart is None:
        dtstart = anchor.astimezone(zone).replace(tzinfo=None, microsecond=0)
    try:
        rule = du.rrulestr(_until_to_wall(rule_line, zone), dtstart=dtstart)
    except (ValueError, TypeError, KeyError) as e:
        raise _bad(str(e) or type(e).__name__) from None
    if not isinstance(rule, du.rrule):
        raise _bad("only a single RRULE is supported")
    if freq in _SUB_DAILY:
        _check_some_day_matches(parts, dtstart, text)
    walls = RRuleWalls(rule, freq, has_count="COUNT" in parts)
    return WallRule("rrule", text, zone, policy, walls, sub_daily=freq in _SUB_DAILY)


_DATE_PARTS = ("BYMONTH", "BYMONTHDAY", "BYYEARDAY", "BYWEEKNO", "BYDAY", "WKST")


def _check_some_day_matches(parts: dict, dtstart: datetime, text: str) -> None:
    """Reject sub-daily rules whose date filters match no day at all.

    dateutil walks such a rule period by period until year 9999 (seconds of CPU for MINUTELY),
    so ask the same date filters with FREQ=YEARLY first, which it answers at once.
    """
    keep = [f"{k}={parts[k]}" for k in _DATE_PARTS if k in parts]
    if not any(k in parts for k in _DATE_PARTS[:-1]):
        return
    try:
        skeleton = du.rrulestr("FREQ=YEARLY;" + ";".join(keep), dtstart=dtstart.replace(hour=0, minute=0, second=0))
        first = skeleton.after(dtstart - timedelta(days=1), inc=True)
    except (ValueError, TypeError, KeyError) as e:
        raise _bad(str(e) or type(e).__name__) from None
    if first is None:
        raise ExpressionError(f"{text!r} never fires: no day matches its BYxxx date filters")
