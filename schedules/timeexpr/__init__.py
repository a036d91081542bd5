"""Time-expression engine: cron, RRULE, at() and rate() rules in an IANA zone.

Pure: no database, no Django models. The contract is /work/shared/spec/time.md; the user-facing
explanation is docs/time-semantics.md.
"""

from __future__ import annotations

from datetime import datetime, timezone

from .parsing import parse
from .rules import Rule
from .types import DstPolicy, ExpressionError, Occurrence
from .zones import tzdata_version, validate_time_zone

__all__ = [
    "DstPolicy",
    "ExpressionError",
    "Occurrence",
    "Rule",
    "parse",
    "preview",
    "to_wire",
    "tzdata_version",
    "validate_time_zone",
]


def preview(rule: Rule, after: datetime, count: int) -> list[Occurrence]:
    """The next ``count`` occurrences strictly after ``after``, dropped ones included."""
    out: list[Occurrence] = []
    for occ in rule.iter_after(after):
        if len(out) >= count:
            break
        out.append(occ)
    return out


def to_wire(occ: Occurrence) -> dict:
    at = occ.at.astimezone(timezone.utc)
    wire = {
        "at": at.strftime("%Y-%m-%dT%H:%M:%S") + (f".{at.microsecond:06d}" if at.microsecond else "") + "Z",
        "local": occ.local.isoformat(),
        "wall": occ.wall,
        "note": occ.note,
    }
    if occ.dropped:
        wire["dropped"] = True
    return wire
