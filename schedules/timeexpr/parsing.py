"""parse(): from the API's expression text to a Rule."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

from .cron import CronWalls, cron_text, is_fixed_time
from .rules import AtRule, RateRule, Rule, WallRule
from .types import DstPolicy, ExpressionError, Occurrence
from .zones import resolve_fixed, validate_time_zone

UTC = timezone.utc

_RATE = re.compile(r"^rate\(\s*(\d+)\s+(minute|minutes|hour|hours|day|days)\s*\)$", re.IGNORECASE)
_AT = re.compile(r"^at\((.*)\)$", re.IGNORECASE)
_UNIT = {"minute": timedelta(minutes=1), "hour": timedelta(hours=1), "day": timedelta(days=1)}
_MAX_RATE = timedelta(days=3660)


def parse(expression: str, time_zone: str, *, anchor: datetime, dst_policy: DstPolicy | None = None) -> Rule:
    """Parse a schedule expression.

    ``anchor`` is the schedule's startAt, else its creation time: rate() counts from it and an
    RRULE without DTSTART starts at its wall time. Raises ExpressionError for bad syntax, an
    unknown zone, or a rule that never fires. A one-time at() in the past is not an error here.
    """
    if not isinstance(expression, str) or not expression.strip():
        raise ExpressionError("expression is empty: give a cron rule, an RRULE, at(...) or rate(...)")
    zone = validate_time_zone(time_zone)
    if not isinstance(anchor, datetime) or anchor.tzinfo is None or anchor.utcoffset() is None:
        raise ExpressionError("startAt must be a date-time with a UTC offset", "startAt")
    policy = dst_policy if dst_policy is not None else DstPolicy()
    text = expression.strip()
    low = text.lower()

    if low.startswith("rate("):
        return _parse_rate(text, zone, policy, anchor)
    if low.startswith("at("):
        return _parse_at(text, zone, policy)
    if low.startswith("rrule") or low.startswith("dtstart"):
        from .rrule import parse_rrule

        rule = parse_rrule(text, zone, policy, anchor)
    else:
        ctext = cron_text(text)
        walls = CronWalls(ctext)
        rule = WallRule("cron", text, zone, policy, walls, sub_daily=not is_fixed_time(ctext))
    if rule.next_after(anchor - timedelta(microseconds=1)) is None:
        raise ExpressionError(
            f"{text!r} never fires after {anchor.astimezone(zone).isoformat()} in {zone.key}"
        )
    return rule


def _parse_rate(text: str, zone, policy: DstPolicy, anchor: datetime) -> Rule:
    m = _RATE.match(text)
    if not m:
        raise ExpressionError(
            f"bad rate expression {text!r}: use rate(<n> minutes|hours|days), e.g. rate(15 minutes)"
        )
    n = int(m.group(1))
    if n == 0:
        raise ExpressionError(f"bad rate expression {text!r}: the interval must be at least 1")
    interval = n * _UNIT[m.group(2).lower().rstrip("s")]
    if interval > _MAX_RATE:
        raise ExpressionError(f"bad rate expression {text!r}: the interval must be at most 3660 days")
    return RateRule(text, zone, policy, anchor, interval)


def _parse_at(text: str, zone, policy: DstPolicy) -> Rule:
    m = _AT.match(text)
    raw = m.group(1).strip() if m else ""
    try:
        when = datetime.fromisoformat(raw)
    except ValueError:
        raise ExpressionError(
            f"bad at() expression {text!r}: use at(YYYY-MM-DDTHH:MM:SS), a local time in the "
            "schedule's zone, or add an offset or Z for an absolute instant"
        ) from None
    if "T" not in raw.upper() and " " not in raw:
        raise ExpressionError(f"bad at() expression {text!r}: give a time of day too, e.g. at({raw}T09:00:00)")
    if when.tzinfo is not None:
        at = when.astimezone(UTC)
        local = at.astimezone(zone)
        occs = [Occurrence(at, local, local.replace(tzinfo=None).isoformat(timespec="seconds"), None)]
    else:
        occs = resolve_fixed(zone, when, policy)
    return AtRule(text, zone, policy, occs)
