"""Forecast cost (issue 28): the time of one forecast (dispatch.forecast.forecast) over a large
fleet, interleaved rounds, load average printed after each:

- incremental: from the group counts the database keeps (dispatch.forecast_store), every schedule
  counted exactly;
- full exact: every schedule grouped again from the schedules (the forecast with incremental=False
  and no size limit);
- bounded: from the schedules, exact up to EXACT_SCHEDULES, a uniform sample beyond (what a
  spread's preview reads), with the sample's stated error checked against the exact count;
- one tenant of 20,000 schedules both ways, and a tenant of 120 every-minute schedules over the week.

Before the rounds: the kept summary built from the schedules (the fast loader loads with the
triggers off; the migration fills it the same way), --advance schedules advanced in the scanner's
statement with the summary's trigger off and on (what keeping it costs the scanner), and an
incremental read after those advances checked bucket by bucket against the full exact count.

    .venv/bin/python bench/forecast_cost.py [--schedules 1000000] [--tenant-schedules 20000] [--repeats 3]
        [--database scheduler_bench_forecast] [--reuse] [--advance 100000]

Loaded with bench/common.py's load_schedules_fast (one INSERT ... SELECT generate_series per table
and part, triggers off and indexes built after): a big tenant with --schedules schedules, 45%
`0 0 * * *` UTC (next run at the next midnight), 40% `*/15 * * * *` UTC (the next quarter hour),
10% `0 9 * * 1-5` America/New_York (the next weekday morning there), 5% `rate(1 hour)` (the next
hour), a tenth of each with a 600 s spread (offsets spread over the window); a second tenant with
--tenant-schedules `0 0 * * *` due at the next midnight; a third with 120 `* * * * *`.

Database: --database (dropped and made again unless --reuse).
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
    ap.add_argument("--advance", type=int, default=100_000,
                    help="schedules whose next_run_at the bench advances as the scanner does")
    ap.add_argument("--database", default="scheduler_bench_forecast")
    ap.add_argument("--reuse", action="store_true", help="keep the database a previous run loaded")
    a = ap.parse_args()
    C.setup_database(a.database, fresh=not a.reuse)
    print(C.machine_line())
    if not a.reuse:
        load(a)
    summary(a)
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


def _figures(f):
    return {name: [(b.start, b.due, b.min_grace, sorted(b.hosts.items())) for b in bs] for name, bs in f.tiers.items()}


def _load_line():
    return f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"


def summary(a):
    """The forecast's kept summary (dispatch.forecast_store): built once from the schedules (the
    fast loader loads with the triggers off), then what keeping it costs the scanner's advance,
    and an incremental read after changes against the full count."""
    from dispatch import forecast as fc
    from dispatch import forecast_store
    from dispatch.models import ForecastDelta, ForecastGroup

    t = time.perf_counter()
    forecast_store.rebuild()
    print(f"summary built from the schedules (as migration dispatch 0007 fills it): {time.perf_counter() - t:.1f} s, "
          f"{ForecastGroup.objects.count():,} group rows; {_load_line()}", flush=True)
    # The scanner's advance as its statement makes it (ScheduleAdvance: next_run_at by id, a batch
    # at a time), with the summary's trigger off and on: what keeping the summary costs the scanner.
    ids = [r[0] for r in C.sql("SELECT id FROM schedules_schedule WHERE name LIKE 'quarter-%%' LIMIT %s",
                               [a.advance])]
    advance = ("UPDATE schedules_schedule s SET next_run_at = s.next_run_at + interval '15 minutes' "
               "FROM unnest(%s::uuid[]) AS v(id) WHERE s.id = v.id")
    for label, state in (("off", "DISABLE"), ("on", "ENABLE"), ("off", "DISABLE"), ("on", "ENABLE")):
        C.sql(f"ALTER TABLE schedules_schedule {state} TRIGGER forecast_schedule_updated", fetch=False)
        spent = 0.0
        for i in range(0, len(ids), 500):  # the scanner's batches
            t = time.perf_counter()
            C.sql(advance, [[str(x) for x in ids[i:i + 500]]], fetch=False)
            spent += time.perf_counter() - t
        if label == "off":  # moved back with the trigger still off, so the summary stays right
            C.sql("UPDATE schedules_schedule s SET next_run_at = s.next_run_at - interval '15 minutes' "
                  "FROM unnest(%s::uuid[]) AS v(id) WHERE s.id = v.id", [[str(x) for x in ids]], fetch=False)
        print(f"  advancing {len(ids):,} schedules in batches of 500, summary trigger {label}: {spent:.2f} s "
              f"({spent / max(len(ids), 1) * 1e6:.0f} us a schedule); {_load_line()}", flush=True)
    C.sql("ALTER TABLE schedules_schedule ENABLE TRIGGER forecast_schedule_updated", fetch=False)
    print(f"  deltas not folded: {ForecastDelta.objects.count():,}", flush=True)
    t = time.perf_counter()
    inc = fc.forecast(incremental=True)
    t_inc = time.perf_counter() - t
    saved = fc.EXACT_SCHEDULES
    fc.EXACT_SCHEDULES = 10 ** 12
    try:
        t = time.perf_counter()
        full = fc.forecast(incremental=False, now=inc.now)
        t_full = time.perf_counter() - t
    finally:
        fc.EXACT_SCHEDULES = saved
    print(f"after the advances: incremental read (folding {ForecastDelta.objects.count():,} deltas left) {t_inc:.2f} s, "
          f"full exact {t_full:.2f} s; incremental == full exact, every bucket: {_figures(inc) == _figures(full)}; "
          f"{_load_line()}", flush=True)


def measure(a):
    from dispatch import forecast as fc
    from schedules.models import Tenant

    small_id = Tenant.objects.get(slug="small").id
    minutely_id = Tenant.objects.get(slug="minutely").id
    print(f"scope size from the kept counts: {fc._scope_size(None):,} schedules; exact up to {fc.EXACT_SCHEDULES:,}, "
          f"sample of about {fc.SAMPLE_SCHEDULES:,} beyond")
    exact_all = None
    rounds = {"bounded, from the schedules (every tenant)": {"incremental": False},
              "full exact, from the schedules (every tenant)": {"exact": True, "incremental": False},
              "incremental, from the kept summary (every tenant)": {"incremental": True},
              "one tenant (small), from the schedules": {"tenant_ids": [small_id], "incremental": False},
              "one tenant (small), incremental": {"tenant_ids": [small_id], "incremental": True},
              "120 every-minute schedules, a week, incremental": {"tenant_ids": [minutely_id], "incremental": True}}
    times = {k: [] for k in rounds}
    last = {}
    for _ in range(a.repeats):  # interleaved rounds
        now = C.db_now()  # one instant for the round's forecasts, so their buckets compare
        for label, kwargs in rounds.items():
            kwargs = dict(kwargs, now=now)
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
    exact_all = last["full exact, from the schedules (every tenant)"]
    sampled = last["bounded, from the schedules (every tenant)"]
    print(f"incremental == full exact, every bucket of every tier: "
          f"{_figures(last['incremental, from the kept summary (every tenant)']) == _figures(exact_all)}")
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
