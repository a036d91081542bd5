"""parse(): from the API's expression text to a Rule."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

from .budget import PROBE_UNITS, VALIDATION_CPU_SECONDS, VALIDATION_UNITS, metered
from .cron import CronWalls, cron_text, is_fixed_time
from .days import shared
from .rrule import parse_rrule
from .rules import AtRule, RateRule, Rule, WallRule
from .types import DstPolicy, ExpressionError, Occurrence
from .zones import MAX_INSTANT, RANGE_TEXT, in_range, resolve_fixed, validate_time_zone

UTC = timezone.utc

_RATE = re.compile(r"^rate\(\s*([0-9]+)\s+(minute|minutes|hour|hours|day|days)\s*\)$", re.IGNORECASE)
_AT = re.compile(r"^at\((.*)\)$", re.IGNORECASE | re.DOTALL)
_UNIT = {"minute": timedelta(minutes=1), "hour": timedelta(hours=1), "day": timedelta(days=1)}
_MAX_RATE = timedelta(days=3660)
MAX_EXPRESSION_LENGTH = 4096
_RANGE_TEXT = RANGE_TEXT


def parse(expression: str, time_zone: str, *, anchor: datetime, dst_policy: DstPolicy | None = None) -> Rule:
    """Parse a schedule expression.

    ``anchor`` is the schedule's startAt, else its creation time: rate() counts from it and an
    RRULE without DTSTART starts at its wall time. Raises ExpressionError for bad syntax, an
    unknown zone, or a rule that never fires, and its subclass TooExpensive for a rule that
    cannot be validated within budget.VALIDATION_UNITS. A one-time at() in the past is not an
    error here.
    """
    if not isinstance(expression, str) or not expression.strip():
        raise ExpressionError("expression is empty: give a cron rule, an RRULE, at(...) or rate(...)")
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise ExpressionError(f"expression is longer than {MAX_EXPRESSION_LENGTH} characters")
    zone = validate_time_zone(time_zone)
    if not isinstance(anchor, datetime) or anchor.tzinfo is None or anchor.utcoffset() is None:
        raise ExpressionError("startAt must be a date-time with a UTC offset", "startAt")
    try:
        anchor_utc = anchor.astimezone(UTC)
    except OverflowError:
        anchor_utc = None
    if anchor_utc is None or not in_range(anchor_utc):
        raise ExpressionError(f"startAt must be between {_RANGE_TEXT}", "startAt")
    policy = dst_policy if dst_policy is not None else DstPolicy()
    with metered("validating the expression", VALIDATION_UNITS, VALIDATION_CPU_SECONDS):
        return _parse(expression.strip(), zone, policy, anchor_utc)


def _parse(text: str, zone, policy: DstPolicy, anchor: datetime) -> Rule:
    low = text.lower()
    if low.startswith("rate("):
        return _parse_rate(text, zone, policy, anchor)
    if low.startswith("at("):
        return _parse_at(text, zone, policy)
    if low.startswith("rrule") or low.startswith("dtstart"):
        rule = parse_rrule(text, zone, policy, anchor)
    else:
        ctext = cron_text(text)
        # A cron rule's wall times do not depend on the zone: schedules with the same text share them.
        walls = shared(("cron", ctext), lambda: CronWalls(ctext))
        rule = WallRule("cron", text, zone, policy, walls, sub_daily=not is_fixed_time(ctext))
    with metered("finding an occurrence", PROBE_UNITS, VALIDATION_CPU_SECONDS):
        first = rule.next_after(anchor - timedelta(microseconds=1))
    if first is None:
        raise ExpressionError(
            f"{text!r} never fires after {anchor.astimezone(zone).isoformat()} in {zone.key}"
        )
    _probe(rule, first.at)
    return rule


# Points after the first occurrence from which validation also asks for the next one: a rule
# is accepted only if these cost little too, not just its first occurrence (the gaps of a
# sparse rule differ from year to year).
_PROBES = (timedelta(hours=17), timedelta(days=7, hours=5), timedelta(days=45), timedelta(days=400),
           timedelta(days=4 * 365 + 10), timedelta(days=29 * 365), timedelta(days=211 * 365))


def _probe(rule: Rule, first: datetime) -> None:
    for delta in _PROBES:
        if MAX_INSTANT - first <= delta:
            break
        with metered("finding an occurrence", PROBE_UNITS, VALIDATION_CPU_SECONDS):
            if rule.next_after(first + delta) is None:
                break


def _parse_rate(text: str, zone, policy: DstPolicy, anchor: datetime) -> Rule:
    m = _RATE.match(text)
    if not m:
        raise ExpressionError(
            f"bad rate expression {text!r}: use rate(<n> minutes|hours|days), e.g. rate(15 minutes)"
        )
    digits, unit = m.group(1), _UNIT[m.group(2).lower().rstrip("s")]
    limit = _MAX_RATE // unit
    if len(digits) > 12 or int(digits) > limit:
        raise ExpressionError(
            f"bad rate expression {text!r}: the interval must be at most 3660 days "
            f"({limit} {m.group(2).lower().rstrip('s')}s)"
        )
    n = int(digits)
    if n == 0:
        raise ExpressionError(f"bad rate expression {text!r}: the interval must be at least 1")
    return RateRule(text, zone, policy, anchor, n * unit)


def _parse_at(text: str, zone, policy: DstPolicy) -> Rule:
    m = _AT.match(text)
    raw = m.group(1).strip() if m else ""
    try:
        when = datetime.fromisoformat(raw) if len(raw) <= 64 else None
    except ValueError:
        when = None
    if when is None:
        raise ExpressionError(
            f"bad at() expression {text[:100]!r}: use at(YYYY-MM-DDTHH:MM:SS), a local time in the "
            "schedule's zone, or add an offset or Z for an absolute instant"
        )
    if "T" not in raw.upper() and " " not in raw:
        raise ExpressionError(f"bad at() expression {text!r}: give a time of day too, e.g. at({raw}T09:00:00)")
    try:
        if when.tzinfo is not None:
            at = when.astimezone(UTC)
            if not in_range(at):
                raise OverflowError
            local = at.astimezone(zone)
            occs = [Occurrence(at, local, local.replace(tzinfo=None).isoformat(timespec="seconds"), None)]
        else:
            occs = resolve_fixed(zone, when, policy)
            if not occs:
                raise OverflowError
    except OverflowError:
        raise ExpressionError(
            f"at() time {raw!r} is outside the supported range: instants from {_RANGE_TEXT}"
        ) from None
    return AtRule(text, zone, policy, occs)
