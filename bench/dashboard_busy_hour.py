"""The dashboard and /metrics in an hour at the design rate: 1,000,000 runs scheduled over the last
hour, counted on every view, against the count kept for a few seconds once it is slow
(runs.stats.recent_by_state).

    .venv/bin/python bench/dashboard_busy_hour.py [--tenants 10] [--runs-per-tenant 100000] [--repeats 5]

Loads the runs by SQL (97% succeeded, 2% dead, 1% canceled, with their occurrences; no attempts:
the figures measured here do not read them), then times the last hour's count by state, the live
counts, the dead letters and the pages (Django's test client, a superuser, median of `--repeats`
after a warm-up): first with every count made on the spot, then with the rule as shipped.

Database: scheduler_bench_dash (dropped and made again).
"""

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402


def load(tenants: int, per: int) -> None:
    from django.db import transaction

    from runs.models import Occurrence, Run
    from schedules.timeexpr import tzdata_version

    t0 = time.perf_counter()
    for i in range(tenants):
        ten = C.load_tenant(f"t{i}", "http://127.0.0.1:9/")
        s = C.load_schedules(f"s{i}", ten, 1000, target_url="http://127.0.0.1:9/x")
        at = f"(date_trunc('second', now()) - interval '1 hour' + n * interval '{3600.0 / per:.6f} seconds')"
        sid = f"md5('s{i}:s:' || (mod(n, 1000) + 1))::uuid"
        vid = f"{s.vbase} + mod(n, 1000) + 1"
        state = "CASE WHEN mod(n, 100) < 97 THEN 'succeeded' WHEN mod(n, 100) < 99 THEN 'dead' ELSE 'canceled' END"
        wall = f"to_char({at} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US')"
        with transaction.atomic():
            C.insert_series(Occurrence, per, exprs={
                "id": C.uid(f"d{i}", "o"), "schedule_id": sid, "version_id": vid, "scheduled_time": at,
                "local_wall_time": wall, "local_time": f"{wall} || '+00:00'",
            }, values={"schedule_version": 1, "time_zone": "UTC", "tzdata_version": tzdata_version(), "kind": "scheduled"})
            C.insert_series(Run, per, exprs={
                "id": C.uid(f"d{i}", "r"), "occurrence_id": C.uid(f"d{i}", "o"), "tenant_id": f"'{ten.id}'",
                "schedule_id": sid, "version_id": vid, "scheduled_time": at, "next_eligible_at": at, "state": state,
                "finished_at": f"{at} + interval '1 second'", "generation": "1",
            }, values={"schedule_version": 1, "kind": "scheduled", "max_attempts": 5})
    C.sql("ANALYZE runs_run", fetch=False)
    C.sql("CHECKPOINT", fetch=False)
    print(f"loaded {tenants * per} runs over the last hour in {time.perf_counter() - t0:.0f} s", flush=True)


def measure(repeats: int) -> dict:
    from django.contrib.auth.models import User
    from django.test import Client

    from runs import stats

    user = User.objects.filter(username="bench-operator").first() or User.objects.create_superuser(
        "bench-operator", "op@example.invalid", "x")
    client = Client()
    client.force_login(user)
    parts = {
        "last hour by state": lambda: stats.recent_by_state(now=C.db_now()),
        "live counts": stats.live_counts,
        "dead letters": stats.dead_letter,
        "dashboard": lambda: client.get("/"),
        "/metrics": lambda: client.get("/metrics"),
    }
    out = {}
    for name, call in parts.items():
        call()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            call()
            times.append((time.perf_counter() - t0) * 1000)
        out[name] = C.median(times)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tenants", type=int, default=10)
    ap.add_argument("--runs-per-tenant", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--database", default="scheduler_bench_dash")
    args = ap.parse_args()
    print(C.machine_line(), flush=True)
    C.setup_database(args.database)
    load(args.tenants, args.runs_per_tenant)
    from runs import stats
    from runs.models import RecentStateCount

    shipped = stats.RECENT_COUNT_SLOW_SECONDS
    stats.RECENT_COUNT_SLOW_SECONDS = float("inf")
    on_the_spot = measure(args.repeats)
    stats.RECENT_COUNT_SLOW_SECONDS = shipped
    RecentStateCount.objects.all().delete()
    kept = measure(args.repeats)
    window = C.sql("SELECT count(*) FROM runs_run WHERE scheduled_time > now() - interval '1 hour'")[0][0]
    print(f"\ndashboard in a busy hour: {window} runs scheduled in the last hour, {args.tenants} tenants, "
          f"median of {args.repeats} (ms): counted on every view -> kept up to "
          f"{stats.RECENT_COUNT_MAX_AGE.total_seconds():.0f} s once slower than {shipped * 1000:.0f} ms")
    for name in on_the_spot:
        print(f"  {name:20s} {on_the_spot[name]:7.1f} -> {kept[name]:7.1f}")
    print("  load " + "/".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
