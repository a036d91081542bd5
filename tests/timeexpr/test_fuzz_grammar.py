"""Fuzzing over the expression grammar: only ExpressionError escapes, and the budgets hold.

Expressions come from tests/timeexpr/strategies.py: cron fields with ranges, steps, lists,
names, L/W/#; RRULE parts including BYSETPOS, COUNT, UNTIL, INTERVAL and DTSTART at the ends of
the calendar; at()/rate() extremes; zone names drawn from the installed tzdata package's files
(zones and the files that are not zones). For an accepted rule, next_after is asked from points
anywhere in years 1-9999 and must answer (an occurrence or None) within the probe budget: an
accepted rule is never one the scanner would have to park.
"""

import time
from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from schedules.timeexpr import DstPolicy, ExpressionError, TooExpensive, budget, parse, preview

from .strategies import AFTERS, ANCHORS, EXPRESSIONS, ZONE_NAMES, cron_expressions, rrule_expressions

FUZZ = settings(max_examples=250, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
POLICIES = st.builds(DstPolicy, st.sampled_from(["next_valid", "shift", "skip"]),
                     st.sampled_from(["earlier", "later", "both"]))
CALENDAR_END = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
ZONES = st.one_of(ZONE_NAMES, st.sampled_from(["UTC", "America/New_York", "Australia/Lord_Howe", "Pacific/Apia"]))


def _check(expr, zone, anchor, afters, policy):
    t = time.thread_time()
    with budget.metered("fuzz", 10**9, 100) as m:
        try:
            rule = parse(expr, zone, anchor=anchor, dst_policy=policy)
        except ExpressionError as e:
            assert e.field in ("expression", "timeZone", "startAt", "dstPolicy")
            rule = None
    # The step crossing a limit is counted before it is refused, hence the margin.
    assert m.used <= budget.VALIDATION_UNITS + 1300
    assert time.thread_time() - t < 1.0
    if rule is None:
        return
    # Ten years after the anchor, or the calendar's last second for an anchor later than that.
    later = min(anchor, CALENDAR_END - timedelta(days=3653)) + timedelta(days=3653)
    for after in afters + [anchor, later]:
        with budget.metered("fuzz", 10**9, 100) as m:
            occ = rule.next_after(after)
        assert occ is None or occ.at > after
        assert m.used <= budget.PROBE_UNITS, (expr, zone, after, m.used)
    try:
        occs = preview(rule, anchor, 10)
    except TooExpensive:
        occs = []
    assert all(a.at < b.at for a, b in zip(occs, occs[1:]))


@FUZZ
@example("at(1970-01-01T00:00:00)", "Africa/Abidjan", datetime(9990, 1, 1, tzinfo=UTC), [],
         DstPolicy("next_valid", "earlier"))  # once overflowed in this test's own arithmetic
@given(EXPRESSIONS, ZONES, ANCHORS, st.lists(AFTERS, max_size=3), POLICIES)
def test_any_expression_gives_a_rule_or_an_expression_error_within_budget(expr, zone, anchor, afters, policy):
    _check(expr, zone, anchor, afters, policy)


@FUZZ
@given(st.one_of(rrule_expressions(), cron_expressions()), st.sampled_from(["UTC", "America/New_York",
                                                                             "Australia/Lord_Howe", "Asia/Manila"]),
       ANCHORS, st.lists(AFTERS, max_size=3), POLICIES)
def test_near_valid_cron_and_rrule_stay_within_budget(expr, zone, anchor, afters, policy):
    _check(expr, zone, anchor, afters, policy)
