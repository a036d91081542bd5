"""A partition swap copies what stays while nothing is locked; runs that change meanwhile (a
completion, a claim opening an attempt, a retry by hand) are copied again under the lock. Whatever
happened between the two is in the kept partition afterwards: nothing lost, nothing twice."""

from datetime import timedelta

import pytest

from runs import queue, retention
from runs.actions import retry_run
from runs.models import Attempt, Run
from scheduler_project.foundation.dbclock import db_now
from tests.helpers import ACTOR
from tests.partitions.test_sealed_partitions import backfilled_long_ago
from tests.retention.test_removal import history_violations, present

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.postgresql_only("the swap and its staging exist only on PostgreSQL"),
]


def claimed(run):
    (c,) = [c for c in queue.claim("w-1", 100) if c.run_id == run.id]
    return c


def attempts(run):
    return [(a.generation, a.outcome) for a in Attempt.objects.filter(run_id=run.id).order_by("generation")]


def test_runs_changed_while_the_swap_staged_are_kept_as_they_are_at_the_swap(tenant, target, monkeypatch, tmp_path):
    # All 40 days old, in the kept partition, which the pass rewrites without what has expired.
    gone = backfilled_long_ago(tenant, target)
    queue.complete([queue.Result(claimed=claimed(gone), outcome="succeeded", http_status=200)])
    dead = backfilled_long_ago(tenant, target)  # goes dead now: kept 30 days from now
    queue.complete([queue.Result(claimed=claimed(dead), outcome="failed", http_status=400)])
    leased = backfilled_long_ago(tenant, target)
    leased_claim = claimed(leased)
    ready = backfilled_long_ago(tenant, target)

    def meanwhile(export_dir, group, sources, stage, now):
        # Called between staging and the lock (where the export runs): each run changes.
        if group == "runs":
            queue.complete([queue.Result(claimed=leased_claim, outcome="failed", http_status=400)])  # -> dead
            claimed(ready)  # -> leased, attempt 1 opened in the partition being rewritten
            retry_run(Run.objects.get(id=dead.id), by=ACTOR)  # -> ready
        return []

    monkeypatch.setattr(retention, "export_swap", meanwhile)
    res = retention.run_pass(now=db_now(), export_dir=str(tmp_path), kept_every=timedelta(0))

    assert [s.group for s in res.swaps] == ["runs"]
    assert present(gone, dead, leased, ready) == {gone.id: False, dead.id: True, leased.id: True, ready.id: True}
    assert (Run.objects.get(id=ready.id).state, attempts(ready)) == ("leased", [(1, None)])
    assert (Run.objects.get(id=leased.id).state, attempts(leased)) == ("dead", [(1, "failed")])
    assert (Run.objects.get(id=dead.id).state, attempts(dead)) == ("ready", [(1, "failed")])
    assert history_violations() == []
