"""Spread: a schedule's occurrences become eligible a fixed offset after their nominal instant.

An occurrence keeps its nominal instant as its identity (its scheduled time, its occurrence key,
its DST resolution); only the moment a worker may first start its run moves, to
`nominal + offset`, with the offset in [0, window) and constant per schedule. The offset comes
from the schedule's id, as Jenkins' hashed `H` minute does: every scanner computes the same one,
before and after any restart, a daily job starts at the same second every day, and different
schedules land evenly over the window. The exact rule is stated in docs/time-semantics.md,
"Spread".
"""

from __future__ import annotations

import hashlib
import uuid
from datetime import datetime, timedelta

# The longest window a schedule may declare: a spread is for smoothing a common boundary, not for
# moving a run to another day.
MAX_SPREAD_SECONDS = 86_400
# The shortest-interval look-ahead (shortest_interval): occurrences over this long from now, at most
# LOOKAHEAD_OCCURRENCES of them, plus the neighbourhood of every UTC-offset change of the zone in
# that time (where a wall-clock rule's gaps shrink).
LOOKAHEAD = timedelta(days=366)
LOOKAHEAD_OCCURRENCES = 2_000
AROUND_CHANGE_BEFORE = timedelta(hours=3)
AROUND_CHANGE_AFTER = timedelta(hours=27)
AROUND_CHANGE_OCCURRENCES = 200


def spread_offset(schedule_id, window: int) -> int:
    """Whole seconds in [0, window): the first 8 bytes of SHA-256(schedule id's 16 bytes) as an
    unsigned big-endian integer h, mapped uniformly onto the window as floor(h * window / 2**64).
    0 when there is no window."""
    if not window:
        return 0
    sid = schedule_id if isinstance(schedule_id, uuid.UUID) else uuid.UUID(str(schedule_id))
    h = int.from_bytes(hashlib.sha256(sid.bytes).digest()[:8], "big")
    return (h * window) >> 64


def eligible_at(nominal: datetime, offset_seconds: int) -> datetime:
    """When a scheduled occurrence at `nominal` may first start: offset seconds of real time later
    (added to the instant, after the DST policy resolved it)."""
    return nominal + timedelta(seconds=offset_seconds) if offset_seconds else nominal


def _offset_changes(zone, start: datetime, end: datetime) -> list[datetime]:
    """Instants (to the minute) where the zone's UTC offset changes between start and end: a probe
    a day, then a bisection inside each day where it changed."""
    out = []
    day = timedelta(days=1)
    t = start
    before = t.astimezone(zone).utcoffset()
    while t < end:
        nxt = t + day
        after = nxt.astimezone(zone).utcoffset()
        if after != before:
            lo, hi = t, nxt
            while hi - lo > timedelta(minutes=1):
                mid = lo + (hi - lo) / 2
                if mid.astimezone(zone).utcoffset() == before:
                    lo = mid
                else:
                    hi = mid
            out.append(hi)
        t, before = nxt, after
    return out


def _min_gap(occurrences, current: timedelta | None) -> timedelta | None:
    previous = None
    for occ in occurrences:
        if occ.dropped:
            continue
        if previous is not None and occ.at > previous:
            gap = occ.at - previous
            if current is None or gap < current:
                current = gap
        previous = occ.at
    return current


def _bounded(rule, after: datetime, until: datetime, limit: int):
    n = 0
    for occ in rule.iter_after(after):
        if occ.at > until or n >= limit:
            return
        n += 1
        yield occ


def shortest_interval(rule, *, after: datetime) -> timedelta | None:
    """The shortest time between two consecutive occurrences the rule makes (None: at most one).

    rate(): its interval, exactly. at(): None. cron and RRULE: the smallest gap over a bounded
    look-ahead from `after`: the occurrences of the next LOOKAHEAD (a year: every month, weekday
    and leap day the calendar gives within it), at most LOOKAHEAD_OCCURRENCES of them, and the
    occurrences around each UTC-offset change of the zone in that year, where a wall-clock rule's
    gaps are shorter (a 2-hourly cron is 1 hour apart across a spring-forward). Dropped
    occurrences (DST skip) make no run and so count for nothing."""
    if rule.kind == "rate":
        return rule.interval
    if rule.kind == "at":
        return None
    after = after.replace(second=0, microsecond=0)
    if rule.kind != "cron":
        # An RRULE's DTSTART may come from the schedule's anchor, which the parsed rule does not
        # keep: computed each time.
        return _shortest_wall_interval(rule, after)
    # Cached per cron text, zone, DST policy and minute: a batch of schedules with one expression
    # is checked once.
    key = (rule.expression, rule.zone.key, rule.policy, after)
    if key not in _SHORTEST:
        if len(_SHORTEST) >= _SHORTEST_SIZE:
            _SHORTEST.clear()
        _SHORTEST[key] = _shortest_wall_interval(rule, after)
    return _SHORTEST[key]


_SHORTEST: dict = {}
_SHORTEST_SIZE = 4096


def _shortest_wall_interval(rule, after: datetime) -> timedelta | None:
    until = after + LOOKAHEAD
    gap = _min_gap(_bounded(rule, after, until, LOOKAHEAD_OCCURRENCES), None)
    for change in _offset_changes(rule.zone, after, until):
        gap = _min_gap(_bounded(rule, change - AROUND_CHANGE_BEFORE, change + AROUND_CHANGE_AFTER,
                                AROUND_CHANGE_OCCURRENCES), gap)
    return gap


def spread_problem(window: int, rule, *, after: datetime) -> str | None:
    """Why `window` cannot be this rule's spread, or None when it can. The window must be below the
    rule's shortest interval: then an occurrence is always eligible before the next one's nominal
    instant, so the overlap policy (decided at that nominal instant) sees the earlier run already
    startable, and the misfire grace of one occurrence never runs into the next one's."""
    if not 0 <= window <= MAX_SPREAD_SECONDS:
        return f"spreadSeconds must be between 0 and {MAX_SPREAD_SECONDS} (1 day)"
    if window == 0:
        return None
    shortest = shortest_interval(rule, after=after)
    if shortest is not None and timedelta(seconds=window) >= shortest:
        return (f"spreadSeconds must be below the rule's shortest interval between occurrences "
                f"({int(shortest.total_seconds())} s), so each occurrence is eligible before the next one is due")
    return None


def describe(window: int) -> str:
    """"10-minute", "90-second", "2-hour" spread wording for the portal."""
    if window % 3600 == 0:
        return f"{window // 3600}-hour"
    if window % 60 == 0:
        return f"{window // 60}-minute"
    return f"{window}-second"
