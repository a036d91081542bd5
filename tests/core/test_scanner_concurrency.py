"""Two scanners at once over the same due schedules: exactly one run per occurrence."""

import pytest

from dispatch.loops import drain, scan_step
from runs.models import Occurrence, OutboxEvent, Run
from scheduler_project.foundation.dbclock import db_now
from schedules.models import Schedule
from tests.helpers import at_once, make_schedule

pytestmark = pytest.mark.django_db(transaction=True)


def test_two_scanners_make_exactly_one_run_per_occurrence(tenant, target):
    schedules = [make_schedule(tenant, target.url + f"/s{i}") for i in range(500)]
    # Every schedule due now, with three occurrences in the last three minutes (inside the grace
    # of 60 s only the newest is on time; run_once keeps the latest missed one too).
    now = db_now().replace(microsecond=0)
    from datetime import timedelta

    Schedule.objects.filter(id__in=[s.id for s in schedules]).update(
        next_run_at=now - timedelta(minutes=2), anchor_at=now - timedelta(minutes=3)
    )
    at_once(lambda: drain(scan_step, batch=50))
    per_schedule = {}
    for sid, t in Run.objects.values_list("schedule_id", "scheduled_time"):
        per_schedule.setdefault(sid, []).append(t)
    assert len(per_schedule) == 500
    for times in per_schedule.values():
        assert len(times) == len(set(times)) == 3  # minus 2, minus 1, now: no duplicates, none lost
    assert Occurrence.objects.count() == Run.objects.count() == 1500
    assert OutboxEvent.objects.filter(kind__in=["run.created", "run.skipped"]).count() == 1500
    # And a third pass finds nothing new.
    drain(scan_step)
    assert Run.objects.count() == 1500
