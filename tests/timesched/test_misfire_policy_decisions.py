"""What the scanner decides for missed occurrences, table-tested at chosen instants through
runs.queue.plan_schedule (pure apart from the rule lookup, so no database and no clock)."""

from datetime import timedelta

import pytest

from runs import decisions, queue
from tests.helpers import utc
from tests.timesched.support import unsaved

NOW = utc(2026, 6, 1, 12, 0, 0)
FIFTEEN = timedelta(minutes=15)
# An every-15-minutes schedule whose scanner was away 3h05m: 13 occurrences, the last 5 min ago.
OUTAGE_START = NOW - timedelta(hours=3, minutes=5)
MISSED = [OUTAGE_START + k * FIFTEEN for k in range(13)]


def plan(schedule, version, now=NOW, horizon=timedelta(0), active=None):
    planned, next_at, completed = queue.plan_schedule(schedule, version, now, horizon, active or {})
    return [(p.occ.at, p.state, p.reason) for p in planned], next_at, completed


def outage(policy, **fields):
    return unsaved("rate(15 minutes)", anchor=OUTAGE_START, misfire_policy=policy, **fields)


@pytest.mark.parametrize(
    "policy, limit, runs",
    [
        ("skip", 10, []),
        ("run_once", 10, MISSED[-1:]),
        ("catch_up", 10, MISSED[-10:]),
        ("catch_up", 20, MISSED),
        ("catch_up", 0, []),
    ],
)
def test_each_policy_keeps_the_specified_missed_occurrences_and_skips_the_rest(policy, limit, runs):
    planned, next_at, completed = plan(*outage(policy, catchup_limit=limit))
    assert [p[0] for p in planned] == MISSED  # every missed occurrence is recorded, none dropped
    assert [p[0] for p in planned if p[1] == "ready"] == runs
    assert all(p[1:] == ("skipped", "misfire") for p in planned if p[0] not in runs)
    assert next_at == MISSED[-1] + FIFTEEN and not completed


def test_kept_missed_runs_are_eligible_at_their_own_instants_so_they_are_claimed_oldest_first():
    planned, _, _ = queue.plan_schedule(*outage("catch_up"), NOW, timedelta(0), {})
    ready = [p for p in planned if p.state == "ready"]
    assert [p.eligible_at for p in ready] == [p.occ.at for p in ready] == sorted(p.occ.at for p in ready)


@pytest.mark.parametrize("policy", ["skip", "run_once", "catch_up"])
def test_an_occurrence_within_the_grace_is_on_time_and_runs_under_every_policy(policy):
    # The occurrence 30 s ago is inside the 60 s grace: not missed, so no policy touches it.
    schedule, version = unsaved("rate(15 minutes)", anchor=NOW - timedelta(hours=3, seconds=30), misfire_policy=policy)
    planned, _, _ = plan(schedule, version)
    on_time = NOW - timedelta(seconds=30)
    assert planned[-1] == (on_time, "ready", "")
    missed_ready = [p[0] for p in planned[:-1] if p[1] == "ready"]
    assert len(missed_ready) == {"skip": 0, "run_once": 1, "catch_up": 10}[policy]


def test_a_longer_grace_makes_a_late_occurrence_on_time():
    planned, _, _ = plan(*outage("skip", misfire_grace_seconds=600))
    assert [p for p in planned if p[1] == "ready"] == [(MISSED[-1], "ready", "")]


@pytest.mark.parametrize("policy, limit, runs", [("run_once", 10, MISSED[-1:]), ("catch_up", 10, MISSED[-10:]),
                                                 ("catch_up", 4, MISSED[-4:]), ("skip", 10, [])])
def test_an_outage_worked_off_over_several_passes_keeps_the_latest_of_the_whole_outage(monkeypatch, policy, limit, runs):
    # A pass makes at most MAX_OCCURRENCES_PER_PASS occurrences; what the early, cut-short passes
    # keep must still be the latest of the whole outage, not of each chunk.
    monkeypatch.setattr(decisions, "MAX_OCCURRENCES_PER_PASS", 5)
    schedule, version = outage(policy, catchup_limit=limit)
    seen = []
    for _ in range(10):
        planned, next_at, _ = plan(schedule, version)
        seen += planned
        schedule.next_run_at = next_at
        if next_at > NOW:
            break
    assert [p[0] for p in seen] == MISSED
    assert [p[0] for p in seen if p[1] == "ready"] == runs


def test_nothing_is_due_again_once_the_outage_is_worked_off():
    schedule, version = outage("catch_up")
    _, next_at, _ = plan(schedule, version)
    schedule.next_run_at = next_at
    assert plan(schedule, version, now=NOW + timedelta(minutes=9)) == ([], next_at, False)
