"""The dispatch statements plan only the partitions that can hold a ready or leased run: quiet
old partitions are sealed, and a sealed partition unseals itself the moment one of its runs is
made ready again (a manual retry, a backfill into the past), so the next claim finds it."""

from datetime import timedelta

import pytest
from django.db import connection

from runs import partitions, queue
from runs.actions import backfill_schedule, retry_run
from runs.models import HistoryPartition, Run
from runs.store.postgres import CLAIM_DUE_SQL, NO_FLOOR, _live_bounds, _live_floor, share_params
from scheduler_project.foundation.dbclock import db_now
from tests.helpers import ACTOR, make_schedule

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.postgresql_only("partition pruning and the unseal trigger exist only on PostgreSQL"),
]


def floor():
    with connection.cursor() as cur:
        return _live_floor(cur)


def planned_partitions() -> set:
    import psycopg

    connection.ensure_connection()
    cur = psycopg.Cursor(connection.connection)
    cur.execute("EXPLAIN " + CLAIM_DUE_SQL, {"worker": "w", "limit": 10, "lease": 60, "shift": 0,
                                             **_live_bounds(cur), **share_params(queue.idle_holding())},
                prepare=False)
    return {part for (line,) in cur.fetchall() for part in line.split() if part.startswith("runs_run_")}


def backfilled_long_ago(tenant, target) -> Run:
    """A run 40 days old, made ready by a backfill: in the kept partition, below every regular one."""
    s = make_schedule(tenant, target.url + "/old", expression="0 * * * *")
    # Half past the hour: the 61 minutes before it hold exactly one whole hour (from a time in the
    # first minute past an hour they held two, and the test failed then).
    at = (db_now() - timedelta(days=40)).replace(minute=30, second=0, microsecond=0)
    assert backfill_schedule(s, start=at - timedelta(minutes=61), end=at, by=ACTOR) == 1
    return Run.objects.get(schedule=s)


def dead_run_long_ago(tenant, target):
    run = backfilled_long_ago(tenant, target)
    (c,) = [c for c in queue.claim("w-1", 100) if c.run_id == run.id]
    queue.complete([queue.Result(claimed=c, outcome="failed", http_status=400)])
    return Run.objects.get(id=run.id)


def test_quiet_partitions_are_sealed_and_left_out_of_the_claims_plan(tenant, target):
    run = dead_run_long_ago(tenant, target)
    kept = next(p for p in partitions.layout("runs_run") if p.role == "kept")
    assert run.state == "dead"
    partitions.seal_quiet_partitions(db_now())
    assert HistoryPartition.objects.get(name=kept.name).sealed
    assert floor() == kept.upper
    assert kept.name not in planned_partitions()


def test_a_retry_in_a_sealed_partition_unseals_it_and_the_next_claim_takes_the_run(tenant, target):
    run = dead_run_long_ago(tenant, target)
    kept = next(p for p in partitions.layout("runs_run") if p.role == "kept")
    partitions.seal_quiet_partitions(db_now())
    retry_run(run, by=ACTOR)
    assert not HistoryPartition.objects.get(name=kept.name).sealed
    assert floor() == NO_FLOOR  # the kept partition has no lower bound: nothing is left out
    (c,) = queue.claim("w-2", 10)
    assert c.run_id == run.id and c.generation == 2


def test_a_partition_with_a_ready_run_is_not_sealed(tenant, target):
    assert backfilled_long_ago(tenant, target).state == "ready"
    partitions.seal_quiet_partitions(db_now())
    kept = next(p for p in partitions.layout("runs_run") if p.role == "kept")
    assert not HistoryPartition.objects.get(name=kept.name).sealed
    assert floor() == NO_FLOOR
