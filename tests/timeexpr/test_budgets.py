"""Bounded cost (issue 13, item 9): validation and previews stop within a fixed work budget, and
next_after on an accepted rule costs little whatever the schedule's age.

Work is counted in deterministic units (schedules/timeexpr/budget.py), so these tests do not
depend on the machine; bench/timeexpr_costs.py prints the same costs in milliseconds.
"""

import gc
import time
from datetime import datetime, timedelta, timezone

import pytest

from schedules import timeexpr
from schedules.timeexpr import ExpressionError, TooExpensive, budget, parse, preview

UTC = timezone.utc
ANCHOR = datetime(2026, 1, 1, tzinfo=UTC)


def measure(fn):
    """(result or the ExpressionError raised, work units, CPU seconds)."""
    t = time.thread_time()
    with budget.metered("test", 10**9, 100) as m:
        try:
            got = fn()
        except ExpressionError as e:
            got = e
    return got, m.used, time.thread_time() - t


# (expression, anchor, None when accepted else a fragment of the refusal)
ISSUE_CASES = [
    ("RRULE:FREQ=HOURLY;BYSETPOS=2", ANCHOR, "BYSETPOS=2 picks nothing"),
    ("RRULE:FREQ=MINUTELY;BYSETPOS=2", ANCHOR, "BYSETPOS=2 picks nothing"),
    ("RRULE:FREQ=SECONDLY;BYSETPOS=2", ANCHOR, "BYSETPOS=2 picks nothing"),
    ("RRULE:FREQ=DAILY;BYSETPOS=2", ANCHOR, "BYSETPOS=2 picks nothing: with FREQ=DAILY a day holds only 1"),
    ("RRULE:FREQ=WEEKLY;BYSETPOS=9", ANCHOR, "BYSETPOS=9 picks nothing"),
    ("RRULE:FREQ=DAILY;INTERVAL=0", ANCHOR, "INTERVAL=0"),
    ("DTSTART:19700101T000000\nRRULE:FREQ=SECONDLY;COUNT=2000000000", ANCHOR, None),
    ("DTSTART:20000101T000000\nRRULE:FREQ=MINUTELY;COUNT=100000000", ANCHOR, None),
    ("RRULE:FREQ=DAILY;BYMONTH=2;BYMONTHDAY=30", ANCHOR, "never fires"),
    ("DTSTART:19900101T090000\nRRULE:FREQ=MONTHLY", ANCHOR, None),
    ("DTSTART:19900131T090000\nRRULE:FREQ=MONTHLY;COUNT=100000", ANCHOR, None),
    ("RRULE:FREQ=HOURLY;BYSETPOS=1,-1;BYMINUTE=0,30", ANCHOR, None),
    ("RRULE:FREQ=MONTHLY;BYDAY=MO,TU,WE,TH,FR;BYSETPOS=-1", ANCHOR, None),
]


@pytest.mark.parametrize("expr,anchor,refusal", ISSUE_CASES, ids=[c[0].replace("\n", " ") for c in ISSUE_CASES])
def test_issue_rules_are_answered_within_the_validation_budget(expr, anchor, refusal):
    got, units, cpu = measure(lambda: parse(expr, "America/New_York", anchor=anchor))
    assert units <= budget.VALIDATION_UNITS
    assert cpu < 1.0  # a hang would be minutes; the budget's own CPU guard is 0.5 s
    if refusal is None:
        assert not isinstance(got, ExpressionError), got
    else:
        assert isinstance(got, ExpressionError) and refusal in str(got)


def test_a_huge_count_of_plain_steps_ends_where_arithmetic_says():
    rule = parse("DTSTART:20000101T000000\nRRULE:FREQ=MINUTELY;COUNT=100000000", "UTC", anchor=ANCHOR)
    last = datetime(2000, 1, 1, tzinfo=UTC) + timedelta(minutes=100_000_000 - 1)
    assert rule.next_after(last - timedelta(seconds=1)).at == last
    assert rule.next_after(last) is None
    rule = parse("DTSTART:19700101T000000\nRRULE:FREQ=SECONDLY;COUNT=2000000000", "UTC", anchor=ANCHOR)
    last = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=2_000_000_000 - 1)
    assert rule.next_after(last - timedelta(seconds=1)).at == last and rule.next_after(last) is None


def test_a_filtered_count_is_counted_by_whole_years():
    # Weekdays at 09:00 from 1970, 20,000 of them: 1970 + about 76.7 years.
    rule = parse("DTSTART:19700101T090000\nRRULE:FREQ=DAILY;BYDAY=MO,TU,WE,TH,FR;COUNT=20000", "UTC",
                 anchor=datetime(1970, 1, 1, tzinfo=UTC))
    occs = list(rule.iter_after(datetime(2046, 8, 1, tzinfo=UTC)))
    days, d = [], datetime(1970, 1, 1, 9, tzinfo=UTC)
    while len(days) < 20000:
        if d.weekday() < 5:
            days.append(d)
        d += timedelta(days=1)
    assert occs[-1].at == days[-1]


