"""The dashboard's figures and the activity loop read attempts and join each to its run. At
scale PostgreSQL does that join as a probe per attempt; joined on the run id alone, each probe
looked in every runs partition (on a 10,000,000-run history of 14 daily partitions the dashboard
took 1.45 s, nearly all of it in these probes). Joined on the partition key as well, which the
attempt carries, each probe looks in the one partition that holds its run."""

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from dispatch.activity import ActivityAggregator
from dispatch.activity import drain as count_activity
from dispatch.activity_figures import failing_targets
from dispatch.loops import drain, scan_step
from runs import queue, stats
from scheduler_project.foundation.dbclock import db_now
from tests.helpers import make_due, make_schedule

pytestmark = [pytest.mark.django_db, pytest.mark.postgresql_only("plans of PostgreSQL's partitioned tables")]


def executed_runs_partitions(sql: str) -> set[str]:
    """The runs partitions an EXPLAIN ANALYZE of `sql` actually read, with per-attempt probes
    (the plan chosen at scale, attempts first; forced here, where the tables are small)."""
    with connection.cursor() as cur:
        cur.execute("SET LOCAL join_collapse_limit = 1")  # the joins in the order written
        cur.execute("SET LOCAL enable_hashjoin = off")
        cur.execute("SET LOCAL enable_mergejoin = off")
        cur.execute("EXPLAIN (ANALYZE, COSTS OFF) " + sql)
        plan = [r[0] for r in cur.fetchall()]
    assert any("Nested Loop" in line for line in plan), "\n".join(plan)
    return {m.group(1) for line in plan if "never executed" not in line
            for m in [re.search(r" on (runs_run_\w+)", line)] if m}


def test_the_activity_loop_and_the_lags_probe_only_the_partition_of_each_run(tenant, target):
    for i in range(3):
        make_due(make_schedule(tenant, target.url + f"/fails{i}"))
    drain(scan_step)
    claimed = queue.claim("w-1", 10)
    queue.complete([queue.Result(claimed=c, outcome="failed", http_status=500, retryable=False) for c in claimed])
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_inherits WHERE inhparent = 'runs_run'::regclass")
        assert cur.fetchone()[0] >= 3  # kept, today's and later ones at least

    with CaptureQueriesContext(connection) as ctx:
        count_activity(ActivityAggregator(settle=timedelta(0)))  # what the failing targets are summed from
        lags = stats.lag_samples(now=db_now()).lags
    assert len(lags) == 3
    assert [f.failed for f in failing_targets(now=db_now())] == [1, 1, 1]
    joined = [q["sql"] for q in ctx.captured_queries if 'INNER JOIN "runs_run"' in q["sql"]]
    assert len(joined) == 2
    for sql in joined:
        assert len(executed_runs_partitions(sql)) == 1, sql
