"""The hot statements keep their primary-key plans when the planner's statistics are stale.

A day's partition is made (and analyzed) empty, and the burst it receives at midnight can arrive
before autovacuum has analyzed it again (its workers may be busy elsewhere for minutes). With
statistics that say "empty", the completion once joined its batch against every leased run of
the partition (a bitmap scan of all of them per statement) and the attempts of a queued-up batch
of 5,600 against that batch row by row (17 s): a burst through the real scanner then took
minutes per completion. The plans asserted here are the ones that do not
depend on the row count."""

from datetime import timedelta

import pytest
from django.db import connection

from dispatch.loops import drain, scan_step
from runs import queue
from runs.models import Run
from runs.store.postgres import CLAIM_DUE_SQL, COMPLETE_SQL, _Unprepared
from scheduler_project.foundation.dbclock import db_now
from schedules.models import Schedule
from tests.helpers import make_schedule

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgresql_only("plans of PostgreSQL statements")]


def _partitions(parent: str) -> list[str]:
    with connection.cursor() as cur:
        cur.execute("SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = %s::regclass", [parent])
        return [r[0] for r in cur.fetchall()]


@pytest.fixture
def stale_statistics():
    """Statistics taken while the history tables were empty, and no autovacuum to refresh them."""
    tables = _partitions("runs_run") + _partitions("runs_attempt")
    with connection.cursor() as cur:
        for t in tables:
            cur.execute(f"ALTER TABLE {t} SET (autovacuum_enabled = false)")
        cur.execute("ANALYZE runs_run")
        cur.execute("ANALYZE runs_attempt")
    yield
    with connection.cursor() as cur:
        for t in tables:
            cur.execute(f"ALTER TABLE {t} RESET (autovacuum_enabled)")


@pytest.fixture
def plans(monkeypatch):
    """The plan of each claim and complete statement, from `EXPLAIN` with the parameters it is
    executed with, just before it runs."""
    seen = []
    statements = {CLAIM_DUE_SQL, COMPLETE_SQL}
    execute = _Unprepared.execute

    def explained(self, query, params=None):
        if query in statements:
            self.cur.execute("EXPLAIN " + query, params, prepare=False)
            seen.append("\n".join(r[0] for r in self.cur.fetchall()))
        return execute(self, query, params)

    monkeypatch.setattr(_Unprepared, "execute", explained)
    return seen


def test_claim_and_complete_probe_by_primary_key_when_the_statistics_say_empty(stale_statistics, plans, tenant, target):
    start = db_now().replace(microsecond=0) - timedelta(minutes=59)
    ids = [make_schedule(tenant, f"{target.url}/s{i}", misfire_policy="catch_up", catchup_limit=10_000).id
           for i in range(40)]
    Schedule.objects.filter(id__in=ids).update(next_run_at=start, anchor_at=start)
    drain(scan_step)
    assert Run.objects.filter(state="ready").count() == 2400

    # A worker big enough that one tenant's one target may take the whole batch under the shares.
    claimed = queue.claim("w", 400, holding=queue.idle_holding(1600))
    assert len(claimed) == 400
    assert queue.complete([queue.Result(claimed=c, outcome="succeeded", http_status=200) for c in claimed]) == (400, 0)
    assert len(plans) == 2
    claim_plan, complete_plan = plans

    def probes(plan: str, index: str) -> bool:
        """`index` is used with the batch's ids as its condition, not scanned whole."""
        lines = plan.splitlines()
        return any(index in line and "Index Cond: (" in nxt and "id = ANY" in nxt for line, nxt in zip(lines, lines[1:]))

    # The batch's runs and attempts are found by their primary keys, not by scanning every
    # leased (or ready) run of the partition, or the whole partition. Which partition holds them
    # depends on the hour: in the first hour after midnight (UTC) of a new test database, an hour
    # ago is before its first daily partition, in the kept one (runs_run_pkey_kept_N).
    assert probes(complete_plan, "runs_run_pkey_"), complete_plan
    assert probes(complete_plan, "runs_attempt_pkey_"), complete_plan
    assert probes(claim_plan, "runs_run_pkey_"), claim_plan
    # Nor joins a batch to itself row by row: the planner takes the batch's CTE for one row, and a
    # nested loop over it costs the square of the batch (thousands when completions queue up).
    assert "Nested Loop" not in complete_plan, complete_plan
    for plan in plans:
        for scan in ("Bitmap Heap Scan on runs_", "Seq Scan on runs_run_p", "Seq Scan on runs_attempt_p",
                     "Seq Scan on runs_run_kept", "Seq Scan on runs_attempt_kept",
                     "using run_leased_idx", "using run_ready_idx"):
            assert scan not in plan, plan
    assert Run.objects.filter(state="succeeded").count() == 400