@pytest.mark.parametrize("expr", [
    "RRULE:FREQ=MONTHLY;COUNT=100000",
    "RRULE:FREQ=YEARLY;BYMONTH=3;BYDAY=-1SU;COUNT=5000",
    "RRULE:FREQ=WEEKLY;BYDAY=MO,WE;BYSETPOS=-1;COUNT=5000",
    "RRULE:FREQ=DAILY;INTERVAL=3;BYMONTHDAY=31;COUNT=5000",
    "RRULE:FREQ=MONTHLY",
    "RRULE:FREQ=HOURLY;INTERVAL=5;BYHOUR=9,10,11",
])
def test_next_after_costs_the_same_whatever_the_age_of_the_schedule(expr):
    costs = []
    for start in ("19700105T090000", "20000103T090000", "20251229T090000"):
        rule = parse(f"DTSTART:{start}\n{expr}", "Europe/Paris", anchor=datetime(1970, 1, 1, tzinfo=UTC))
        for after in (datetime(2026, 6, 1, tzinfo=UTC), datetime(2031, 2, 3, 4, 5, tzinfo=UTC)):
            got, units, _ = measure(lambda: rule.next_after(after))
            assert not isinstance(got, ExpressionError)
            costs.append(units)
    # Neither the rule's age nor its COUNT shows in the cost: no re-reading from DTSTART.
    assert max(costs) <= 60, costs


ACCEPTED = [
    "0 0 29 2 */7", "0 0 * 2 MON#5", "0-59 0-23 * * *", "*/5 * * * *", "0 0 L * 5L", "0 9 * * 1-5",
    "RRULE:FREQ=YEARLY;BYWEEKNO=53;BYDAY=TH", "RRULE:FREQ=MINUTELY;BYMONTH=2;BYMONTHDAY=29;BYDAY=MO;BYHOUR=3",
    "RRULE:FREQ=MINUTELY;INTERVAL=1439;BYHOUR=0;BYMINUTE=0", "RRULE:FREQ=SECONDLY;INTERVAL=86401;BYHOUR=3;BYMINUTE=0;BYSECOND=0",
    "RRULE:FREQ=HOURLY;INTERVAL=23;BYHOUR=5", "RRULE:FREQ=MONTHLY;INTERVAL=7;BYMONTHDAY=31;BYDAY=FR",
    "RRULE:FREQ=WEEKLY;INTERVAL=3;BYWEEKNO=1", "RRULE:FREQ=DAILY;INTERVAL=5;BYMONTH=2;BYMONTHDAY=29",
    "RRULE:FREQ=SECONDLY;INTERVAL=7;BYMINUTE=0;BYSECOND=0", "RRULE:FREQ=YEARLY;BYSETPOS=-1;BYDAY=FR;BYMONTH=12",
]


@pytest.mark.parametrize("expr", ACCEPTED)
@pytest.mark.parametrize("zone", ["America/New_York", "Australia/Lord_Howe", "Asia/Manila"])
def test_next_after_on_accepted_rules_stays_within_the_probe_budget(expr, zone):
    rule = parse(expr, zone, anchor=datetime(1970, 1, 1, tzinfo=UTC))
    after = datetime(1970, 1, 1, tzinfo=UTC)
    for k in range(40):
        after += timedelta(days=137 * k + 1, hours=k, minutes=7 * k)
        if after.year > 2400:
            break
        got, units, _ = measure(lambda: rule.next_after(after))
        assert not isinstance(got, ExpressionError), got
        assert units <= budget.PROBE_UNITS, (expr, after, units)


def test_too_expensive_is_an_expression_error_about_the_expression():
    e = TooExpensive("x")
    assert isinstance(e, ExpressionError) and isinstance(e, ValueError)
    assert e.field == "expression" and str(e).startswith("too expensive to evaluate: ")
    assert timeexpr.TooExpensive is TooExpensive


def test_next_after_raises_too_expensive_past_its_per_call_budget(monkeypatch):
    rule = parse("0 0 29 2 */7", "UTC", anchor=ANCHOR)
    monkeypatch.setattr("schedules.timeexpr.rules.NEXT_AFTER_UNITS", 2)
    with pytest.raises(TooExpensive) as exc:
        rule.next_after(datetime(2032, 3, 1, tzinfo=UTC))
    assert "finding the next occurrence" in str(exc.value)


def test_preview_raises_too_expensive_past_its_budget(monkeypatch):
    rule = parse("*/5 * * * *", "UTC", anchor=ANCHOR)
    assert len(preview(rule, ANCHOR, 100)) == 100
    monkeypatch.setattr("schedules.timeexpr.PREVIEW_UNITS", 50)
    with pytest.raises(TooExpensive) as exc:
        preview(rule, ANCHOR, 100)
    assert "previewing" in str(exc.value)


