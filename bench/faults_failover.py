"""The failover and partition suites, long form: many faults of each kind, chosen at random.

    python bench/faults_failover.py --failovers 10 --partitions 50

Needs root (network namespaces, pg_autoctl run as the postgres user) and the Debian packages
pg-auto-failover-cli, postgresql-15-auto-failover, iptables and faketime. Brings up its own
pg_auto_failover formation and its own PostgreSQL inside a namespace; the machine's PostgreSQL is
not used. Prints one line per suite (the same as tests/faults/test_failover.py and
test_partitions.py) and exits 1 if an invariant broke.
"""

import argparse
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--failovers", type=int, default=10, help="primary changes; about a third planned switchovers")
    ap.add_argument("--partitions", type=int, default=50, help="link faults between hosts")
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--observe", type=float, default=12.0, help="seconds watched after each failover")
    args = ap.parse_args()

    # The harness swaps this process's connection to the databases it starts; Django only needs
    # a PostgreSQL engine configured to begin with (nothing connects to this address).
    os.environ["DATABASE_URL"] = "postgres://postgres@127.0.0.1:1/unused"
    os.environ.setdefault("SCHEDULER_ALLOW_DEV_SECRET", "1")
    os.environ["DJANGO_SETTINGS_MODULE"] = "scheduler_project.settings"
    import django

    django.setup()
    from tests.faults.failover import run_failover
    from tests.faults.partitions import SKEW_SECONDS, run_partitions

    rng = random.Random(args.seed)
    print(f"seed={args.seed} failovers={args.failovers} partitions={args.partitions}", flush=True)
    ok = True
    if args.failovers:
        faults = ["switchover" if rng.random() < 1 / 3 else "kill" for _ in range(args.failovers)]
        started = time.monotonic()
        f = run_failover(faults=faults, seed=args.seed, observe=args.observe,
                         log=lambda m: print("  " + m, flush=True))
        print(f.line())
        print(f"  promoted after (s): {', '.join(f'{s:.1f}' for s in f.promote_s)}")
        print(f"  longest gap per fault (s): {', '.join(f'{g:.1f}' for g in f.gaps)}")
        print(f"  runs in flight at each fault: {f.in_flight_at_fault}; web answers during the faults: "
              f"{dict(f.web_during_faults)}; {time.monotonic() - started:.0f}s")
        print("  /metrics (min, max, last): " + ", ".join(f"{k}={v}" for k, v in f.metrics.items()))
        for d in f.details + f.stalled_loops:
            print("  " + d)
        ok &= f.ok()
    if args.partitions:
        kinds = ["db_cut", "target_cut", "degrade"]
        faults = [kinds[i % 3] for i in range(args.partitions)]
        rng.shuffle(faults)
        started = time.monotonic()
        p = run_partitions(faults=faults, seed=args.seed, recover=2.0, log=lambda m: print("  " + m, flush=True))
        print(p.line())
        print(f"  cut workers' expired leases={p.cut_worker_unknown} target-cut failures={p.target_cut_failures} "
              f"attempts on degraded links={p.degraded_attempts} skewed worker's calls={p.skewed_attempts} "
              f"(at most {p.skew_max_s:.1f}s from the database's time, its clock {SKEW_SECONDS}s off); "
              f"{time.monotonic() - started:.0f}s")
        for d in p.details + p.problems:
            print("  " + d)
        ok &= p.ok()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
