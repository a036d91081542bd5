"""Value types shared by every rule kind. No Django, no database."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum


class DstSkipped(StrEnum):
    """What a fixed-time rule does with a wall time a DST transition skips."""

    NEXT_VALID = "next_valid"  # the first valid time after the gap
    SHIFT = "shift"  # the same offset from before the gap
    SKIP = "skip"  # not at all that day


class DstRepeated(StrEnum):
    """What a fixed-time rule does with a wall time a DST transition repeats."""

    EARLIER = "earlier"
    LATER = "later"
    BOTH = "both"


SKIPPED_CHOICES = tuple(p.value for p in DstSkipped)
REPEATED_CHOICES = tuple(p.value for p in DstRepeated)


class ExpressionError(ValueError):
    """A schedule's expression, zone, policy or anchor cannot be used.

    ``field`` names the API field at fault ('expression', 'timeZone', 'dstPolicy', 'startAt');
    ``str(e)`` is written for the person who typed it.
    """

    def __init__(self, message: str, field: str = "expression"):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class DstPolicy:
    """How fixed-time rules treat wall times that a DST transition skips or repeats."""

    skipped: str = DstSkipped.NEXT_VALID
    repeated: str = DstRepeated.EARLIER

    def __post_init__(self):
        if self.skipped not in SKIPPED_CHOICES:
            raise ExpressionError(
                f"dstPolicy.skipped must be one of {', '.join(SKIPPED_CHOICES)}, not {self.skipped!r}",
                "dstPolicy",
            )
        if self.repeated not in REPEATED_CHOICES:
            raise ExpressionError(
                f"dstPolicy.repeated must be one of {', '.join(REPEATED_CHOICES)}, not {self.repeated!r}",
                "dstPolicy",
            )

    @classmethod
    def from_dict(cls, d: dict | None) -> DstPolicy:
        if d is None:
            return cls()
        if not isinstance(d, dict):
            raise ExpressionError(
                'dstPolicy must be an object like {"skipped": "next_valid", "repeated": "earlier"}',
                "dstPolicy",
            )
        unknown = set(d) - {"skipped", "repeated"}
        if unknown:
            raise ExpressionError(
                f"dstPolicy has unknown key(s) {', '.join(sorted(map(str, unknown)))}; "
                "allowed: skipped, repeated",
                "dstPolicy",
            )
        for key in ("skipped", "repeated"):
            if key in d and not isinstance(d[key], str):
                raise ExpressionError(f"dstPolicy.{key} must be a string", "dstPolicy")
        return cls(skipped=d.get("skipped", DstSkipped.NEXT_VALID), repeated=d.get("repeated", DstRepeated.EARLIER))

    def to_dict(self) -> dict:
        return {"skipped": self.skipped, "repeated": self.repeated}


@dataclass(frozen=True)
class Occurrence:
    """One instant a rule produced.

    ``at`` is the identity (UTC); ``wall`` is the local time the rule meant, which differs from
    ``local`` only when a DST transition moved or dropped the occurrence (then ``note`` says why).
    """

    at: datetime
    local: datetime
    wall: str
    note: str | None = None
    dropped: bool = False
