"""How many occurrences of one rule fall in any range of a forecast's week, without walking the rule
occurrence by occurrence where its shape allows (issue 28).

`occurrence_counts(rule, lo, hi, end_at)` returns a Counts over the rule's real (not dropped)
occurrences in [lo, hi), as whole epoch seconds, that answers `count(a, b)` (how many in [a, b))
and `first_at_or_after(t)`:

- rate(): anchor + k * interval, counted with arithmetic in O(1) per range.
- cron: in a stretch of real time far from any change of the zone's UTC offset every matching wall
  time W is one instant, W - offset, so the instants are the matching days' minutes shifted by the
  offset: listed from the day filter and the minute list without resolving each one through the
  zone. Within AROUND_CHANGE of a change (a DST day) the rule itself is walked, so gaps, repeats and
  the DST policy are the rule's own.
- an RRULE whose wall times repeat with a period of at most a day (see `rrule_period`), in a zone
  whose UTC offset does not change within AROUND_CHANGE of the range: one period walked from the
  first occurrence in the range, then repeated (instants after the first occurrence are the
  period's shifted: the rule has started, and a constant offset maps equal wall steps to equal
  real steps), each range counted by arithmetic. `FREQ=MINUTELY;BYSECOND=37` walks one instant
  instead of a week's 10,080.
- everything else (RRULE, at()): walked, at most RULE_OCCURRENCES (a rule with more in the range
  is counted up to that many and reported as truncated); the forecast also caps what one forecast
  walks over all its rules (dispatch.forecast.WALK_BUDGET), since walking is the costly part.

tests/spread/test_occurrence_counts.py checks the arithmetic against the walk on random rules in
several zones, across DST days.
"""

from __future__ import annotations

import bisect
import math
from datetime import datetime, timedelta, timezone

from schedules.timeexpr.rrule import DAILY, HOURLY, MINUTELY, SECONDLY

UTC = timezone.utc
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
EPOCH_ORDINAL = EPOCH.date().toordinal()
# Occurrences of one rule walked at most (an every-second RRULE has 604,800 in a week).
RULE_OCCURRENCES = 20_000
# Around each change of a zone's UTC offset the rule is walked: a fixed-time rule's moved or
# repeated wall times lie within the zone's largest jump of the change, well inside this.
AROUND_CHANGE = timedelta(hours=27)
_DAY = timedelta(days=1)


def seconds(dt: datetime) -> int:
    """Whole epoch seconds of an aware instant (floor)."""
    return math.floor((dt - EPOCH).total_seconds())


class Counts:
    """Sorted instants (epoch seconds), counted by bisection."""

    truncated = False
    walked = 0  # how many of the instants were walked one at a time (the costly way)

    def __init__(self, instants: list, *, truncated: bool = False, walked: bool = False):
        self.instants = instants
        self.truncated = truncated
        self.walked = len(instants) if walked else 0
        # Every instant on a whole minute (cron): a spread offset then moves it by whole minutes as
        # far as minute buckets are concerned (see minute_aligned).
        self.minute_aligned = all(t % 60 == 0 for t in instants)

    def __len__(self) -> int:
        return len(self.instants)

    def count(self, a: int, b: int) -> int:
        if b <= a:
            return 0
        return bisect.bisect_left(self.instants, b) - bisect.bisect_left(self.instants, a)

    def first_at_or_after(self, t: int) -> int | None:
        i = bisect.bisect_left(self.instants, t)
        return self.instants[i] if i < len(self.instants) else None

    def between(self, a: int, b: int) -> list:
        return self.instants[bisect.bisect_left(self.instants, a):bisect.bisect_left(self.instants, b)]


