"""The retry-cost figures (dispatch.retry_cost) agree with the attempts the API lists for the same
runs: per schedule, per owner and per target host, before the activity loop has counted them (the
uncounted tail) and after (the hourly rows), never counting an attempt twice."""

from collections import Counter
from datetime import datetime, timedelta

import pytest

from dispatch import retry_cost
from dispatch.activity import ActivityAggregator
from dispatch.activity import drain as drain_activity
from dispatch.loops import drain, scan_step
from dispatch.models import CostDimension, RetryCostHour
from dispatch.worker import run_worker
from runs.models import Run, RunState
from scheduler_project.foundation.dbclock import db_now
from schedules.models import Schedule
from schedules.owners import create_owner
from tests.helpers import ACTOR, make_due, make_schedule

pytestmark = pytest.mark.django_db(transaction=True)

COUNT_NOW = ActivityAggregator(settle=timedelta(0))


def _t(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


class Jobs:
    """Runs of real schedules through a real worker against a local target that fails each run's
    first `fails[path]` calls."""

    def __init__(self, tenant, target):
        self.tenant, self.target = tenant, target
        self.fails: dict = {}
        self.calls: Counter = Counter()
        self.instants = 0

        def respond(d):
            path, run = d["path"], d["headers"].get("Idempotency-Key")
            self.calls[run] += 1
            return (500, b"{}") if self.calls[run] <= self.fails.get(path, 0) else (200, b"{}")

        target.responder = respond

    def schedule(self, path, owner=None, **fields):
        s = make_schedule(self.tenant, self.target.url + path, name=path.strip("/"), **fields)
        Schedule.objects.filter(id=s.id).update(owner=owner)
        return s

    def run(self, s, *, fails: int):
        self.fails[s.current.target_url.removeprefix(self.target.url)] = fails
        self.instants += 1
        make_due(s, db_now() - timedelta(seconds=30) + timedelta(seconds=self.instants))
        drain(scan_step)
        while Run.objects.filter(schedule=s, state__in=[RunState.READY, RunState.LEASED]).exists():
            # Retries waiting for their backoff are made due at once.
            Run.objects.filter(state=RunState.READY, generation__gt=0).update(
                next_eligible_at=db_now() - timedelta(seconds=1))
            run_worker("w-test", once=True, poll_seconds=0)


def expected(api, schedule_ids) -> dict:
    """The figures worked out from the attempts GET /api/v1/runs lists for the schedules."""
    attempts = successes = retries = retried_runs = failed = 0
    failed_s = backoff_s = 0.0
    for sid in schedule_ids:
        runs = api.get("/api/v1/runs", {"schedule": str(sid), "limit": 200}).json()["results"]
        for run in runs:
            listed = sorted(run["attempts"], key=lambda a: a["generation"])
            for i, a in enumerate(listed):
                attempts += 1
                if a["outcome"] == "succeeded":
                    successes += 1
                else:
                    failed += 1
                    failed_s += (_t(a["finishedAt"]) - _t(a["startedAt"])).total_seconds()
                if i > 0:
                    retries += 1
                    backoff_s += (_t(a["startedAt"]) - _t(listed[i - 1]["finishedAt"])).total_seconds()
            retried_runs += len(listed) > 1
    runs_n = attempts - retries
    return {"attempts": attempts, "successes": successes, "runs": runs_n, "retries": retries,
            "retriedRuns": retried_runs, "failedAttempts": failed,
            "attemptsPerSuccess": round(attempts / successes, 6) if successes else None,
            "retryShare": round(retried_runs / runs_n, 6) if runs_n else None,
            "failedSeconds": round(failed_s, 6), "backoffSeconds": round(backoff_s, 6)}


def figures(row: dict) -> dict:
    keys = ("attempts", "successes", "runs", "retries", "retriedRuns", "failedAttempts", "attemptsPerSuccess",
            "retryShare", "failedSeconds", "backoffSeconds")
    return {k: row[k] for k in keys}


@pytest.fixture
def jobs(tenant, target):
    return Jobs(tenant, target)


@pytest.fixture
def world(jobs, tenant):
    billing = create_owner(tenant, {"slug": "billing", "name": "Billing"}, by=ACTOR)
    ops = create_owner(tenant, {"slug": "ops", "name": "Ops"}, by=ACTOR)
    flaky = jobs.schedule("/flaky", billing, max_attempts=3)
    steady = jobs.schedule("/steady", ops)
    worse = jobs.schedule("/worse", billing, max_attempts=3)
    jobs.run(flaky, fails=2)  # two failures, then a success: 3 attempts
    jobs.run(flaky, fails=0)
    jobs.run(flaky, fails=1)
    jobs.run(steady, fails=0)
    jobs.run(steady, fails=0)
    jobs.run(worse, fails=5)  # dead after 3 attempts
    jobs.run(worse, fails=2)
    return {"billing": billing, "ops": ops, "flaky": flaky, "steady": steady, "worse": worse}


def check_everything(api, world):
    flaky, steady, worse = world["flaky"], world["steady"], world["worse"]
    for window in ("24h", "7d"):
        for s in (flaky, steady, worse):
            got = api.get(f"/api/v1/schedules/{s.id}/retry-cost").json()[window]
            assert got["complete"] is True
            assert figures(got) == expected(api, [s.id]), (s.name, window)

        page = api.get("/api/v1/retry-cost", {"window": window, "by": "schedule"}).json()
        rows = {r["key"]: r for r in page["results"]}
        # Most retries first.
        assert [r["retries"] for r in page["results"]] == sorted((r["retries"] for r in page["results"]), reverse=True)
        assert page["results"][-1]["name"] == "steady" and len(rows) == 3
        for s in (flaky, steady, worse):
            assert figures(rows[str(s.id)]) == expected(api, [s.id])

        by_owner = {r["owner"]: r for r in
                    api.get("/api/v1/retry-cost", {"window": window, "by": "owner"}).json()["results"]}
        assert figures(by_owner["billing"]) == expected(api, [flaky.id, worse.id])
        assert figures(by_owner["ops"]) == expected(api, [steady.id])
        assert list(by_owner) == ["billing", "ops"]
        owner = api.get("/api/v1/owners/billing/retry-cost").json()[window]
        assert figures(owner) == expected(api, [flaky.id, worse.id])

        (host,) = api.get("/api/v1/retry-cost", {"window": window, "by": "target"}).json()["results"]
        assert host["targetHost"] == flaky.current.target_url.split("/")[2]
        assert figures(host) == expected(api, [flaky.id, steady.id, worse.id])


def test_the_figures_agree_with_the_attempts_the_api_lists_before_and_after_the_activity_loop_counts_them(
        api, world):
    ex = expected(api, [world["flaky"].id])
    assert (ex["attempts"], ex["successes"], ex["retries"], ex["retriedRuns"], ex["runs"]) == (6, 3, 3, 2, 3)
    assert ex["backoffSeconds"] > 0 and ex["failedSeconds"] > 0

    assert not RetryCostHour.objects.exists()
    check_everything(api, world)  # nothing counted yet: all from the uncounted tail

    drain_activity(COUNT_NOW)
    assert RetryCostHour.objects.filter(dimension=CostDimension.SCHEDULE).count() >= 3
    check_everything(api, world)  # all from the hourly rows
    drain_activity(COUNT_NOW)  # a second pass adds nothing
    check_everything(api, world)


def test_half_counted_figures_are_neither_short_nor_double(api, jobs, world):
    drain_activity(COUNT_NOW)
    jobs.run(world["flaky"], fails=2)  # after the watermark: in the tail only
    check_everything(api, world)
    drain_activity(COUNT_NOW)
    check_everything(api, world)


def test_a_schedule_without_attempts_costs_nothing_and_other_tenants_are_not_seen(api, other_api, jobs, world):
    quiet = jobs.schedule("/quiet")
    got = api.get(f"/api/v1/schedules/{quiet.id}/retry-cost").json()["7d"]
    assert (got["attempts"], got["attemptsPerSuccess"], got["retryShare"], got["backoffSeconds"]) == (0, None, None, 0)
    assert other_api.get("/api/v1/retry-cost").json()["results"] == []
    assert other_api.get(f"/api/v1/schedules/{world['flaky'].id}/retry-cost").status_code == 404


def test_bad_parameters_are_refused_with_the_field_named(api, world):
    for params, field in (({"window": "1h"}, "window"), ({"by": "tenant"}, "by"), ({"limit": "0"}, "limit"),
                          ({"limit": "x"}, "limit"), ({"limit": "501"}, "limit")):
        resp = api.get("/api/v1/retry-cost", params)
        assert resp.status_code == 400 and field in str(resp.json()), params
    assert api.get("/api/v1/owners/nobody/retry-cost").status_code == 404


def test_the_limit_keeps_the_costliest(api, world):
    drain_activity(COUNT_NOW)
    (row,) = api.get("/api/v1/retry-cost", {"by": "schedule", "limit": 1}).json()["results"]
    assert row["name"] == "worse"


def test_a_manual_retry_from_the_dead_letter_queue_is_a_retry_but_its_wait_is_not_backoff():
    t0 = datetime(2026, 1, 1, 12, 0, 0).astimezone()
    earlier = {1: ("failed", t0)}
    assert retry_cost.classify(2, t0 + timedelta(seconds=3), earlier, None) == (True, True, 3_000_000)
    assert retry_cost.classify(2, t0 + timedelta(hours=3), earlier, t0 + timedelta(hours=2)) == (True, True, 0)
    assert retry_cost.classify(2, t0, {1: ("abandoned", t0)}, None) == (False, False, 0)
    assert retry_cost.classify(3, t0 + timedelta(seconds=1), {1: ("failed", t0), 2: ("failed", t0)}, None) == (
        True, False, 1_000_000)
