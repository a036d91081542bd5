"""The `maintain` loop survives its database session being terminated in the middle of a removal
(a database restart, a failover, pg_terminate_backend): the half-done swap is rolled back with the
session, the advisory lock that lets one copy work goes with it, and the next step does the whole
removal once, with one audit entry, losing nothing that had to stay."""

from datetime import timedelta

import pytest

from dispatch.maintenance import Maintenance
from runs import queue, retention
from runs.models import HistoryRemoval, Run
from tests.dispatch.test_loops_survive_failures import TerminateMidStep, running, wait_for
from tests.partitions.test_sealed_partitions import backfilled_long_ago
from tests.retention.test_removal import history_violations, present

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgresql_only("terminates the loop's PostgreSQL session with pg_terminate_backend"),
]


def claimed(run):
    (c,) = [c for c in queue.claim("w-1", 100) if c.run_id == run.id]
    return c


@pytest.fixture(autouse=True)
def quick_loops(settings, monkeypatch):
    from dispatch import loops

    settings.SCHEDULER_MAINTENANCE_SECONDS = 0.1
    # Every pass may rewrite the kept partition (not once a day), so the removal is due at once.
    monkeypatch.setattr(retention, "due_partitions",
                        lambda now, p=None, kept_every=None, f=retention.due_partitions: f(now, p, kept_every=timedelta(0)))
    monkeypatch.setattr(loops, "FAILURE_BACKOFF_FIRST", 0.05)


@pytest.mark.parametrize("where", ["audit", "count_survivors"])
def test_a_maintain_step_whose_session_is_terminated_mid_removal_removes_it_once_on_the_next_step(
        tenant, target, monkeypatch, where):
    # "audit": inside the swap's transaction, with the tables locked and the new kept partition
    # filled; "count_survivors": before the swap, holding only the advisory lock.
    gone = backfilled_long_ago(tenant, target)  # 40 days old: succeeded, past the 14 days kept
    queue.complete([queue.Result(claimed=claimed(gone), outcome="succeeded", http_status=200)])
    dead = backfilled_long_ago(tenant, target)  # went dead now: kept 30 days from now
    queue.complete([queue.Result(claimed=claimed(dead), outcome="failed", http_status=400)])
    ready = backfilled_long_ago(tenant, target)
    cut = TerminateMidStep(getattr(retention, where))
    monkeypatch.setattr(retention, where, cut)

    with running(Maintenance()):
        wait_for(lambda: not Run.objects.filter(id=gone.id).exists(), timeout=30, what="the removal")

    assert cut.terminated == 1
    assert present(gone, dead, ready) == {gone.id: False, dead.id: True, ready.id: True}
    assert HistoryRemoval.objects.filter(what__startswith="runs_run").count() == 1
    assert history_violations() == []
