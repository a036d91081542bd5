"""Two incident loops at once (one per `scheduler` or `reconcile` process): a pass reads its facts
before it takes the cursor, and one that finds the cursor moved meanwhile reads again, so every
event is evaluated exactly once, whichever loop took it."""

import pytest

from dispatch import incidents
from dispatch.loops import drain, scan_step
from dispatch.models import FailureStreak
from runs import queue
from tests.helpers import at_once, make_due, make_schedule

pytestmark = pytest.mark.django_db(transaction=True)


def test_each_failure_is_counted_once_by_two_loops_at_once(tenant, target, settings):
    settings.SCHEDULER_INCIDENT_SETTLE_SECONDS = 0
    incidents.IncidentEvaluator().step(probe=False)  # the cursor starts at the outbox's end
    schedules = [make_schedule(tenant, f"{target.url}/f{i}") for i in range(30)]
    for s in schedules:
        make_due(s)
    drain(scan_step)
    claimed = queue.claim("w-1", 100)
    assert len(claimed) == 30
    queue.complete([queue.Result(claimed=c, outcome="failed", http_status=500) for c in claimed])

    def one_loop():
        evaluator = incidents.IncidentEvaluator(batch=7)  # several passes each, interleaved
        passes = 1
        while evaluator.step(probe=False):
            passes += 1
        return passes

    at_once(one_loop)
    streaks = dict(FailureStreak.objects.values_list("schedule_id", "failures"))
    assert streaks == {s.id: 1 for s in schedules}  # counted once each: not twice, none missed
