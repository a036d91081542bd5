"""A claim plans no partition made ahead of now. Those partitions hold only runs that are not due
yet (the look-ahead's), and PostgreSQL pays to plan every partition a statement may touch, at
every claim: with partitions made far ahead that planning was most of a claim's cost. Each of the
claim's statements bounds the scheduled time by the claim's now, so the planner leaves them out,
as the live floor leaves out the sealed ones below. Both ways of claiming are checked (with caps
and budgets in play, and without), and the runs due are all claimed."""

from datetime import timedelta

import pytest

from runs import partitions, queue
from runs.models import Run, RunState
from runs.store import postgres as pg
from scheduler_project.foundation.dbclock import db_now
from schedules.models import Schedule, TargetPrefix
from tests.helpers import make_schedule

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.postgresql_only("partition pruning exists only on PostgreSQL"),
]

# The statements that read runs_run while claiming.
CLAIM_STATEMENTS = {
    pg.CLAIM_DUE_SQL: "RunClaimDue", pg.DUE_TENANTS_SQL: "RunDueTenants", pg.CANDIDATES_SQL: "RunDueCandidates",
    pg.LEASED_PER_TENANT_SQL: "RunLeasedPerTenant", pg.LEASED_PER_HOST_SQL: "RunLeasedPerHost",
    pg.CLAIM_SQL: "RunClaim",
}


@pytest.fixture(autouse=True)
def fresh_limits():
    queue._limits.loaded_at = -1e9  # caps and budgets are cached for a few seconds per process


@pytest.fixture
def planned(monkeypatch) -> dict:
    """The runs_run partitions in the plan of each claim statement, from `EXPLAIN` with the
    parameters it is executed with, just before it runs."""
    seen: dict = {}
    execute = pg._Unprepared.execute

    def explained(self, query, params=None):
        if query in CLAIM_STATEMENTS:
            self.cur.execute("EXPLAIN " + query, params, prepare=False)
            words = " ".join(r[0] for r in self.cur.fetchall()).split()
            seen[CLAIM_STATEMENTS[query]] = {w for w in words if w.startswith("runs_run_")}
        return execute(self, query, params)

    monkeypatch.setattr(pg._Unprepared, "execute", explained)
    return seen


def due_runs(tenant, url, schedules, per_schedule):
    start = db_now().replace(microsecond=0) - timedelta(minutes=per_schedule - 1)
    ids = [make_schedule(tenant, f"{url}/b{i}", misfire_policy="catch_up", catchup_limit=10_000).id
           for i in range(schedules)]
    Schedule.objects.filter(id__in=ids).update(next_run_at=start, anchor_at=start)
    from dispatch.loops import drain, scan_step

    drain(scan_step)


def test_no_claim_statement_plans_a_partition_made_ahead_of_now(tenant, other_tenant, target, planned):
    now = db_now()
    partitions.ensure_ahead(now, until=now + timedelta(days=4))
    ahead = {p.name for p in partitions.layout("runs_run") if p.lower is not None and p.lower > now}
    current = partitions.partition_name("runs_run", partitions.align(now))
    assert len(ahead) >= 3
    due_runs(tenant, target.url, 2, 5)
    due_runs(other_tenant, target.url, 2, 5)

    # Without caps: one statement.
    first = queue.claim("w-1", 4)
    assert len(first) == 4 and set(planned) == {"RunClaimDue"}

    # With a tenant's cap and a target's budget in play: the statements of the capped claim.
    type(tenant).objects.filter(id=tenant.id).update(max_in_flight=50)
    TargetPrefix.objects.filter(tenant=other_tenant).update(max_concurrency=50)
    queue._limits.loaded_at = -1e9
    rest = queue.claim("w-2", 100)
    assert len(first) + len(rest) == 20
    assert not Run.objects.filter(state=RunState.READY).exists()
    assert set(planned) == set(CLAIM_STATEMENTS.values())

    for name, parts in planned.items():
        assert current in parts, (name, parts)  # the plan was read, and the runs due now are in it
        assert not parts & ahead, (name, sorted(parts & ahead))


def reads_of_live_runs(calls) -> dict:
    """The runs_run partitions in the plan of each read of ready or leased runs that `calls`
    sends, from `EXPLAIN` with its parameters."""
    from django.db import connection

    sent = []

    def record(execute, sql, params, many, context):
        sent.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        calls()
    planned = {}
    with connection.cursor() as cur:
        for sql, params in sent:
            if sql.startswith("SELECT") and 'FROM "runs_run"' in sql and '"runs_run"."state" = ' in sql:
                cur.execute("EXPLAIN " + sql, params)
                planned[sql] = {w for (line,) in cur.fetchall() for w in line.split() if w.startswith("runs_run_")}
    return planned


def test_the_loops_reads_of_ready_and_leased_runs_plan_no_partition_made_ahead(tenant, target):
    from dispatch.incidents import read_facts
    from runs.stats import per_tenant

    now = db_now()
    partitions.ensure_ahead(now, until=now + timedelta(days=4))
    ahead = {p.name for p in partitions.layout("runs_run") if p.lower is not None and p.lower > now}
    due_runs(tenant, target.url, 2, 5)
    claimed = queue.claim("w-1", 4)
    Run.objects.filter(id__in=[c.run_id for c in claimed]).update(lease_until=now - timedelta(minutes=1))

    def the_loops():
        assert queue.seconds_until_next_ready(60) is not None  # the worker, idle
        assert queue.expire_leases(batch=100) == 4  # the reconciler
        queue.skip_unclaimed_misfires(batch=100)
        read_facts(0, db_now(), probe=True)  # the incidents loop's probe of runs missed
        assert per_tenant()  # the portal's load per tenant

    planned = reads_of_live_runs(the_loops)
    assert len(planned) >= 6, list(planned)
    for sql, parts in planned.items():
        assert parts and not parts & ahead, (sql[:120], sorted(parts & ahead))
