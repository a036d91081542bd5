"""Rule objects: turn an expression into a strictly increasing stream of occurrences.

Every ``next_after`` call runs under its own work budget (budget.NEXT_AFTER_UNITS) and raises
``TooExpensive`` past it, so one pathological rule cannot hold a caller for long; accepted rules
use a small fraction of it. Near the ends of the calendar (see zones.MIN_INSTANT/MAX_INSTANT) a
rule ends: ``next_after`` returns None rather than overflowing.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Protocol
from zoneinfo import ZoneInfo

from .budget import NEXT_AFTER_CPU_SECONDS, NEXT_AFTER_UNITS, charge, metered
from .types import DstPolicy, ExpressionError, Occurrence
from .zones import (
    MAX_INSTANT,
    MIN_INSTANT,
    RANGE_TEXT,
    first_change,
    fmt_wall,
    jump_margin,
    offset_at,
    repeated_note,
    resolve_fixed,
)

UTC = timezone.utc

# No zone changes its UTC offset twice within two days (tests/timeexpr/test_tzdata_assumptions.py
# checks the installed tzdata), so sampling every 6 hours cannot step over a change and back.
_SAMPLE = timedelta(hours=6)
_DAY = timedelta(days=1)
_TICK = timedelta(microseconds=1)
_NAIVE_MIN = datetime.min
_NAIVE_MAX = datetime.max


class WallSource(Protocol):
    def next(self, w: datetime, inclusive: bool) -> datetime | None:
        """First naive wall time matching the rule that is > w (>= w when inclusive)."""


def _require_aware(after: datetime) -> datetime:
    if after.tzinfo is None or after.utcoffset() is None:
        raise ValueError("timeexpr needs aware datetimes; got a naive one")
    try:
        return after.astimezone(UTC)
    except OverflowError:
        # 0001-01-01T01:00+05:00 or 9999-12-31T23:00-05:00: a wall time datetime holds whose
        # instant it cannot (OverflowError escaped every entry point with it).
        raise ExpressionError(
            f"{after.isoformat()} has no instant in UTC (datetime's years 1 to 9999); the schedule's "
            f"times are between {RANGE_TEXT}", "startAt") from None


def _rank(o: Occurrence):
    # On a tie for the same instant a real occurrence beats a moved one beats a dropped one:
    # the instant is the identity, so only one of them can exist.
    return (o.at, o.dropped, o.note is not None)


def _add(t: datetime, d: timedelta) -> datetime:
    """t + d, clamped just past MAX_INSTANT (callers treat anything beyond it as the end)."""
    if MAX_INSTANT - t < d:
        return MAX_INSTANT + timedelta(seconds=1)
    return t + d


def _naive_sub(w: datetime, d: timedelta) -> datetime:
    return _NAIVE_MIN if w - _NAIVE_MIN < d else w - d


def _naive_add(w: datetime, d: timedelta) -> datetime:
    return _NAIVE_MAX if _NAIVE_MAX - w < d else w + d


class Rule:
    kind: str
    sub_daily: bool
    expression: str
    zone: ZoneInfo
    policy: DstPolicy

    def next_after(self, after: datetime) -> Occurrence | None:
        """The first occurrence strictly after ``after``, or None when the rule has no more.

        Raises TooExpensive (an ExpressionError) when the answer needs more than one call's
        work budget.
        """
        after = _require_aware(after)
        if after >= MAX_INSTANT:
            return None
        if after < MIN_INSTANT:
            after = MIN_INSTANT - _TICK
        with metered("finding the next occurrence", NEXT_AFTER_UNITS, NEXT_AFTER_CPU_SECONDS):
            occ = self._next(after)
        if occ is not None and not MIN_INSTANT <= occ.at <= MAX_INSTANT:
            return None
        return occ

    def _next(self, after: datetime) -> Occurrence | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def iter_after(self, after: datetime) -> Iterator[Occurrence]:
        t = after
        while True:
            occ = self.next_after(t)
            if occ is None:
                return
            yield occ
            t = occ.at

    def between(self, start: datetime, end: datetime, limit: int) -> list[Occurrence]:
        out: list[Occurrence] = []
        start = _require_aware(start)
        t = start - _TICK if start > MIN_INSTANT else MIN_INSTANT - _TICK  # next_after starts there anyway
        end = _require_aware(end)
        while len(out) < limit:
            occ = self.next_after(t)
            if occ is None or occ.at >= end:
                break
            out.append(occ)
            t = occ.at
        return out

    def __repr__(self):
        return f"<{type(self).__name__} {self.expression!r} in {self.zone.key}>"


class WallRule(Rule):
    """cron and RRULE: a set of local wall times, resolved to instants in the zone.

    Fixed-time rules resolve each wall time through the DstPolicy. Sub-daily rules fire at
    every real instant whose wall time is in the set, which is found by walking real time
    in stretches of constant UTC offset. ``until`` (an RRULE UNTIL given in UTC) bounds the
    resolved instants, not the wall times.
    """

    def __init__(self, kind: str, expression: str, zone: ZoneInfo, policy: DstPolicy,
                 walls: WallSource, sub_daily: bool, until: datetime | None = None):
        self.kind = kind
        self.expression = expression
        self.zone = zone
        self.policy = policy
        self.walls = walls
        self.sub_daily = sub_daily
        self.until = until
        self._margin = jump_margin(zone)

    def _next(self, after: datetime) -> Occurrence | None:
        if self.until is not None and after >= self.until:
            return None
        occ = self._next_real(after) if self.sub_daily else self._next_fixed(after)
        if occ is not None and self.until is not None and occ.at > self.until:
            return None
        return occ

    def _next_fixed(self, after: datetime) -> Occurrence | None:
        """Scan wall times in order from a little before ``after``'s wall time.

        1. Start ``margin`` (the zone's largest offset jump) before the wall time of ``after``:
           after a fall-back an occurrence later than ``after`` can have an earlier wall time.
           When the offset does not change within a margin either side of ``after`` no earlier
           wall time can be later, so the scan starts at the wall time of ``after`` itself.
        2. Resolve each wall time; keep the earliest instant strictly after ``after``.
        3. Stop at the first wall time past the best one's local time. That is enough when the
           best is an ordinary wall time; a moved or repeated one (DST) can be overtaken by a
           later wall time, so then look on for another margin.
        """
        zone = self.zone
        margin = self._margin
        local = after.astimezone(zone)
        w = local.replace(tzinfo=None)
        lo = MIN_INSTANT if after - MIN_INSTANT < margin else after - margin
        if self._change_in(lo, _add(after, margin), offset_at(zone, lo)) is None:
            wall = self.walls.next(w, False)
        else:
            wall = self.walls.next(_naive_sub(w, margin), True)
        best: Occurrence | None = None
        bound: datetime | None = None
        while wall is not None and (bound is None or wall <= bound):
            charge()
            for occ in resolve_fixed(zone, wall, self.policy):
                if occ.at > after and (best is None or _rank(occ) < _rank(best)):
                    best = occ
                    bound = best.local.replace(tzinfo=None)
                    if best.note is not None:
                        bound = _naive_add(bound, margin)
            wall = self.walls.next(wall, False)
        return best

    def _next_real(self, after: datetime) -> Occurrence | None:
        """Walk real time from ``after`` through stretches of constant UTC offset.

        Within a stretch the wall clock is real time plus one offset, so the next matching wall
        time W gives the instant W - offset. If the offset changes before that instant, restart
        from the change (inclusive): a fall-back replays wall times, a spring-forward skips them,
        and both follow from re-reading the wall clock there. When no wall time is left after
        the current one (COUNT or UNTIL reached), a fall-back just ahead can still replay some,
        so look for one before giving up.
        """
        zone = self.zone
        t = after
        inclusive = False
        while True:
            charge()
            if t > MAX_INSTANT:
                return None
            local = t.astimezone(zone)
            off = local.utcoffset()
            w = local.replace(tzinfo=None)
            wall = self.walls.next(w, inclusive)
            if wall is None:
                # A fall-back at T replays wall times from T + new offset; one we already passed
                # comes back only if T is within the size of the jump from now.
                trans = self._change_in(t, _add(t, self._margin), off)
                if trans is None or offset_at(zone, trans) > off:
                    return None
                t, inclusive = trans, True
                continue
            inclusive = True
            if wall - w > 2 * _DAY:
                # A long quiet stretch (a day-restricted rule). Only the first day is checked
                # for a transition: beyond it, real time and wall time can differ by less than
                # a day, so jumping to a day before the match skips no matching wall time.
                trans = self._change_in(t, _add(t, _DAY), off)
                t = trans if trans is not None else _add(t, (wall - w) - _DAY)
                continue
            try:
                cand = (wall - off).replace(tzinfo=UTC)
            except OverflowError:
                return None
            if cand > MAX_INSTANT:
                return None
            trans = self._change_in(t, cand, off)
            if trans is None:
                return Occurrence(cand, cand.astimezone(zone), fmt_wall(wall), repeated_note(zone, wall))
            t = trans

    def _change_in(self, lo: datetime, hi: datetime, off: timedelta) -> datetime | None:
        """The first offset change in (lo, hi], or None. Nothing past MAX_INSTANT is looked at."""
        if hi > MAX_INSTANT:
            hi = MAX_INSTANT
        if hi <= lo:
            return None
        prev = lo
        p = _add(lo, _SAMPLE)
        while True:
            charge()
            if p >= hi:
                p = hi
            if offset_at(self.zone, p) != off:
                return first_change(self.zone, prev, p, off)
            if p == hi:
                return None
            prev, p = p, _add(p, _SAMPLE)


class AtRule(Rule):
    """at(...): one instant (or two, when a repeated wall time meets dstPolicy repeated=both)."""

    kind = "at"
    sub_daily = False

    def __init__(self, expression: str, zone: ZoneInfo, policy: DstPolicy, occurrences: list[Occurrence]):
        self.expression = expression
        self.zone = zone
        self.policy = policy
        self.occurrences = sorted(occurrences, key=_rank)

    def _next(self, after: datetime) -> Occurrence | None:
        for occ in self.occurrences:
            if occ.at > after:
                return occ
        return None


class RateRule(Rule):
    """rate(n unit): anchor + k * interval for k >= 0, in real elapsed time."""

    kind = "rate"

    def __init__(self, expression: str, zone: ZoneInfo, policy: DstPolicy, anchor: datetime, interval: timedelta):
        self.expression = expression
        self.zone = zone
        self.policy = policy
        # Occurrences are whole seconds like every other rule's; the anchor (often a creation
        # time with microseconds) is truncated rather than rounded so the first one is not late.
        self.anchor = _require_aware(anchor).replace(microsecond=0)
        self.interval = interval
        self.sub_daily = interval < _DAY

    def _next(self, after: datetime) -> Occurrence | None:
        if after < self.anchor:
            at = self.anchor
        else:
            k = (after - self.anchor) // self.interval + 1
            if k * self.interval > MAX_INSTANT - self.anchor:
                return None
            at = self.anchor + k * self.interval
        if at > MAX_INSTANT:
            return None
        local = at.astimezone(self.zone)
        return Occurrence(at, local, fmt_wall(local.replace(tzinfo=None)), None)
