"""Two activity loops at once (one per `scheduler` or `reconcile` process): a pass reads what it
counts before it takes the cursor, and one that finds the cursor moved meanwhile reads again, so
every attempt is counted exactly once, whichever loop took it, parked ones included."""

from datetime import timedelta

import pytest

from dispatch.activity import ActivityAggregator
from dispatch.models import ALL_TENANTS, ActivityMinute, ActivityPending, RetryCostHour, ScheduleActivity
from runs.models import AttemptOutcome
from tests.dispatch.test_activity import finished_attempt, open_attempt
from tests.helpers import at_once, make_schedule

pytestmark = pytest.mark.django_db(transaction=True)


def loop_until_idle():
    aggregator = ActivityAggregator(batch=7, settle=timedelta(0))  # several passes each, interleaved
    passes = 1
    while aggregator.step():
        passes += 1
    return passes


def test_each_attempt_is_counted_once_by_two_loops_at_once(tenant, target):
    ActivityAggregator(settle=timedelta(0)).step()  # the cursor starts at the attempts' end
    schedules = [make_schedule(tenant, f"{target.url}/s{i}") for i in range(30)]
    for i, s in enumerate(schedules):
        finished_attempt(s, ago=60, outcome=AttemptOutcome.FAILED if i % 3 == 0 else AttemptOutcome.SUCCEEDED,
                         status=500 if i % 3 == 0 else 200)
    still_open = [open_attempt(s, ago=60) for s in schedules[:5]]

    at_once(loop_until_idle)
    assert set(ActivityPending.objects.values_list("attempt_id", flat=True)) == {a.id for a in still_open}

    # The parked ones end; two loops at once count each of them once too.
    for a in still_open:
        a.outcome, a.finished_at, a.http_status, a.latency_ms = AttemptOutcome.SUCCEEDED, a.started_at + timedelta(
            seconds=1), 200, 1000
        a.save()
    at_once(loop_until_idle)

    assert not ActivityPending.objects.exists()
    summaries = {r.schedule_id: (r.succeeded, r.failed) for r in ScheduleActivity.objects.all()}
    expected = {s.id: (0, 1) if i % 3 == 0 else (1, 0) for i, s in enumerate(schedules)}
    for s in schedules[:5]:
        ok, bad = expected[s.id]
        expected[s.id] = (ok + 1, bad)
    assert summaries == expected
    minutes = ActivityMinute.objects.filter(tenant_id=ALL_TENANTS)
    assert (sum(m.succeeded for m in minutes), sum(m.failed for m in minutes)) == (25, 10)
    hours = RetryCostHour.objects.filter(dimension="schedule")
    assert sum(h.attempts for h in hours) == 35
