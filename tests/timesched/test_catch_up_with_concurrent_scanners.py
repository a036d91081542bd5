"""Several scanners working off the same outage at once: one run (or skip record) per
occurrence, and the policy's counts exactly, whoever made them."""

import pytest

from dispatch.loops import drain, scan_step
from runs.models import Occurrence, Run
from tests.helpers import at_once
from tests.timesched.support import every_15_minutes_after_outage

pytestmark = pytest.mark.django_db(transaction=True)


def test_concurrent_scanners_during_catch_up_make_one_run_per_occurrence(tenant, target):
    policies = ["catch_up", "run_once", "skip"]
    schedules = [every_15_minutes_after_outage(tenant, target.url + f"/c{i}", misfire_policy=policies[i % 3])
                 for i in range(150)]
    at_once(lambda: drain(scan_step, batch=7), 4)
    drain(scan_step)  # whatever a thread left when its batch came back short
    expected_ready = {"catch_up": 10, "run_once": 1, "skip": 0}
    for s in schedules:
        rows = list(Run.objects.filter(schedule=s).values_list("scheduled_time", "state"))
        assert len(rows) == len({t for t, _ in rows}) == 13
        assert sum(state == "ready" for _, state in rows) == expected_ready[s.current.misfire_policy]
    assert Occurrence.objects.count() == Run.objects.count() == 150 * 13
