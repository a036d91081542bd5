"""Run the benchmarks (issues 7 and 15) one after another (never two at once: they share 2 cores) and keep
each one's output in bench/out/<name>.txt.

    .venv/bin/python bench/run_all.py            # the full forms (about an hour on 2 cores)
    .venv/bin/python bench/run_all.py --short    # CI-sized forms (a few minutes)
    .venv/bin/python bench/run_all.py --only scanner,burst
"""

import argparse
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
PYTHON = BENCH.parent / ".venv" / "bin" / "python"

# name: (script, full args, short args), in the order they run.
PLAN = {
    "scanner": ("scanner", [], ["--schedules", "200000", "--repeats", "10", "--due-repeats", "2"]),
    "queue_profile": ("queue_profile", [], ["--runs", "5000", "--repeats", "2"]),
    "burst": ("burst", [], ["--runs", "20000", "--repeats", "1"]),
    # The same burst through real scanners: only the schedules are due, made 150 s ahead.
    "burst_scanners": ("burst", ["--scanners", "1", "--lead", "150"],
                       ["--scanners", "1", "--lead", "60", "--runs", "20000", "--repeats", "1"]),
    "steady": ("steady", [], ["--seconds", "30", "--repeats", "1"]),
    "fairness": ("fairness", [], ["--big", "10000", "--repeats", "1"]),
    "peers": ("peers", [], ["--jobs", "5000", "--slow-jobs", "1000", "--dbos-jobs", "500", "--floor-jobs", "20000",
                            "--rounds", "1"]),
    "index_ab": ("index_ab", [], ["--runs", "5000", "--rounds", "1"]),
    "api_create": ("api_create", [], ["--creates", "800", "--seconds", "5", "--repeats", "1"]),
    # Issue 15: creating through the batch endpoint, the scanner over 10 million schedules, a long
    # history against an empty one, and retention under a steady 278 runs/s.
    "api_bulk": ("api_create", ["--bulk", "1000", "--creates", "500000", "--threads", "2", "--repeats", "1"],
                 ["--bulk", "1000", "--creates", "20000", "--threads", "2", "--repeats", "1"]),
    "scanner_10m": ("scanner", ["--schedules", "10000000", "--due-repeats", "2", "--period", "3600"],
                    ["--schedules", "1000000", "--repeats", "10", "--due-repeats", "1"]),
    "history": ("history", [], ["--runs", "1000000", "--days", "7", "--repeats", "1", "--burst", "20000",
                                "--burst-repeats", "1"]),
    "retention_load": ("retention_load", [], ["--minutes", "8", "--day", "30", "--keep-days", "3"]),
    "migration_0007": ("migration_0007", [], ["--runs", "100000"]),
    # The dashboard and /metrics with an hour of runs at the design rate (1,000,000 an hour).
    "dashboard_busy_hour": ("dashboard_busy_hour", [], ["--runs-per-tenant", "20000", "--repeats", "3"]),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--short", action="store_true")
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    names = [n for n in PLAN if not args.only or n in args.only.split(",")]
    out = BENCH / "out"
    out.mkdir(exist_ok=True)
    failed = []
    for name in names:
        script, full, short = PLAN[name]
        extra = short if args.short else full
        print(f"=== {name} {' '.join(extra)}", flush=True)
        t = time.monotonic()
        with open(out / f"{name}.txt", "w") as log:
            p = subprocess.Popen([str(PYTHON), str(BENCH / f"{script}.py"), *extra], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
            for line in p.stdout:
                sys.stdout.write(line)
                log.write(line)
            p.wait()
        print(f"=== {name}: exit {p.returncode} after {time.monotonic() - t:.0f}s\n", flush=True)
        if p.returncode:
            failed.append(name)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
