"""A 3-hour scanner outage for an every-15-minutes schedule, through the real scanner
(materialise_due on the database clock): the specified runs and skip records, and nothing more
once the scanner has caught up."""

from datetime import timedelta

import pytest

from runs.models import Occurrence, OutboxEvent, Run
from runs.queue import materialise_due
from schedules.models import Schedule
from tests.timesched.support import every_15_minutes_after_outage, scan_until_idle, states

pytestmark = pytest.mark.django_db

FIFTEEN = timedelta(minutes=15)


@pytest.mark.parametrize(
    "policy, ready, skipped",
    [("skip", 0, 13), ("run_once", 1, 12), ("catch_up", 10, 3)],
)
def test_each_policy_gives_the_specified_runs_and_skip_records(tenant, target, policy, ready, skipped):
    schedule = every_15_minutes_after_outage(tenant, target.url + "/r", misfire_policy=policy)
    start = schedule.next_run_at

    result = scan_until_idle()

    rows = states(schedule)
    assert [r[0] for r in rows] == [start + k * FIFTEEN for k in range(13)]
    # The kept ones are the most recent; every other one is a skipped run saying why.
    assert [r[1:] for r in rows] == [("skipped", "misfire")] * skipped + [("ready", "")] * ready
    assert (result.runs, result.skipped) == (ready, skipped)
    assert OutboxEvent.objects.filter(kind="run.skipped", payload__reason="misfire").count() == skipped
    assert OutboxEvent.objects.filter(kind="run.created").count() == ready
    schedule.refresh_from_db()
    assert schedule.next_run_at == start + 13 * FIFTEEN  # the next future occurrence

    # Caught up: further passes make nothing, and the occurrence rows match the runs one to one.
    assert materialise_due(batch=500).schedules == 0
    assert Run.objects.count() == Occurrence.objects.count() == 13


def test_run_once_after_the_outage_still_runs_an_occurrence_that_is_on_time(tenant, target):
    schedule = every_15_minutes_after_outage(tenant, target.url + "/r", outage=timedelta(hours=3, seconds=20))
    scan_until_idle()
    rows = states(schedule)
    # 12 missed (11 skipped, the latest runs) plus the one 20 s old, inside the 60 s grace.
    assert [r[1] for r in rows] == ["skipped"] * 11 + ["ready", "ready"]


def test_a_long_outage_worked_off_over_several_passes_keeps_one_run_under_run_once(tenant, target, monkeypatch):
    from runs import decisions

    monkeypatch.setattr(decisions, "MAX_OCCURRENCES_PER_PASS", 4)
    schedule = every_15_minutes_after_outage(tenant, target.url + "/r")
    passes = 0
    while materialise_due(batch=500).schedules:
        passes += 1
    assert passes == 4  # 13 occurrences, 4 per pass
    rows = states(schedule)
    assert len(rows) == 13 and [r[1] for r in rows].count("ready") == 1 and rows[-1][1] == "ready"
    assert Schedule.objects.get(id=schedule.id).next_run_at > rows[-1][0]