def test_validation_refuses_a_rule_whose_next_occurrence_is_too_dear(monkeypatch):
    monkeypatch.setattr("schedules.timeexpr.parsing.PROBE_UNITS", 3)
    with pytest.raises(TooExpensive) as exc:
        parse("RRULE:FREQ=MONTHLY;INTERVAL=7;BYMONTHDAY=31;BYDAY=FR", "UTC", anchor=ANCHOR)
    assert exc.value.field == "expression" and "finding an occurrence" in str(exc.value)


def test_validation_refuses_a_count_too_dear_to_count():
    got, units, cpu = measure(lambda: parse(
        "DTSTART:19700101T000000\nRRULE:FREQ=SECONDLY;INTERVAL=13;BYSECOND=0,1,2,3,5,8,13,21,34,55;BYMINUTE=0,30;"
        "COUNT=1000000000", "UTC", anchor=ANCHOR))
    assert isinstance(got, TooExpensive), got
    # The step that crosses the limit is counted, then refused before it runs.
    assert units <= budget.VALIDATION_UNITS + 1300 and cpu < 1.0


def test_a_stall_the_rule_did_not_cause_does_not_refuse_it_but_a_runaway_path_is_stopped(monkeypatch):
    # Thread CPU time also counts a full garbage collection of a large heap or a VM's stolen time:
    # such a stall of a few hundred ms in the middle of an ordinary validation refused it in CI.
    # The CPU guard is for paths the units under-charge, and stops one that runs on and on.
    # The guard counts from its first check (the CPU clock is not read on entry).
    clock = {"now": 0.0}
    monkeypatch.setattr(budget.time, "thread_time", lambda: clock["now"])
    with budget.metered("validating the expression", 30_000, budget.VALIDATION_CPU_SECONDS) as m:
        budget.charge(budget._CPU_CHECK_EVERY)  # the first check
        clock["now"] = 0.3  # a stall
        budget.charge(budget._CPU_CHECK_EVERY)
        clock["now"] = 0.3 + budget.VALIDATION_CPU_SECONDS + 0.01  # a path charging almost nothing
        with pytest.raises(TooExpensive) as exc:
            for _ in range(10):
                budget.charge(budget._CPU_CHECK_EVERY)
    assert m.used <= 4 * budget._CPU_CHECK_EVERY
    assert f"more than {budget.VALIDATION_CPU_SECONDS * 1000:.0f} ms of CPU (after" in str(exc.value)
    assert "budget of 30000 work units" not in str(exc.value)


def test_a_full_collection_of_a_large_heap_is_not_charged_to_the_rule():
    # A pytest process late in the suite (and a long-lived scanner) holds millions of objects: a
    # full collection triggered in the middle of a validation cost it over the 500 ms guard in CI
    # and refused FREQ=YEARLY;COUNT=3, which costs a few milliseconds.
    heap = [{"n": i, "of": [i]} for i in range(1_000_000)]
    guard = 0.02
    with budget.metered("validating the expression", 30_000, guard):
        before = time.thread_time()
        gc.collect()
        assert time.thread_time() - before > guard  # the collection alone is over the guard
        budget.charge(budget._CPU_CHECK_EVERY)  # and does not refuse the rule
        # CPU the units did not charge, outside a collection, still does.
        until = time.thread_time() + 2 * guard
        while time.thread_time() < until:
            pass
        with pytest.raises(TooExpensive):
            budget.charge(budget._CPU_CHECK_EVERY)
    del heap


def test_an_evaluation_that_ends_before_a_check_never_reads_the_cpu_clock(monkeypatch):
    # Reading the thread's CPU clock is a system call at which a busy host's scheduler takes the
    # CPU away: every next_after read it on entry, a quarter of a loaded scanner's samples.
    rules = [parse("*/5 * * * *", "Europe/Berlin", anchor=ANCHOR),
             parse("DTSTART:20260101T090000\nRRULE:FREQ=DAILY;BYDAY=MO,WE", "Europe/Berlin", anchor=ANCHOR),
             parse("rate(7 minutes)", "UTC", anchor=ANCHOR)]
    reads = []
    real = budget.time.thread_time
    monkeypatch.setattr(budget.time, "thread_time", lambda: reads.append(1) or real())
    at = datetime(2026, 3, 29, 0, 2, tzinfo=UTC)  # the spring-forward day in Berlin
    assert [r.next_after(at).at for r in rules] == [datetime(2026, 3, 29, 0, 5, tzinfo=UTC),
                                                   datetime(2026, 3, 30, 7, 0, tzinfo=UTC),
                                                   datetime(2026, 3, 29, 0, 6, tzinfo=UTC)]
    assert reads == []
