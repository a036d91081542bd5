"""Spread through the scanner (issue 28): each occurrence keeps its nominal instant as its identity
and becomes eligible at nominal + the schedule's offset, in [0, spreadSeconds), derived from the
schedule's id alone; the DST rule, misfire and overlap keep their meaning; manual runs are never
spread; the window is bounded below the rule's shortest interval."""

import collections
import json
import os
import subprocess
import sys
from datetime import timedelta

import pytest

from runs import actions, queue
from runs.decisions import plan_schedule
from runs.models import Occurrence, Run, RunKind
from scheduler_project.foundation.dbclock import db_now
from scheduler_project.foundation.errors import ValidationFailed
from schedules import spread, timeexpr
from schedules.models import Schedule
from schedules.spread import shortest_interval, spread_offset, spread_problem
from schedules.tenants import update_tenant_settings
from tests.helpers import ACTOR, make_schedule, utc
from tests.timesched.support import scan_until_idle, unsaved

pytestmark = pytest.mark.django_db

MANY = 2_000  # the check makes 20,000; the suite keeps to a size the shared host runs quickly
WINDOW = 600


def _next_whole_minute_an_hour_ahead():
    at = (db_now() + timedelta(hours=1)).replace(second=0, microsecond=0)
    return at


def _daily_at(tenant, url, minute, count, **fields):
    made = []
    for start in range(0, count, 1000):
        items = [{"expression": f"{minute.minute} {minute.hour} * * *", "time_zone": "UTC",
                  "target_url": url, "spread_seconds": WINDOW, **fields}
                 for _ in range(min(1000, count - start))]
        made += actions.create_schedules(tenant, items, by=ACTOR, now=db_now())
    assert all(isinstance(s, Schedule) for s in made), [s for s in made if not isinstance(s, Schedule)][:3]
    return made


