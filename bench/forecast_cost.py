"""Forecast cost (issue 28): the time of one forecast (dispatch.forecast.forecast) over a large
fleet, sampled, and over one tenant small enough to be counted exactly; and the estimate's error
against the exact count.

    .venv/bin/python bench/forecast_cost.py [--schedules 1000000] [--tenant-schedules 20000] [--repeats 3]

Loaded with set-based SQL (bench/common.py): a big tenant with --schedules schedules, half
`0 0 * * *` (next run at the next midnight UTC), half `*/15 * * * *` (next run at the next quarter
hour), a tenth of each with a 600 s spread (offsets spread over the window), and a second tenant
with --tenant-schedules `0 0 * * *` schedules all due at the next midnight. Reported: seconds per
forecast (median of --repeats) for every tenant (sampled beyond EXACT_SCHEDULES) and for the small
tenant (exact), the method and fraction, and the sampled estimate of the next quarter hour's
bucket against the exact number loaded.

Database: scheduler_bench_forecast (dropped and made again).
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402

NEXT_MIDNIGHT = "date_trunc('day', now()) + interval '1 day'"
NEXT_QUARTER = "to_timestamp(ceil(extract(epoch FROM now()) / 900) * 900)"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--schedules", type=int, default=1_000_000)
    ap.add_argument("--tenant-schedules", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--reuse", action="store_true", help="keep the database a previous run loaded")
    a = ap.parse_args()
    C.setup_database("scheduler_bench_forecast", fresh=not a.reuse)
    print(C.machine_line())
    if not a.reuse:
        load(a)
    measure(a)


def load(a):
    t0 = time.perf_counter()
    big = C.load_tenant("big", "http://127.0.0.1:9/")
    half = a.schedules // 2
    C.load_schedules("daily", big, half, target_url="http://127.0.0.1:9/d", expression="0 0 * * *",
                     next_run_at=NEXT_MIDNIGHT)
    C.load_schedules("quarter", big, a.schedules - half, target_url="http://127.0.0.1:9/q",
                     expression="*/15 * * * *", next_run_at=NEXT_QUARTER)
    C.sql("UPDATE schedules_scheduleversion SET spread_seconds = 600, spread_offset_seconds = mod(id * 7919, 600) "
          "WHERE mod(id, 10) = 0", fetch=False)
    small = C.load_tenant("small", "http://127.0.0.1:9/")
    C.load_schedules("small", small, a.tenant_schedules, target_url="http://127.0.0.1:9/s",
                     expression="0 0 * * *", next_run_at=NEXT_MIDNIGHT)
    C.vacuum_analyze("schedules_schedule", "schedules_scheduleversion")
    print(f"loaded {a.schedules:,} + {a.tenant_schedules:,} schedules in {time.perf_counter() - t0:.1f} s")


def measure(a):
    from dispatch import forecast as fc
    from schedules.models import Tenant

    small_id = Tenant.objects.get(slug="small").id
    for label, kwargs in (("every tenant", {}), ("one tenant (small)", {"tenant_ids": [small_id]})):
        times, f = [], None
        for _ in range(a.repeats):
            t = time.perf_counter()
            f = fc.forecast(**kwargs)
            times.append(time.perf_counter() - t)
        peak = f.peak()
        print(f"{label}: {statistics.median(times):.2f} s per forecast (median of {a.repeats}; "
              f"min {min(times):.2f}, max {max(times):.2f}); {f.method}; {f.schedules_counted:,} schedules counted, "
              f"about {f.schedules_estimated:,.0f} in scope; next hour's peak {peak.due:,.0f} at {peak.start:%H:%M}")
    # The sampled estimate of the next quarter hour against what was loaded: every */15 schedule
    # without a spread fires in that minute.
    f = fc.forecast()
    quarter = C.sql(f"SELECT {NEXT_QUARTER}")[0][0]
    exact = C.sql("SELECT count(*) FROM schedules_schedule s JOIN schedules_scheduleversion v ON v.id = s.current_id "
                  "WHERE v.expression = '*/15 * * * *' AND v.spread_seconds = 0")[0][0]
    bucket = next((b for b in f.tiers["hour"] if b.start == quarter), None)
    if bucket is not None:
        err = (bucket.due - exact) / exact if exact else 0
        print(f"sampled estimate for {quarter:%H:%M}: {bucket.due:,.0f} against {exact:,} loaded without a spread "
              f"({err:+.1%}; sampled fraction {f.fraction:.3%})")


if __name__ == "__main__":
    main()