class RateCounts:
    """anchor + k * interval (k >= 0) within [lo, hi): arithmetic."""

    truncated = False

    def __init__(self, anchor: int, interval: int, lo: int, hi: int):
        self.anchor, self.interval, self.lo, self.hi = anchor, interval, lo, hi
        self.minute_aligned = anchor % 60 == 0 and interval % 60 == 0

    def _k(self, t: int) -> int:
        """The first k >= 0 with anchor + k * interval >= t."""
        return max(0, -((self.anchor - t) // self.interval))

    def __len__(self) -> int:
        return self.count(self.lo, self.hi)

    def count(self, a: int, b: int) -> int:
        a, b = max(a, self.lo), min(b, self.hi)
        if b <= a:
            return 0
        return max(0, self._k(b) - self._k(a))

    def first_at_or_after(self, t: int) -> int | None:
        at = self.anchor + self._k(max(t, self.lo)) * self.interval
        return at if at < self.hi else None

    def between(self, a: int, b: int) -> list:
        a, b = max(a, self.lo), min(b, self.hi)
        return [self.anchor + k * self.interval for k in range(self._k(a), self._k(b))] if b > a else []


def occurrence_counts(rule, lo: datetime, hi: datetime, end_at: datetime | None = None,
                      walk_limit: int = RULE_OCCURRENCES):
    """The rule's occurrences in [lo, hi) (and before end_at), countable by range; a rule that must
    be walked is walked at most `walk_limit` occurrences (then reported as truncated)."""
    if end_at is not None and end_at < hi:
        hi = max(lo, end_at)
    lo_s, hi_s = math.ceil((lo - EPOCH).total_seconds()), math.ceil((hi - EPOCH).total_seconds())
    if rule.kind == "rate":
        return RateCounts(seconds(rule.anchor), int(rule.interval.total_seconds()), lo_s, hi_s)
    if rule.kind == "cron" and hasattr(rule, "walls") and hasattr(rule.walls, "_times"):
        return Counts(_cron_instants(rule, lo, hi, lo_s, hi_s))
    period = rrule_period(rule)
    if period and not _changes(rule.zone, lo - AROUND_CHANGE, hi + AROUND_CHANGE):
        return _periodic_counts(rule, lo, hi, lo_s, hi_s, period, walk_limit)
    instants, cut = walk(rule, lo, hi, walk_limit)
    return Counts(instants, truncated=cut, walked=True)


def rrule_period(rule) -> int | None:
    """Seconds after which an RRULE's wall times repeat, when that is at most a day; else None.
    Only rules with no calendar filter (month, week number, year day, month day, weekday), no
    COUNT and no UNTIL (each makes days differ): DAILY every day repeats daily; HOURLY, MINUTELY
    and SECONDLY whose step divides a day repeat daily, and every step when no BYHOUR, BYMINUTE or
    BYSECOND leaves a slot out (BYSETPOS picks the same offsets in every slot)."""
    walls = getattr(rule, "walls", None)
    spec = getattr(walls, "spec", None)
    if rule.kind != "rrule" or spec is None or getattr(rule, "until", None) is not None:
        return None
    if (spec.count is not None or spec.until_wall is not None or spec.until_instant is not None
            or spec.bymonth or spec.byweekno or spec.byyearday or spec.bymonthday or spec.byday_plain
            or spec.byday_nth):
        return None
    if spec.freq == DAILY:
        return 86_400 if spec.interval == 1 else None
    unit = _SUB_DAILY_UNIT.get(spec.freq)
    if unit is None:
        return None
    step = spec.interval * unit
    if 86_400 % step:
        return None
    full = {3600: ("byhour",), 60: ("byhour", "byminute"), 1: ("byhour", "byminute", "bysecond")}[unit]
    every_slot = all(getattr(spec, f) is None or len(getattr(spec, f)) == _FIELD_SIZE[f] for f in full)
    return step if every_slot else 86_400


_SUB_DAILY_UNIT = {HOURLY: 3600, MINUTELY: 60, SECONDLY: 1}
_FIELD_SIZE = {"byhour": 24, "byminute": 60, "bysecond": 60}


class PeriodicCounts:
    """Instants that repeat every `period` seconds from the first one, f, within [lo, hi): one
    period's instants kept, every range counted by arithmetic and bisection (an every-second rule's
    week is not listed)."""

    truncated = False

    def __init__(self, one_period: list, period: int, lo: int, hi: int):
        self.f = one_period[0]
        self.rel = [t - self.f for t in one_period]
        self.period, self.lo, self.hi = period, max(lo, self.f), hi
        self.walked = len(one_period)
        self.minute_aligned = period % 60 == 0 and all(t % 60 == 0 for t in one_period)

    def _before(self, x: int) -> int:
        """How many instants from f on are < x."""
        if x <= self.f:
            return 0
        q, r = divmod(x - self.f, self.period)
        return q * len(self.rel) + bisect.bisect_left(self.rel, r)

    def __len__(self) -> int:
        return self.count(self.lo, self.hi)

    def count(self, a: int, b: int) -> int:
        a, b = max(a, self.lo), min(b, self.hi)
        return self._before(b) - self._before(a) if b > a else 0

    def first_at_or_after(self, t: int) -> int | None:
        q, r = divmod(max(t, self.lo) - self.f, self.period)
        i = bisect.bisect_left(self.rel, r)
        if i == len(self.rel):
            q, i = q + 1, 0
        at = self.f + q * self.period + self.rel[i]
        return at if at < self.hi else None

    def between(self, a: int, b: int) -> list:
        a, b = max(a, self.lo), min(b, self.hi)
        out = []
        t = self.first_at_or_after(a) if b > a else None
        while t is not None and t < b:
            out.append(t)
            t = self.first_at_or_after(t + 1)
        return out


def _periodic_counts(rule, lo: datetime, hi: datetime, lo_s: int, hi_s: int, period: int, walk_limit: int):
    """A periodic rule's instants in [lo, hi): the first period from its first occurrence in the
    range walked (at most walk_limit: past it, those walked, reported as truncated, as the walk
    from lo would), the rest by arithmetic."""
    first = next((o for o in rule.iter_after(lo - timedelta(microseconds=1)) if not o.dropped), None)
    if first is None or first.at >= hi:
        return Counts([])
    one, cut = walk(rule, first.at, min(hi, first.at + timedelta(seconds=period)), limit=walk_limit)
    if cut:
        return Counts(one, truncated=True, walked=True)
    return PeriodicCounts(one, period, lo_s, hi_s)


def walk(rule, lo: datetime, hi: datetime, limit: int = RULE_OCCURRENCES) -> tuple[list, bool]:
    """The rule's real occurrences in [lo, hi) as epoch seconds, one next_after at a time, at most
    `limit` (then True: cut short)."""
    out = []
    if limit <= 0:
        return out, True
    for occ in rule.iter_after(lo - timedelta(microseconds=1)):
        if occ.at >= hi:
            return out, False
        if not occ.dropped:
            out.append(seconds(occ.at))
            if len(out) >= limit:
                return out, True
    return out, False


def _changes(zone, lo: datetime, hi: datetime) -> list:
    """Instants in [lo, hi) where the zone's UTC offset changes (to the minute is enough: each is
    only the centre of a walked neighbourhood)."""
    out = []
    t = lo
    before = t.astimezone(zone).utcoffset()
    while t < hi:
        nxt = min(t + timedelta(hours=6), hi)
        after = nxt.astimezone(zone).utcoffset()
        if after != before:
            a, b = t, nxt
            while b - a > timedelta(minutes=1):
                mid = a + (b - a) / 2
                if mid.astimezone(zone).utcoffset() == before:
                    a = mid
                else:
                    b = mid
            out.append(b)
        if nxt == hi:
            break
        t, before = nxt, after
    return out


def _cron_instants(rule, lo: datetime, hi: datetime, lo_s: int, hi_s: int) -> list:
    """Steps: (1) the offset changes of the zone within AROUND_CHANGE of [lo, hi); (2) the parts
    of [lo, hi) within AROUND_CHANGE of one are walked through the rule; (3) every other stretch
    has one UTC offset throughout (and AROUND_CHANGE beyond), so its instants are the matching
    wall minutes minus that offset, listed day by day from the rule's day filter and minutes."""
    zone = rule.zone
    changes = _changes(zone, lo - AROUND_CHANGE, hi + AROUND_CHANGE)
    walked = []
    for c in changes:
        a, b = max(lo, c - AROUND_CHANGE), min(hi, c + AROUND_CHANGE)
        if a < b:
            if walked and a <= walked[-1][1]:
                walked[-1] = (walked[-1][0], max(walked[-1][1], b))
            else:
                walked.append((a, b))
    out: list = []
    t = lo
    for a, b in walked + [(hi, hi)]:
        if t < a:
            out.extend(_cron_stretch(rule, t, a))
        if a < b:
            out.extend(walk(rule, a, b, limit=10 ** 9)[0])  # a day or two of a cron rule: bounded
        t = max(t, b)
    return [s for s in out if lo_s <= s < hi_s]


def _cron_stretch(rule, a: datetime, b: datetime) -> list:
    """Instants in [a, b) of a cron rule where the zone's offset is one throughout."""
    off = int(a.astimezone(rule.zone).utcoffset().total_seconds())
    walls = rule.walls
    times = walls._times
    search = walls._search
    a_s, b_s = seconds(a), math.ceil((b - EPOCH).total_seconds())
    first = (a + timedelta(seconds=off)).date().toordinal()
    last = (b + timedelta(seconds=off)).date().toordinal()
    out = []
    for o in range(first, last + 1):
        if not search.is_day(o):
            continue
        base = (o - EPOCH_ORDINAL) * 86_400 - off
        lo_m = max(0, -((base - a_s) // 60))  # first minute of the day at or after a
        i = bisect.bisect_left(times, lo_m)
        for m in times[i:]:
            s = base + m * 60
            if s >= b_s:
                break
            out.append(s)
    return out
