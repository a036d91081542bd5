"""Rules the forecast cannot count by arithmetic (RRULEs whose days differ) are walked one occurrence
at a time, the costly part of a forecast. Tens of distinct every-minute RRULEs walked for a week kept
the portal's forecast page past gunicorn's worker timeout (found by bench/soak.py); one forecast now
walks at most WALK_BUDGET occurrences over all its rules and reports the rules it counted only in
part. An RRULE that repeats within a day is walked for one period only, so it stays exact under a
budget the week would not fit."""

import pytest

from dispatch import forecast as fc
from dispatch import forecast_counts as fcounts
from runs import actions
from scheduler_project.foundation.dbclock import db_now
from tests.helpers import ACTOR

pytestmark = pytest.mark.django_db

RULES = 6


def test_one_forecast_walks_at_most_its_budget_and_says_which_rules_it_cut(tenant, target, monkeypatch):
    # Every month day listed: every minute in fact, but a month-day filter is walked (days may differ).
    every_day = ",".join(str(d) for d in range(1, 32))
    items = [{"expression": f"RRULE:FREQ=MINUTELY;BYSECOND={s};BYMONTHDAY={every_day}", "time_zone": "UTC",
              "target_url": target.url + "/w"} for s in range(RULES)]
    actions.create_schedules(tenant, items, by=ACTOR, now=db_now())
    walked = []
    real_walk = fcounts.walk

    def counting_walk(rule, lo, hi, limit=fcounts.RULE_OCCURRENCES):
        out, cut = real_walk(rule, lo, hi, limit)
        walked.append(len(out))
        return out, cut

    monkeypatch.setattr(fcounts, "walk", counting_walk)
    monkeypatch.setattr(fc, "WALK_BUDGET", 5_000)
    f = fc.forecast(tenant_ids=[tenant.id])
    # A week of an every-minute rule is 10,080 occurrences: the first rule uses the budget up.
    assert sum(walked) <= 5_000
    assert f.truncated_rules == RULES
    # What was walked is counted: the first hour is whole for the rule walked first.
    assert sum(b.due for b in f.tiers["hour"]) >= 59

    monkeypatch.setattr(fc, "WALK_BUDGET", 10_080 * RULES + 1)
    walked.clear()
    whole = fc.forecast(tenant_ids=[tenant.id])
    # With room for all, every rule is walked for the whole week (the week starts at now, not on a
    # minute, so a rule may have one occurrence fewer than 10,080).
    assert whole.truncated_rules == 0 and sum(walked) >= (10_080 - 1) * RULES


def test_rules_that_repeat_within_a_day_are_counted_whole_under_a_small_budget(tenant, target, monkeypatch):
    items = [{"expression": f"RRULE:FREQ=MINUTELY;BYSECOND={s}", "time_zone": "UTC", "target_url": target.url + "/p"}
             for s in range(RULES)]
    actions.create_schedules(tenant, items, by=ACTOR, now=db_now())
    monkeypatch.setattr(fc, "WALK_BUDGET", 5_000)
    f = fc.forecast(tenant_ids=[tenant.id])
    assert f.truncated_rules == 0 and f.exact
    # Each rule fires once a minute: the week holds about 10,080 of each (the first minute may
    # hold its instant before or after now).
    week = sum(b.due for b in f.tiers["week"])
    assert (10_080 - 1) * RULES <= week <= 10_080 * RULES
