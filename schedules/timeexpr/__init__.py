"""Time-expression engine: cron, RRULE, at() and rate() rules in an IANA zone.

Pure: no database, no Django models. What it promises users, and why, is docs/time-semantics.md.

Errors and budgets. Every refusal is an ``ExpressionError`` whose ``field`` names the API field
at fault; nothing else escapes ``parse``, ``preview`` or ``Rule.next_after`` for well-formed
(aware datetime) arguments. Evaluation is bounded by work budgets (budget.py):

- ``parse`` refuses with ``TooExpensive`` (an ExpressionError, field 'expression', message
  starting "too expensive to evaluate") a rule it cannot validate within VALIDATION_UNITS, or
  whose next occurrence costs more than PROBE_UNITS from any of a few spread-out points.
- ``preview`` raises ``TooExpensive`` past PREVIEW_UNITS for the whole preview.
- ``Rule.next_after`` raises ``TooExpensive`` past NEXT_AFTER_UNITS for one call. Accepted
  rules stay far below it; a scanner that meets it should stop evaluating that schedule
  (park it with the message as the visible reason) instead of retrying it in a loop.
- Near the ends of the calendar (see MIN_INSTANT / MAX_INSTANT) a rule simply ends:
  ``next_after`` returns None.
"""

from __future__ import annotations

from datetime import datetime, timezone

from .budget import (
    NEXT_AFTER_UNITS,
    PREVIEW_UNITS,
    PROBE_UNITS,
    VALIDATION_CPU_SECONDS,
    VALIDATION_UNITS,
    TooExpensive,
    metered,
)
from .parsing import parse
from .rules import Rule
from .types import DstPolicy, ExpressionError, Occurrence
from .zones import MAX_INSTANT, MIN_INSTANT, tzdata_version, validate_time_zone

__all__ = [
    "MAX_INSTANT",
    "MIN_INSTANT",
    "NEXT_AFTER_UNITS",
    "PREVIEW_UNITS",
    "PROBE_UNITS",
    "VALIDATION_UNITS",
    "DstPolicy",
    "ExpressionError",
    "Occurrence",
    "Rule",
    "TooExpensive",
    "parse",
    "preview",
    "to_wire",
    "tzdata_version",
    "validate_time_zone",
]


def preview(rule: Rule, after: datetime, count: int) -> list[Occurrence]:
    """The next ``count`` occurrences strictly after ``after``, dropped ones included.

    Raises TooExpensive when the whole preview needs more than PREVIEW_UNITS.
    """
    out: list[Occurrence] = []
    if count <= 0:
        return out
    with metered("previewing the expression", PREVIEW_UNITS, VALIDATION_CPU_SECONDS):
        for occ in rule.iter_after(after):
            out.append(occ)
            if len(out) >= count:
                break
    return out


def to_wire(occ: Occurrence) -> dict:
    at = occ.at.astimezone(timezone.utc).replace(tzinfo=None)
    wire = {
        "at": at.isoformat(timespec="microseconds" if at.microsecond else "seconds") + "Z",
        "local": occ.local.isoformat(),
        "wall": occ.wall,
        "note": occ.note,
    }
    if occ.dropped:
        wire["dropped"] = True
    return wire
