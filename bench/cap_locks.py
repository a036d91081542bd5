"""Cap locks: what holding the capped tenants and budgeted hosts costs a claim with caps in play
(runs.queue.claim; the store's run_cap_locks), against the same claim without them (as before),
interleaved in one process.

    .venv/bin/python bench/cap_locks.py

10 tenants with 2,000 due runs each, one capped at 5 in flight; each round releases every lease and
times 20 claims of up to 100. Prints the median time a claim and the ratio.

Database: scheduler_bench_cap_locks (dropped and made again).
"""

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402


def main():
    C.setup_database("scheduler_bench_cap_locks")

    from runs import queue
    from runs.decisions import Holding
    from runs.store import postgres as pg
    from schedules.models import Tenant
    tenants = [C.load_tenant(f"cl{i}", "http://127.0.0.1:9/") for i in range(10)]
    for i, t in enumerate(tenants):
        s = C.load_schedules(f"cl{i}", t, 2000, target_url="http://127.0.0.1:9/run", next_run_at="now() + interval '10 days'")
        C.load_due_runs(s, 2000, "date_trunc('second', now()) - interval '30 seconds'")
    Tenant.objects.filter(id=tenants[0].id).update(max_in_flight=5)
    C.vacuum_analyze("runs_run")
    print(C.machine_line(C.server_version()))
    real = pg.PostgresStore.run_cap_locks

    def without(self, t, h):
        return set(t) | set(h)

    times = {"with the cap locks": [], "without (before)": []}
    for r in range(20):
        for name in (list(times) if r % 2 == 0 else list(times)[::-1]):
            pg.PostgresStore.run_cap_locks = real if name.startswith("with ") else without
            C.sql("DELETE FROM runs_attempt", fetch=False)
            C.sql("UPDATE runs_run SET state = 'ready', generation = 0, attempts_used = 0, lease_until = NULL, "
                  "lease_owner = '', next_eligible_at = scheduled_time WHERE state = 'leased'", fetch=False)
            queue._limits.loaded_at = -1e9
            t0 = time.perf_counter()
            n = 0
            for _ in range(20):
                n += len(queue.claim("ab", 100, holding=Holding(10_000, 1.0, 1.0)))
            times[name].append((time.perf_counter() - t0) / 20 * 1000)
    base = statistics.median(times["without (before)"])
    for k, v in times.items():
        print(f"  {k:22s} median {statistics.median(v):7.2f} ms a claim of up to 100 ({statistics.median(v)/base:.2f}x)")
    print("load average at the end " + "/".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
