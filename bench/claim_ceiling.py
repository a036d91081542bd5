"""Claim ceiling: what a claim costs with its statements bounded above by the claim's now (the
partitions made ahead of now left out of their plans, the capped claim's candidates read planned
with index scans only) against the same statements without that bound (as before), interleaved in
one process, with caps in play and without.

    .venv/bin/python bench/claim_ceiling.py [--partition-seconds 30] [--ahead 1200] [--rounds 20]

The partitions are laid out as the soak lays them (--partition-seconds wide, made --ahead seconds
ahead) or as a deployment does (--partition-seconds 86400 --ahead 3600, the defaults of
SCHEDULER_PARTITION_SECONDS and SCHEDULER_PARTITION_AHEAD_SECONDS). 10 tenants with 2,000 due runs
each; in the capped form one of them is capped at 5 in flight (every claim then takes the capped
path: RunDueTenants, RunCapLocks, RunLeasedPerTenant, RunDueCandidates, RunClaim), in the other no
cap is set (RunClaimDue). Each round releases every lease and times 20 claims of up to 100.
Prints the median time a claim and the ratios.

Database: scheduler_bench_claim_ceiling (dropped and made again).
"""

import argparse
import os
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402

BOUNDED = ("DUE_TENANTS_SQL", "CANDIDATES_SQL", "LEASED_PER_TENANT_SQL", "LEASED_PER_HOST_SQL", "CLAIM_SQL",
           "CLAIM_DUE_SQL")
CEILING = re.compile(r"\s+AND (r\.)?scheduled_time <= %\((now|ceiling)\)s::timestamptz")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--partition-seconds", type=int, default=30)
    ap.add_argument("--ahead", type=int, default=1200)
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    os.environ["SCHEDULER_PARTITION_SECONDS"] = str(args.partition_seconds)
    os.environ["SCHEDULER_PARTITION_AHEAD_SECONDS"] = str(args.ahead)
    C.setup_database("scheduler_bench_claim_ceiling")

    from runs import queue
    from runs.decisions import Holding
    from runs.store import postgres as pg
    from schedules.models import Tenant

    bounded = {name: getattr(pg, name) for name in BOUNDED}
    candidates_now = pg.PostgresStore.run_due_candidates

    def candidates_before(self, tenants, now, *, per_tenant, room=None, without=None):
        # As before: planned with bitmap scans allowed (the read then planned more partitions, and
        # the merge of their ordered index scans kept the planner on them).
        import json

        from runs.decisions import candidate_limits

        full = json.dumps({str(t): list(hosts) for t, hosts in (without or {}).items()})
        with pg._cursor() as cur:
            cur.execute(pg.CANDIDATES_SQL, {"tenants": tenants, "limits": candidate_limits(tenants, per_tenant, room),
                                            "now": now, "floor": pg._live_floor(cur), "full": full})
            return cur.fetchall()

    unbounded = {name: CEILING.sub("", text) for name, text in bounded.items()}
    assert all(unbounded[n] != bounded[n] and "scheduled_time <=" not in unbounded[n] for n in BOUNDED)

    tenants = [C.load_tenant(f"cc{i}", "http://127.0.0.1:9/") for i in range(10)]
    for i, t in enumerate(tenants):
        s = C.load_schedules(f"cc{i}", t, 2000, target_url="http://127.0.0.1:9/run", next_run_at="now() + interval '10 days'")
        C.load_due_runs(s, 2000, "date_trunc('second', now()) - interval '5 seconds'")
    C.vacuum_analyze("runs_run")
    for _ in range(3):
        C.maintain()
    count = C.sql("SELECT count(*) FROM pg_inherits WHERE inhparent = 'runs_run'::regclass")[0][0]
    print(C.machine_line(C.server_version()))
    print(f"runs_run partitions: {count} ({args.partition_seconds} s wide, {args.ahead} s ahead); 20,000 due runs "
          f"of 10 tenants; load average " + "/".join(f"{x:.2f}" for x in os.getloadavg()))

    times = {(form, way): [] for form in ("capped", "no caps") for way in ("with the ceiling", "without (before)")}
    claimed = {k: 0 for k in times}
    for r in range(args.rounds):
        keys = list(times) if r % 2 == 0 else list(times)[::-1]
        for key in keys:
            form, way = key
            for name in BOUNDED:
                setattr(pg, name, bounded[name] if way == "with the ceiling" else unbounded[name])
            pg.PostgresStore.run_due_candidates = candidates_now if way == "with the ceiling" else candidates_before
            Tenant.objects.filter(id=tenants[0].id).update(max_in_flight=5 if form == "capped" else None)
            C.sql("DELETE FROM runs_attempt", fetch=False)
            C.sql("UPDATE runs_run SET state = 'ready', generation = 0, attempts_used = 0, lease_until = NULL, "
                  "lease_owner = '', next_eligible_at = scheduled_time WHERE state = 'leased'", fetch=False)
            queue._limits.loaded_at = -1e9
            t0 = time.perf_counter()
            for _ in range(20):
                claimed[key] += len(queue.claim("cc", 100, holding=Holding(10_000, 1.0, 1.0)))
            times[key].append((time.perf_counter() - t0) / 20 * 1000)
    for form in ("capped", "no caps"):
        base = statistics.median(times[(form, "without (before)")])
        for way in ("with the ceiling", "without (before)"):
            v = statistics.median(times[(form, way)])
            print(f"  {form:8s} {way:18s} median {v:7.2f} ms a claim of up to 100 ({v / base:.2f}x); "
                  f"{claimed[(form, way)]:,} claimed in all")
    print("load average at the end " + "/".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
