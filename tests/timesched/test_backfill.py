"""Backfill [from, to): every occurrence once, never a duplicate, bounded with a clear refusal."""

from datetime import timedelta

import pytest

from runs.actions import backfill_schedule, plan_backfill
from runs.models import Occurrence, Run
from scheduler_project.foundation.dbclock import db_now
from scheduler_project.foundation.errors import ValidationFailed
from schedules.models import Schedule
from tests.helpers import ACTOR, make_schedule, utc
from tests.timesched.support import scan_until_idle

pytestmark = pytest.mark.django_db


def hourly(tenant, target, **fields):
    return make_schedule(tenant, target.url + "/bf", expression="0 * * * *", now=utc(2026, 1, 1), **fields)


def test_backfill_makes_each_occurrence_of_the_range_once_and_a_second_backfill_makes_none(tenant, target):
    schedule = hourly(tenant, target)
    assert backfill_schedule(schedule, start=utc(2026, 2, 1, 0), end=utc(2026, 2, 1, 6), by=ACTOR) == 6
    times = sorted(Run.objects.filter(schedule=schedule).values_list("scheduled_time", flat=True))
    assert times == [utc(2026, 2, 1, h) for h in range(6)]  # [from, to): 06:00 excluded
    assert set(Run.objects.values_list("kind", "state")) == {("backfill", "ready")}
    assert backfill_schedule(schedule, start=utc(2026, 2, 1, 0), end=utc(2026, 2, 1, 6), by=ACTOR) == 0
    # An overlapping range makes only what is new.
    assert backfill_schedule(schedule, start=utc(2026, 2, 1, 4), end=utc(2026, 2, 1, 9), by=ACTOR) == 3
    assert Run.objects.count() == Occurrence.objects.count() == 9


def test_backfill_skips_instants_the_scanner_already_made(tenant, target):
    schedule = make_schedule(tenant, target.url + "/bf", expression="rate(1 minute)", misfire_policy="catch_up")
    start = (db_now() - timedelta(minutes=5)).replace(microsecond=0)
    Schedule.objects.filter(id=schedule.id).update(anchor_at=start, next_run_at=start)
    scan_until_idle()
    made_by_scanner = Run.objects.count()
    schedule.refresh_from_db()
    assert backfill_schedule(schedule, start=start, end=db_now(), by=ACTOR) == 0
    assert Run.objects.count() == made_by_scanner


def test_backfill_over_the_limit_is_refused_with_a_clear_error_and_stores_nothing(tenant, target, settings):
    settings.SCHEDULER_MAX_BACKFILL = 24
    schedule = hourly(tenant, target)
    with pytest.raises(ValidationFailed) as e:
        backfill_schedule(schedule, start=utc(2026, 2, 1), end=utc(2026, 2, 2, 1), by=ACTOR)
    assert "more than 24 occurrences" in e.value.errors["to"][0]
    assert not Run.objects.exists() and not Occurrence.objects.exists()
    assert backfill_schedule(schedule, start=utc(2026, 2, 1), end=utc(2026, 2, 2), by=ACTOR) == 24


def test_an_empty_or_reversed_range_is_refused(tenant, target):
    schedule = hourly(tenant, target)
    with pytest.raises(ValidationFailed):
        plan_backfill(schedule, utc(2026, 2, 2), utc(2026, 2, 1))


def test_backfill_keeps_to_the_schedules_bounds_and_to_the_past(tenant, target):
    schedule = hourly(tenant, target, start_at=utc(2026, 2, 1, 3), end_at=utc(2026, 2, 1, 5))
    todo, total = plan_backfill(schedule, utc(2026, 2, 1), utc(2026, 2, 2))
    assert [o.at for o in todo] == [utc(2026, 2, 1, 3), utc(2026, 2, 1, 4)] and total == 2
    open_ended = hourly(tenant, target)
    future = db_now() + timedelta(days=1)
    todo, _ = plan_backfill(open_ended, future - timedelta(days=2), future)
    assert todo and max(o.at for o in todo) <= db_now()
