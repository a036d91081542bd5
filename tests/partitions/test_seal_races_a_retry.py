"""A retry that commits while the maintenance loop seals its partition never leaves a ready run in
a sealed partition (where the claim, which plans only unsealed partitions, would never find it).

The race: the retry's update fires the unseal trigger while the partition is still unsealed (the
trigger's conditional update matches nothing and so locks nothing), the sealer sets the flag and
checks the partition without seeing the uncommitted retry, then the retry commits."""

import threading

import pytest
from django.db import connection, transaction

from runs import partitions, queue
from runs.actions import retry_run
from runs.models import HistoryPartition, Run
from scheduler_project.foundation.dbclock import db_now
from tests.helpers import ACTOR
from tests.partitions.test_sealed_partitions import dead_run_long_ago

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgresql_only("sealing and its unseal trigger exist only on PostgreSQL; two sessions race"),
]


def kept_partition():
    return next(p for p in partitions.layout("runs_run") if p.role == "kept")


def test_a_retry_committing_during_sealing_leaves_its_partition_unsealed(tenant, target):
    run = dead_run_long_ago(tenant, target)
    kept = kept_partition()
    # A first pass seals the partition (the trigger goes on); a retry of another run unseals it,
    # as after any retry: a partition with the trigger, unsealed, with no ready run left.
    other = dead_run_long_ago(tenant, target)
    partitions.seal_quiet_partitions(db_now())
    assert HistoryPartition.objects.get(name=kept.name).sealed
    retry_run(other, by=ACTOR)
    (c,) = queue.claim("w-1", 10)
    queue.complete([queue.Result(claimed=c, outcome="failed", http_status=400)])
    assert not HistoryPartition.objects.get(name=kept.name).sealed

    updated, release = threading.Event(), threading.Event()
    errors = []

    def retry_held_open():
        try:
            with transaction.atomic():
                retry_run(Run.objects.get(id=run.id), by=ACTOR)
                updated.set()
                release.wait(10)
        except Exception as exc:  # reported below
            errors.append(exc)
            updated.set()
        finally:
            connection.close()

    # The retry updates its run just before the sealer sets the flag (after the sealer's trigger
    # statement, which would wait for it), and commits a moment later.
    t = threading.Thread(target=retry_held_open)
    timer = threading.Timer(0.5, release.set)
    exec_ = partitions._exec

    def exec_with_retry(cur, sql, params=None):
        if sql.startswith("UPDATE runs_historypartition SET sealed = true") and not t.is_alive() and not updated.is_set():
            t.start()
            assert updated.wait(10)
            timer.start()
        return exec_(cur, sql, params)

    partitions._exec = exec_with_retry
    try:
        partitions.seal_quiet_partitions(db_now())
    finally:
        partitions._exec = exec_
        release.set()
        t.join(10)
        timer.cancel()
    assert not errors
    assert Run.objects.get(id=run.id).state == "ready"
    assert not HistoryPartition.objects.get(name=kept.name).sealed, "a ready run was left in a sealed partition"
    (c,) = queue.claim("w-2", 10)
    assert c.run_id == run.id
