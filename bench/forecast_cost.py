"""Forecast cost (issue 28): the time of one forecast (dispatch.forecast.forecast) over a large
fleet: bounded (exact up to EXACT_SCHEDULES, a uniform sample beyond), full (every schedule counted,
grouped in the database), one tenant counted exactly, and a tenant of 120 every-minute schedules
over the week (walked occurrence by occurrence before issue 28's arithmetic: 9.5 s); and the
sample's stated error checked against the exact count, bucket by bucket. Interleaved rounds, load
average printed after each.

    .venv/bin/python bench/forecast_cost.py [--schedules 1000000] [--tenant-schedules 20000] [--repeats 3]

Loaded with set-based SQL (bench/common.py): a big tenant with --schedules schedules, half
`0 0 * * *` (next run at the next midnight UTC), half `*/15 * * * *` (next run at the next quarter
hour), a tenth of each with a 600 s spread (offsets spread over the window), and a second tenant
with --tenant-schedules `0 0 * * *` schedules all due at the next midnight, and a third tenant with
120 `* * * * *`. Reported: seconds per forecast (median of --repeats) for each kind, the method,
and the sampled buckets against the exact ones.

Database: scheduler_bench_forecast (dropped and made again).
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402

NEXT_MIDNIGHT = "date_trunc('day', now()) + interval '1 day'"
NEXT_QUARTER = "to_timestamp(ceil(extract(epoch FROM now()) / 900) * 900)"
# The next weekday 09:00 in New York (from tomorrow: a bench starts at any hour).
NEXT_MORNING = ("(SELECT (d + time '09:00') AT TIME ZONE 'America/New_York' FROM generate_series("
                "(now() AT TIME ZONE 'America/New_York')::date + 1, (now() AT TIME ZONE 'America/New_York')::date + 7, "
                "interval '1 day') AS d WHERE extract(isodow FROM d) < 6 LIMIT 1)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--schedules", type=int, default=1_000_000)
    ap.add_argument("--tenant-schedules", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--database", default="scheduler_bench_forecast")
    ap.add_argument("--reuse", action="store_true", help="keep the database a previous run loaded")
    a = ap.parse_args()
    C.setup_database(a.database, fresh=not a.reuse)
    print(C.machine_line())
    if not a.reuse:
        load(a)
    measure(a)


def load(a):
    t0 = time.perf_counter()
    big = C.load_tenant("big", "http://127.0.0.1:9/")
    small = C.load_tenant("small", "http://127.0.0.1:9/")
    minutely = C.load_tenant("minutely", "http://127.0.0.1:9/")
    # The big tenant's mix: daily at midnight UTC, every quarter hour, weekday mornings in a zone
    # with DST, hourly rate(); a tenth of each with a 600 s spread.
    n = a.schedules
    mix = [("daily", 45, "0 0 * * *", "UTC", NEXT_MIDNIGHT),
           ("quarter", 40, "*/15 * * * *", "UTC", NEXT_QUARTER),
           ("morning", 10, "0 9 * * 1-5", "America/New_York", NEXT_MORNING),
           ("hourly", 5, "rate(1 hour)", "UTC", "date_trunc('hour', now()) + interval '1 hour'")]
    parts, left = [], n
    for i, (tag, pct, expression, zone, next_at) in enumerate(mix):
        count = left if i == len(mix) - 1 else n * pct // 100
        left -= count
        parts.append(dict(tag=tag, tenant=big, count=count, target_url=f"http://127.0.0.1:9/{tag}",
                          expression=expression, time_zone=zone, next_run_at=next_at,
                          anchor_at="date_trunc('hour', now())", spread="mod(n, 10) = 0"))
    parts.append(dict(tag="small", tenant=small, count=a.tenant_schedules, target_url="http://127.0.0.1:9/s",
                      expression="0 0 * * *", next_run_at=NEXT_MIDNIGHT))
    parts.append(dict(tag="minutely", tenant=minutely, count=120, target_url="http://127.0.0.1:9/m",
                      expression="* * * * *", next_run_at="date_trunc('minute', now()) + interval '1 minute'"))
    C.load_schedules_fast(parts)
    print(f"loaded {a.schedules:,} + {a.tenant_schedules:,} + 120 schedules in {time.perf_counter() - t0:.1f} s "
          f"(bench/common.py load_schedules_fast); load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
          flush=True)


def measure(a):
    from dispatch import forecast as fc
    from schedules.models import Tenant

    small_id = Tenant.objects.get(slug="small").id
    minutely_id = Tenant.objects.get(slug="minutely").id
    print(f"scope size from the kept counts: {fc._scope_size(None):,} schedules; exact up to {fc.EXACT_SCHEDULES:,}, "
          f"sample of about {fc.SAMPLE_SCHEDULES:,} beyond")
    exact_all = None
    rounds = {"bounded (every tenant)": {}, "full exact (every tenant)": {"exact": True},
              "one tenant (small, exact)": {"tenant_ids": [small_id]},
              "120 every-minute schedules, a week (exact)": {"tenant_ids": [minutely_id]}}
    times = {k: [] for k in rounds}
    last = {}
    for _ in range(a.repeats):  # interleaved rounds
        for label, kwargs in rounds.items():
            kwargs = dict(kwargs)
            force = kwargs.pop("exact", False)
            saved = fc.EXACT_SCHEDULES
            if force:
                fc.EXACT_SCHEDULES = 10 ** 12
            try:
                t = time.perf_counter()
                last[label] = fc.forecast(**kwargs)
                times[label].append(time.perf_counter() - t)
            finally:
                fc.EXACT_SCHEDULES = saved
        print(f"  round done; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    for label in rounds:
        f, ts = last[label], times[label]
        peak = f.peak()
        print(f"{label}: {statistics.median(ts):.2f} s per forecast (median of {a.repeats}; min {min(ts):.2f}, "
              f"max {max(ts):.2f}); {f.method}; {f.schedules_counted:,} schedules counted, about "
              f"{f.schedules_estimated:,.0f} in scope; next hour's peak {peak.due:,.0f} \u00b1 {peak.error:,.0f} "
              f"at {peak.start:%H:%M}")
    exact_all = last["full exact (every tenant)"]
    sampled = last["bounded (every tenant)"]
    if not sampled.exact:
        # The sample's stated error against the exact count, bucket by bucket (non-empty buckets).
        inside = total = 0
        worst = 0.0
        for name, _, _ in fc.TIERS:
            for e, s in zip(exact_all.tiers[name], sampled.tiers[name]):
                if e.due or s.due:
                    total += 1
                    inside += abs(s.due - e.due) <= s.error + 1e-9
                    if e.due:
                        worst = max(worst, abs(s.due - e.due) / e.due)
        print(f"sampled against exact: {inside:,} of {total:,} non-empty buckets within their stated 95% error "
              f"({inside / total:.1%}); largest relative miss {worst:.1%}")


if __name__ == "__main__":
    main()
