"""A partition with nothing to keep, beside an empty kept partition, is removed in one transaction
under the group's locks (runs.partitions.drop_oldest) rather than by a swap, whose staging takes
the tables' locks several times over; the soak's `maintain` fell behind the partitions' ageing
that way. The check that nothing outlives the partition is made again under those locks."""

from datetime import timedelta

import pytest
from django.db import connection

from runs import partitions, retention
from runs.models import HistoryPartition, HistoryRemoval, Run
from runs.partitions import Role
from scheduler_project.foundation.dbclock import db_now
from tests.retention.conftest import one_run, run_retention
from tests.retention.test_removal import history_violations, present

pytestmark = [pytest.mark.django_db,
              pytest.mark.postgresql_only("partitions and their removal by DDL exist only on PostgreSQL")]


def kept(table="runs_run"):
    return next(p for p in partitions.layout(table) if p.role == Role.KEPT)


def kept_number(name: str) -> int:
    return int(name.rsplit("_", 1)[1])


def oldest(table="runs_run"):
    return next(p for p in partitions.layout(table) if p.role == Role.LIVE)


def test_a_partition_with_nothing_to_keep_goes_without_a_swap(tenant, target, later, monkeypatch):
    gone = [one_run(tenant, target, f"/ok{i}", to="succeeded") for i in range(3)]
    monkeypatch.setattr(partitions, "swap", lambda *a, **k: pytest.fail("a swap for a partition with nothing to keep"))
    before = {t: (kept(t).name, oldest(t).name) for t in partitions.GROUPS[partitions.Group.RUNS]}
    run_retention(later)
    assert present(*gone) == {r.id: False for r in gone}
    for t, (old_kept, old_oldest) in before.items():
        names = {p.name for p in partitions.layout(t)}
        assert old_kept not in names and old_oldest not in names
        assert kept_number(kept(t).name) > kept_number(old_kept)  # made again, once per removal
    # The audit counts what went, from the partition's own statistics.
    removed = {t: sum(h.removed.get(t, 0) for h in HistoryRemoval.objects.all())
               for t in ("runs_run", "runs_attempt", "runs_occurrence")}
    assert removed == {"runs_run": 3, "runs_attempt": 3, "runs_occurrence": 3}
    assert all(h.kept == {t: 0 for t in partitions.GROUPS[partitions.Group.RUNS]}
               for h in HistoryRemoval.objects.filter(what__startswith="runs_run"))
    # The new kept partition reaches the removed one's end: a run written for an instant in that
    # range (a backfill) has a place, and is not refused.
    top = kept().upper
    above = [p for p in partitions.layout("runs_run") if p.role != Role.KEPT]
    assert top is not None and above[0].lower == top
    # The new kept partition is empty and made sealed, so the dispatch statements' live floor
    # holds (the kept partition has no lower bound: unsealed, there would be no floor at all).
    assert HistoryPartition.objects.get(name=kept().name).sealed
    with connection.cursor() as cur:
        cur.execute(partitions.LIVE_FLOOR_SQL)
        assert cur.fetchone()[0] == top
    # Runs written for an instant in the removed range (here: now, as this test's retention ran
    # from weeks ahead) land in the new kept partition; a ready one unseals it (its trigger).
    ready = one_run(tenant, target, "/late-ready", to="ready")
    assert ready.scheduled_time < top
    assert not HistoryPartition.objects.get(name=kept().name).sealed
    with connection.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM {partitions.q(kept().name)} WHERE id = %s", [ready.id])
        assert cur.fetchone()[0] == 1
    assert history_violations() == []


def test_what_became_worth_keeping_before_the_lock_is_kept(tenant, target, later, monkeypatch):
    # Counted with nothing to keep, then a run of the partition ready again (a retry by hand
    # between the count and the lock): the check under the lock refuses, and the swap keeps it.
    done = one_run(tenant, target, "/done", to="succeeded")
    ready = one_run(tenant, target, "/ready", to="ready")
    real_count = retention.count_survivors
    monkeypatch.setattr(retention, "count_survivors", lambda group, sources, params: (
        0 if any("_kept_" not in s for s in sources) else real_count(group, sources, params)))
    swaps = []
    real = partitions.swap
    monkeypatch.setattr(partitions, "swap", lambda *a, **k: swaps.append(1) or real(*a, **k))
    run_retention(later)
    assert swaps and present(done, ready) == {done.id: False, ready.id: True}
    assert Run.objects.get(id=ready.id).state == "ready"
    assert history_violations() == []


def test_a_kept_partition_with_rows_is_rewritten_by_a_swap(tenant, target, later, monkeypatch):
    # Dead runs within their retention stay in the kept partition; the next removal is a swap,
    # which also rewrites the kept partition without what expired in it.
    dead = one_run(tenant, target, "/dead", to="dead")
    Run.objects.filter(id=dead.id).update(finished_at=db_now() + timedelta(days=10))
    run_retention(later)
    assert present(dead)[dead.id]
    assert Run.objects.filter(id=dead.id).exists() and retention._kept_empty(partitions.Group.RUNS) is False
