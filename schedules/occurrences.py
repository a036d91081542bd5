"""The one walk over a schedule version's occurrences, within its bounds.

Every caller that turns a rule into instants goes through `walk`: the scanner (what is due up to
now plus the horizon), backfill (what lies in a range), an edit, pause or archive recording what
was due but not yet made, and the previews of the API and the portal (`upcoming`). The version's
`endAt` is applied here, so no caller can forget it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from schedules.models import Schedule, ScheduleStatus, ScheduleVersion

ONE_US = timedelta(microseconds=1)


@dataclass
class Span:
    occurrences: list  # timeexpr.Occurrence, in order, dropped ones included
    # Where the next walk should start from (a schedule's next_run_at): the first instant not
    # taken, or just after the last one taken when the walk stopped at its limit. None when the
    # rule has nothing more within its bounds.
    resume_at: datetime | None
    completed: bool  # the rule has no more occurrences within the version's endAt
    truncated: bool  # the walk stopped at `limit`


def walk(rule, version: ScheduleVersion, *, after: datetime, until: datetime | None = None,
         inclusive: bool = True, limit: int | None = None, count_dropped: bool = True) -> Span:
    """Occurrences of `rule` strictly after `after`, up to `until` (inclusive or not; None: no
    bound), before the version's endAt, at most `limit` of them (counting only ones the DST
    policy keeps when `count_dropped` is False)."""
    out, taken = [], 0
    for occ in rule.iter_after(after):
        if version.end_at and occ.at >= version.end_at:
            return Span(out, None, True, False)
        if until is not None and (occ.at > until if inclusive else occ.at >= until):
            return Span(out, occ.at, False, False)
        out.append(occ)
        if count_dropped or not occ.dropped:
            taken += 1
        if limit is not None and taken >= limit:
            return Span(out, occ.at + ONE_US, False, True)
    return Span(out, None, True, False)  # the rule has no more (a fired at(), an exhausted RRULE)


def upcoming(schedule: Schedule, rule, count: int) -> list:
    """The next `count` instants a schedule will make runs for, from the next one still to be
    made (what is already materialised shows in its runs), dropped ones included and marked.
    A paused, completed or archived schedule has none: resuming computes from that moment."""
    if schedule.status != ScheduleStatus.ACTIVE or not schedule.enabled or schedule.next_run_at is None:
        return []
    return walk(rule, schedule.current, after=schedule.next_run_at - ONE_US, limit=count).occurrences
