"""A run due where no partition was made yet (the maintenance loop stopped) is never lost nor
refused: it lands in the catch-all partition, dispatch goes on, `manage.py partitions --check`
fails loudly with the fix, /metrics shows it, and making the partitions moves it where it belongs."""

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection

from dispatch import invariants
from dispatch.loops import drain, scan_step
from dispatch.metrics import exposition
from runs import partitions, queue
from runs.models import Attempt, Run
from scheduler_project.foundation.dbclock import db_now
from tests.helpers import make_due, make_schedule

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.postgresql_only("time partitions exist only on PostgreSQL; SQLite has none to miss"),
]


def lose_partitions_from(start):
    """As if the maintenance loop had stopped before making the partitions from `start` on: drop
    them (they are empty in a fresh test) and let the catch-all begin there."""
    with connection.cursor() as cur:
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
        for group, tables in partitions.GROUPS.items():
            for t in tables:
                layout = partitions.layout(t)
                fut = next(p for p in layout if p.role == "future")
                cur.execute(f"ALTER TABLE {t} DETACH PARTITION {fut.name}")
                for p in layout:
                    if p.role == "live" and p.lower >= start:
                        cur.execute(f"DROP TABLE {p.name}")
                cur.execute(f"ALTER TABLE {t} ATTACH PARTITION {fut.name} FOR VALUES FROM (%s) TO (MAXVALUE)", [start])
                partitions.sync_catalog(t)
        cur.execute("SET CONSTRAINTS ALL DEFERRED")


def where(table, key, value) -> str:
    with connection.cursor() as cur:
        cur.execute(f"SELECT tableoid::regclass::text FROM {table} WHERE {key} = %s", [value])
        return cur.fetchone()[0]


def test_a_run_with_no_partition_lands_in_the_catch_all_and_is_moved_when_partitions_are_made(tenant, target, capsys):
    now = db_now()
    lose_partitions_from(partitions.align(now))
    make_due(make_schedule(tenant, target.url + "/job"))
    drain(scan_step)
    run = Run.objects.get()
    assert where("runs_run", "id", run.id) == "runs_run_future"
    assert where("runs_occurrence", "id", run.occurrence_id) == "runs_occurrence_future"

    # Dispatch goes on: the run is claimed and completed where it is.
    (c,) = queue.claim("w-1", 10)
    assert queue.complete([queue.Result(claimed=c, outcome="succeeded", http_status=200)]) == (1, 0)
    assert where("runs_attempt", "run_id", run.id) == "runs_attempt_future"

    # Loud: the check fails and says what to run; /metrics shows the stray rows.
    with pytest.raises(SystemExit) as exit:
        call_command("partitions", "--check")
    assert exit.value.code == 1
    err = capsys.readouterr().err
    assert "manage.py partitions" in err and "no partition covered" in err
    text = exposition().decode()
    assert 'scheduler_history_unpartitioned_rows{table="runs_run"} 1.0' in text

    # The fix: the partitions are made and the rows moved into them; nothing is lost.
    made = partitions.ensure_ahead(db_now())
    assert made.moved_from_future >= 3  # the occurrence, the run, its attempt (and its events)
    assert where("runs_run", "id", run.id) == partitions.partition_name("runs_run", partitions.align(run.scheduled_time))
    assert Run.objects.get(id=run.id).state == "succeeded"
    assert Attempt.objects.filter(run_id=run.id).count() == 1
    call_command("partitions", "--check")
    assert invariants.run_all() == []


def test_partitions_are_made_ahead_of_time_by_the_maintenance_step(tenant):
    from dispatch.maintenance import Maintenance

    now = db_now()
    lose_partitions_from(partitions.align(now) + partitions.width())
    Maintenance().step()
    assert partitions.covered_until() >= now + partitions.ahead()
    assert partitions.unpartitioned_rows() == {t: 0 for t in partitions.KEY}
