"""Issue 26, finding 9: an aware datetime whose instant has no UTC datetime (0001-01-01T01:00+05:00,
9999-12-31T23:00-05:00) made an OverflowError escape next_after, between, iter_after and preview,
which the engine's contract says raise nothing but ExpressionError for aware arguments. It is an
ExpressionError that says what the engine's range is; instants inside UTC's range but outside the
engine's keep their meaning (before the range: from its start; after it: no more occurrences)."""

from datetime import datetime, timedelta, timezone

import pytest

from schedules.timeexpr import ExpressionError, parse, preview

from .helpers import utc

EAST, WEST = timezone(timedelta(hours=5)), timezone(-timedelta(hours=5))
TOO_EARLY = datetime(1, 1, 1, 1, tzinfo=EAST)  # 0000-12-31T20:00Z
TOO_LATE = datetime(9999, 12, 31, 23, tzinfo=WEST)  # 10000-01-01T04:00Z
EXPRESSIONS = ["0 3 * * *", "*/5 * * * *", "DTSTART:20260101T000000\nRRULE:FREQ=DAILY", "at(2026-05-01T00:00)",
               "rate(5 minutes)"]
CALLS = {
    "next_after": lambda rule, at: rule.next_after(at),
    "between from": lambda rule, at: rule.between(at, utc("2026-02-01T00:00Z"), 3),
    "between to": lambda rule, at: rule.between(utc("2026-01-01T00:00Z"), at, 3),
    "iter_after": lambda rule, at: next(rule.iter_after(at), None),
    "preview": lambda rule, at: preview(rule, at, 3),
}


@pytest.mark.parametrize("call", list(CALLS))
@pytest.mark.parametrize("at", [TOO_EARLY, TOO_LATE], ids=["too-early", "too-late"])
@pytest.mark.parametrize("expr", EXPRESSIONS)
def test_finding_9_an_instant_outside_utc_is_an_expression_error(expr, at, call):
    rule = parse(expr, "Europe/Paris", anchor=utc("2026-01-01T00:00Z"))
    with pytest.raises(ExpressionError) as e:
        CALLS[call](rule, at)
    assert "has no instant in UTC" in str(e.value) and "0001-01-02T00:00:00Z" in str(e.value)
    assert e.value.field == "startAt"


def test_finding_9_the_first_and_last_utc_instants_are_still_answered():
    rule = parse("0 3 * * *", "Europe/Paris", anchor=utc("2026-01-01T00:00Z"))
    first = datetime(1, 1, 1, tzinfo=timezone.utc)
    assert [o.wall for o in rule.between(first, datetime(1, 1, 4, tzinfo=timezone.utc), 5)] == [
        "0001-01-02T03:00:00", "0001-01-03T03:00:00"]
    assert rule.next_after(datetime.max.replace(tzinfo=timezone.utc)) is None

