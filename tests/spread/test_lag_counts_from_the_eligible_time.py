"""Lag counts from when a run became eligible (issue 28): a spread run that starts as soon as its
offset has passed shows no lag for the offset, in the dashboard's and /metrics' percentiles
(runs.stats) and in the activity histogram (dispatch.activity)."""

from datetime import timedelta

import pytest

from dispatch.activity import ActivityAggregator, drain, lag_bucket
from dispatch.models import LAG_BOUNDS, ActivityMinute
from runs import queue
from runs.models import Attempt, Run
from runs.stats import lag_samples
from scheduler_project.foundation.dbclock import db_now
from schedules.models import Schedule
from schedules.spread import spread_offset
from tests.helpers import make_schedule
from tests.timesched.support import scan_until_idle

pytestmark = pytest.mark.django_db

WINDOW = 3600


def _claimed_spread_run(tenant, target):
    """A scheduled run whose offset is at least ten minutes, eligible a few seconds ago, claimed."""
    for _ in range(50):
        s = make_schedule(tenant, target.url + "/d", expression="rate(1 day)", spread_seconds=WINDOW,
                          misfire_grace_seconds=7200)
        offset = spread_offset(s.id, WINDOW)
        if offset >= 600:
            break
        Schedule.objects.filter(id=s.id).update(enabled=False, next_run_at=None)
    # rate() counts from its anchor: the occurrence is placed `offset` + 5 s ago.
    nominal = (db_now() - timedelta(seconds=offset + 5)).replace(microsecond=0)
    Schedule.objects.filter(id=s.id).update(anchor_at=nominal, next_run_at=nominal)
    scan_until_idle()
    run = Run.objects.get(schedule=s)
    assert run.scheduled_time == nominal and run.next_eligible_at == nominal + timedelta(seconds=offset)
    assert [c.run_id for c in queue.claim("w:1", 10)] == [run.id]
    return run, offset


def test_the_percentiles_leave_the_offset_out(tenant, target):
    run, offset = _claimed_spread_run(tenant, target)
    lags = lag_samples(tenant_ids=[tenant.id]).lags
    assert len(lags) == 1
    # Started within a minute and a bit of its eligible time, though `offset` after its nominal one.
    assert lags[0] < 90 <= offset


def test_the_activity_histogram_leaves_the_offset_out(tenant, target):
    run, offset = _claimed_spread_run(tenant, target)
    Attempt.objects.filter(run_id=run.id).update(finished_at=db_now(), outcome="succeeded", http_status=200,
                                                 latency_ms=5)
    drain(ActivityAggregator(settle=timedelta(0)))
    counts = [0] * (len(LAG_BOUNDS) + 1)
    for row in ActivityMinute.objects.filter(tenant_id=tenant.id):
        counts = [a + b for a, b in zip(counts, row.lag_counts or [0] * len(counts))]
    assert sum(counts) == 1
    started = Attempt.objects.get(run_id=run.id).started_at
    lag = (started - run.scheduled_time).total_seconds() - offset
    assert counts[lag_bucket(max(0.0, lag))] == 1 and lag_bucket(lag) != lag_bucket(lag + offset)