def test_many_daily_schedules_at_one_minute_keep_the_minute_and_start_within_their_window(tenant, target):
    minute = _next_whole_minute_an_hour_ahead()
    made = _daily_at(tenant, target.url + "/d", minute, MANY)
    # allow-overlap schedules are made ahead within the horizon: the minute's runs are made now.
    scan_until_idle(horizon=timedelta(hours=2), batch=1000)
    runs = list(Run.objects.filter(tenant=tenant).values_list("schedule_id", "scheduled_time", "next_eligible_at"))
    # Nothing lost or doubled: one run per schedule, and another pass makes nothing.
    assert len(runs) == MANY and len({r[0] for r in runs}) == MANY
    assert Occurrence.objects.filter(schedule__tenant=tenant).count() == MANY
    again = queue.materialise_due(batch=1000, horizon=timedelta(hours=2))
    assert again.runs == 0 and Run.objects.filter(tenant=tenant).count() == MANY
    slices = collections.Counter()
    offsets = {}
    for sid, nominal, eligible in runs:
        assert nominal == minute  # the identity stays the nominal minute
        offset = (eligible - minute).total_seconds()
        assert 0 <= offset < WINDOW and offset == int(offset)
        offsets[str(sid)] = int(offset)
        slices[int(offset) // 60] += 1
    # Evenly spread: no 60-second slice of the window holds more than twice its share.
    share = MANY / (WINDOW // 60)
    assert len(slices) == WINDOW // 60 and max(slices.values()) <= 2 * share, sorted(slices.items())
    # The offset is the schedule's own, and the version row records it.
    for s in made[:50]:
        assert offsets[str(s.id)] == spread_offset(s.id, WINDOW) == s.current.spread_offset_seconds
    # The same offsets from a fresh process (another hash seed, nothing cached): the offset
    # depends on the schedule's id alone, so every scanner and every restart computes it alike.
    sample = dict(list(offsets.items())[:200])
    code = ("import json, sys; from schedules.spread import spread_offset; "
            "ids = json.load(sys.stdin); print(json.dumps({i: spread_offset(i, %d) for i in ids}))" % WINDOW)
    out = subprocess.run([sys.executable, "-c", code], input=json.dumps(list(sample)), capture_output=True,
                         text=True, check=True, env={**os.environ, "PYTHONHASHSEED": "12345"}, cwd=os.getcwd())
    assert json.loads(out.stdout) == sample


def test_the_runs_due_at_the_minute_become_claimable_only_at_their_eligible_time(tenant, target):
    minute = (db_now() - timedelta(seconds=30)).replace(second=0, microsecond=0)
    s = make_schedule(tenant, target.url + "/d", expression=f"{minute.minute} {minute.hour} * * *", spread_seconds=WINDOW,
                      misfire_grace_seconds=3600)
    Schedule.objects.filter(id=s.id).update(next_run_at=minute)
    scan_until_idle()
    (run,) = Run.objects.filter(schedule=s)
    offset = spread_offset(s.id, WINDOW)
    assert run.scheduled_time == minute and run.next_eligible_at == minute + timedelta(seconds=offset)
    claimed = queue.claim("w1", 10)
    assert bool(claimed) == (run.next_eligible_at <= db_now())


def test_a_dst_gap_occurrence_keeps_its_rule_and_the_offset_is_added_after_it(tenant, target):
    # 02:30 does not exist in New York on 2026-03-08: next_valid makes it 03:00 EDT (07:00Z), as
    # without a spread; the run is then eligible the offset after that instant.
    day_before = utc(2026, 3, 7, 12)
    s = make_schedule(tenant, target.url + "/d", expression="30 2 * * *", tz="America/New_York", now=day_before,
                      end_at=day_before + timedelta(days=1, hours=12), misfire_policy="catch_up",
                      spread_seconds=WINDOW)
    scan_until_idle()
    (run,) = Run.objects.filter(schedule=s)
    assert run.scheduled_time == utc(2026, 3, 8, 7, 0)
    assert run.next_eligible_at == utc(2026, 3, 8, 7, 0) + timedelta(seconds=spread_offset(s.id, WINDOW))
    occ = Occurrence.objects.get(run=run)
    assert occ.local_wall_time == "2026-03-08T02:30:00" and occ.note.startswith("moved: 02:30 does not exist")


def test_a_dst_skip_is_still_a_skipped_run_at_its_nominal_instant(tenant, target):
    day_before = utc(2026, 3, 7, 12)
    s = make_schedule(tenant, target.url + "/d", expression="30 2 * * *", tz="America/New_York", now=day_before,
                      end_at=day_before + timedelta(days=1, hours=12), misfire_policy="catch_up",
                      dst_skipped="skip", spread_seconds=WINDOW)
    scan_until_idle()
    assert list(Run.objects.filter(schedule=s).values_list("scheduled_time", "state", "reason")) == [
        (utc(2026, 3, 8, 7, 0), "skipped", "dst")]


def test_misfire_is_judged_from_the_eligible_time(tenant):
    now = utc(2030, 1, 1, 12)
    nominal = now - timedelta(seconds=300)  # past the 60 s grace from its nominal instant
    for offset, state in ((500, "ready"), (0, "skipped")):
        schedule, version = unsaved("*/5 * * * *", anchor=nominal - timedelta(minutes=10), next_run_at=nominal,
                                    misfire_policy="skip", misfire_grace_seconds=60,
                                    spread_seconds=600 if offset else 0, spread_offset_seconds=offset)
        planned, _, _ = plan_schedule(schedule, version, now, timedelta(0), {})
        # The missed one, then the one due now (on time either way).
        assert [(p.occ.at, p.state) for p in planned] == [(nominal, state), (now, "ready")]
        if offset:
            assert planned[0].eligible_at == nominal + timedelta(seconds=offset)


def test_manual_trigger_is_never_spread(tenant, target):
    s = make_schedule(tenant, target.url + "/d", expression="0 0 * * *", spread_seconds=WINDOW)
    run = actions.trigger_schedule(s, by=ACTOR)
    run.refresh_from_db()
    assert run.kind == RunKind.MANUAL and run.next_eligible_at == run.scheduled_time
    assert run.spread_seconds == 0 and run.eligible_from == run.scheduled_time


def test_editing_the_spread_is_a_versioned_change(tenant, target):
    s = make_schedule(tenant, target.url + "/d", expression="0 0 * * *")
    assert s.current.spread_seconds == 0 and s.current.spread_offset_seconds == 0
    s = actions.edit_schedule(s, expected_version=1, changes={"spread_seconds": 3600}, by=ACTOR)
    assert s.version == 2 and s.current.spread_seconds == 3600
    assert s.current.spread_offset_seconds == spread_offset(s.id, 3600)
    assert s.current.changes == {"spread_seconds": [0, 3600]}


@pytest.mark.parametrize("expression, tz, window, ok", [
    ("rate(5 minutes)", "UTC", 299, True),
    ("rate(5 minutes)", "UTC", 300, False),
    ("0 * * * *", "UTC", 3599, True),
    ("0 * * * *", "UTC", 3600, False),
    ("0 0 * * *", "UTC", 600, True),
    ("0 0,1 * * *", "UTC", 3600, False),  # an hour between 00:00 and 01:00, 23 hours after
    ("30 1 * * *", "America/New_York", 3600, True),
    ("* * * * *", "UTC", 60, False),
    ("0 0 * * *", "UTC", spread.MAX_SPREAD_SECONDS + 1, False),
])
def test_the_window_must_be_below_the_rules_shortest_interval(tenant, target, expression, tz, window, ok):
    try:
        make_schedule(tenant, target.url + "/d", expression=expression, tz=tz, spread_seconds=window)
        assert ok
    except ValidationFailed as e:
        assert not ok and "spreadSeconds" in e.errors, e.errors


def test_the_bound_sees_a_dst_repeat_an_hour_apart():
    now = utc(2026, 6, 1)
    both = timeexpr.parse("30 1 * * *", "America/New_York", anchor=now, dst_policy=timeexpr.DstPolicy("next_valid", "both"))
    # Twice on the fall-back day, an hour apart (months after `now`: the year's look-ahead finds it).
    assert shortest_interval(both, after=now) == timedelta(hours=1)
    assert spread_problem(3600, both, after=now) and spread_problem(3599, both, after=now) is None
    at = timeexpr.parse("at(2031-01-01T00:00:00)", "UTC", anchor=now)
    assert shortest_interval(at, after=now) is None and spread_problem(86_400, at, after=now) is None


def test_the_tenants_default_applies_to_new_schedules_that_fit_it(tenant, target):
    update_tenant_settings(tenant, default_spread_seconds="600", by=ACTOR)
    tenant.refresh_from_db()
    daily = make_schedule(tenant, target.url + "/d", expression="0 0 * * *")
    assert daily.current.spread_seconds == 600
    # A default the client never sent never refuses its request: a rule it does not fit gets none.
    minutely = make_schedule(tenant, target.url + "/d", expression="* * * * *")
    assert minutely.current.spread_seconds == 0
    given = make_schedule(tenant, target.url + "/d", expression="0 0 * * *", spread_seconds=0)
    assert given.current.spread_seconds == 0
    with pytest.raises(ValidationFailed):
        update_tenant_settings(tenant, default_spread_seconds="-5", by=ACTOR)
