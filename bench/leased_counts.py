"""Leased counts: what the claim's count of leased runs per tenant (read at every claim once any
tenant has an in-flight cap) costs PostgreSQL, as the ORM wrote it (no live floor: every partition
of runs_run planned) against the store's statement (the live partitions only), interleaved.

    .venv/bin/python bench/leased_counts.py [--partition-seconds 30] [--ahead 1200] [--behind 0] [--rounds 200]

The partitions are laid out as the soak lays them (--partition-seconds wide, made --ahead seconds
ahead, so about 40 live ones) or as a deployment does (--partition-seconds 86400 --ahead 172800);
200 runs leased to 10 tenants. Each round runs both under EXPLAIN (ANALYZE, SUMMARY) and prints
the medians of planning and execution time and their ratio.

Database: scheduler_bench_leased_counts (dropped and made again).
"""

import argparse
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402


def timings(sql: str, params) -> tuple[float, float]:
    rows = C.sql("EXPLAIN (ANALYZE, SUMMARY) " + sql, params)
    text = "\n".join(r[0] for r in rows)
    plan = float(re.search(r"Planning Time: ([\d.]+)", text).group(1))
    execution = float(re.search(r"Execution Time: ([\d.]+)", text).group(1))
    return plan, execution


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--partition-seconds", type=int, default=30)
    ap.add_argument("--ahead", type=int, default=1200)
    ap.add_argument("--behind", type=int, default=0,
                    help="also this many seconds of past partitions (sealed: none of their runs ready or leased), "
                         "as weeks of kept history give a deployment")
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args()
    os.environ["SCHEDULER_PARTITION_SECONDS"] = str(args.partition_seconds)
    os.environ["SCHEDULER_PARTITION_AHEAD_SECONDS"] = str(args.ahead)
    C.setup_database("scheduler_bench_leased_counts")
    from datetime import timedelta

    from django.db import connection

    from runs import partitions
    from scheduler_project.foundation.dbclock import db_now

    if args.behind:
        partitions.extend_back(db_now() - timedelta(seconds=args.behind))

    from runs.models import Run, RunState
    from runs.store import postgres as pg

    tenants = [C.load_tenant(f"lc{i}", "http://127.0.0.1:9/") for i in range(10)]
    for i, t in enumerate(tenants):
        sched = C.load_schedules(f"lc{i}", t, 20, target_url="http://127.0.0.1:9/run",
                                 next_run_at="now() + interval '10 days'")
        C.load_due_runs(sched, 20, "date_trunc('second', now())")
    C.sql("UPDATE runs_run SET state = 'leased', generation = 1, lease_until = now() + interval '1 hour', "
          "lease_owner = 'bench', next_eligible_at = NULL", fetch=False)
    C.vacuum_analyze("runs_run")
    for _ in range(5):  # the past partitions sealed (the kept one on a later pass), as the maintain loop does
        C.maintain()
    count = C.sql("SELECT count(*) FROM pg_inherits WHERE inhparent = 'runs_run'::regclass")[0][0]
    ids = [t.id for t in tenants]
    with connection.cursor() as cur:
        bounds = pg._live_bounds(cur)
    floor = bounds["floor"]
    orm = Run.objects.filter(state=RunState.LEASED, tenant_id__in=ids).values_list("tenant_id")
    from django.db.models import Count

    orm_sql, orm_params = orm.annotate(n=Count("id")).values_list("tenant_id", "n").query.sql_with_params()
    store_sql = pg.LEASED_PER_TENANT_SQL
    store_params = {"tenants": ids, **bounds}
    print(C.machine_line(C.server_version()))
    print(f"runs_run partitions: {count} ({args.partition_seconds} s wide, {args.ahead} s ahead, {args.behind} s behind; live floor {floor}); "
          f"200 leased runs of 10 tenants; load average " + "/".join(f"{x:.2f}" for x in os.getloadavg()))
    got = {"ORM count, no floor (before)": [], "RunLeasedPerTenant, live floor (now)": []}
    for r in range(args.rounds):
        pair = [("ORM count, no floor (before)", orm_sql, orm_params),
                ("RunLeasedPerTenant, live floor (now)", store_sql, store_params)]
        for name, sql, params in (pair if r % 2 == 0 else pair[::-1]):
            got[name].append(timings(sql, params))
    same = dict(C.sql(orm_sql, orm_params)) == dict(C.sql(store_sql, store_params))
    base = None
    for name, xs in got.items():
        plan, execution = C.median([x[0] for x in xs]), C.median([x[1] for x in xs])
        base = base or (plan + execution)
        print(f"  {name:38s} planning {plan:7.3f} ms  execution {execution:7.3f} ms  "
              f"together {(plan + execution) / base:.2f}x")
    print(f"same counts: {same}; load average at the end " + "/".join(f"{x:.2f}" for x in os.getloadavg()))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
