"""What evaluating expressions costs: validation (parse) and next_after, for a corpus of issue 13's
pathological expressions, peers' hard cases and ordinary schedules, anchored from 1970 to now.

    .venv/bin/python bench/timeexpr_costs.py [--calls 300] [--repeats 5] [--zone America/New_York]
        [--only SUBSTRING] [--quiet]

No database. For each expression and anchor (the schedule's startAt, so an RRULE without DTSTART
starts then: its age):

- validation: the first parse in this process (cold: zone, year-shape and shared filter tables
  built) and the median of --repeats more (warm), in CPU milliseconds (time.thread_time), with
  the work units the budget counted and the outcome (accepted, or the start of the refusal);
- next_after, for accepted rules: --calls calls as a scanner makes them (each from the previous
  occurrence, starting at --now) and as many from points spread over the next 75 years; CPU time
  per call (p50, p99, max) and the most work units one call used.

A summary at the end gives the worst validation, the p99 and max of next_after over every call,
and the budgets the engine enforces (schedules/timeexpr/budget.py). Everything printed is
measured on this run; the machine line says where.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402

sys.path.insert(0, str(C.CODE))
from schedules import timeexpr  # noqa: E402
from schedules.timeexpr import ExpressionError, budget  # noqa: E402

UTC = timezone.utc
ANCHORS = [datetime(1970, 1, 1, tzinfo=UTC), datetime(1990, 1, 1, tzinfo=UTC), datetime(2010, 1, 1, tzinfo=UTC),
           datetime(2026, 11, 30, tzinfo=UTC)]

# (expression, zone or None for --zone)
ISSUE = [
    ("45 9-9/4 * * *", None),
    ("DTSTART:20261101T000000\nRRULE:FREQ=HOURLY;COUNT=2", None),
    ("DTSTART:20261101T000000\nRRULE:FREQ=HOURLY;UNTIL=20261101T060000Z", None),
    ("DTSTART:20261025T013000\nRRULE:FREQ=DAILY;UNTIL=20261101T060000Z", None),
    ("0 0 29 2 */7", None),
    ("0 0 30 2 MON#5", None),
    ("0 0 * 2 MON#5", None),
    ("0 0 30 2 *", None),
    ("0 0 31 4,6,9,11 *", None),
    ("rate(1000000000 days)", None),
    ("rate(99999999999999999999 days)", None),
    ("at(9999-12-31T23:59:59)", "America/New_York"),
    ("at(0001-01-01T00:00:00)", "Asia/Tokyo"),
    ("at(9999-12-31T23:59:59-12:00)", None),
    ("RRULE:FREQ=DAILY;INTERVAL=99999999999999999999", None),
    ("DTSTART:99991231T230000\nRRULE:FREQ=DAILY;UNTIL=99991231T235959Z", "Etc/GMT-14"),
    ("RRULE:FREQ=HOURLY;BYSETPOS=2", None),
    ("RRULE:FREQ=MINUTELY;BYSETPOS=2", None),
    ("RRULE:FREQ=SECONDLY;BYSETPOS=2", None),
    ("RRULE:FREQ=DAILY;BYSETPOS=2", None),
    ("RRULE:FREQ=WEEKLY;BYSETPOS=9", None),
    ("RRULE:FREQ=DAILY;INTERVAL=0", None),
    ("DTSTART:19700101T000000\nRRULE:FREQ=SECONDLY;COUNT=2000000000", None),
    ("DTSTART:20000101T000000\nRRULE:FREQ=MINUTELY;COUNT=100000000", None),
    ("RRULE:FREQ=DAILY;BYMONTH=2;BYMONTHDAY=30", None),
    ("RRULE:FREQ=MONTHLY", None),
    ("RRULE:FREQ=MONTHLY;COUNT=100000", None),
    ("RRULE:FREQ=YEARLY;COUNT=5000", None),
]
HARD = [
    ("RRULE:FREQ=MONTHLY;BYDAY=MO,TU,WE,TH,FR;BYSETPOS=-1", None),
    ("RRULE:FREQ=WEEKLY;BYDAY=MO,WE;BYSETPOS=-1;COUNT=5000", None),
    ("RRULE:FREQ=YEARLY;BYWEEKNO=53;BYDAY=TH", None),
    ("RRULE:FREQ=MINUTELY;BYMONTH=2;BYMONTHDAY=29;BYDAY=MO;BYHOUR=3", None),
    ("RRULE:FREQ=MINUTELY;INTERVAL=1439;BYHOUR=0;BYMINUTE=0", None),
    ("RRULE:FREQ=SECONDLY;INTERVAL=86401;BYHOUR=3;BYMINUTE=0;BYSECOND=0", None),
    ("RRULE:FREQ=HOURLY;INTERVAL=7;BYDAY=SU;BYHOUR=1,2,3", None),
    ("RRULE:FREQ=DAILY;INTERVAL=5;BYMONTH=2;BYMONTHDAY=29", None),
    ("RRULE:FREQ=MONTHLY;INTERVAL=7;BYMONTHDAY=31;BYDAY=FR;COUNT=1000", None),
    ("RRULE:FREQ=SECONDLY;BYHOUR=9;BYMINUTE=30;COUNT=100000", None),
    ("RRULE:FREQ=DAILY;INTERVAL=3;BYMONTHDAY=31;COUNT=50000", None),
    ("0-59 0-23 * * *", None),
    ("* * 29 2 1", None),
    ("0 0 L * 5L", None),
    ("1 1 */100,1-7 * MON", None),
    ("*/15 * * * *", "Australia/Lord_Howe"),
    ("0 0 * * *", "Pacific/Apia"),
    ("* * * * *", "Asia/Manila"),
]
NORMAL = [
    ("*/5 * * * *", None),
    ("0 9 * * 1-5", None),
    ("30 2 * * *", None),
    ("0 0 1 * *", None),
    ("@hourly", None),
    ("rate(15 minutes)", None),
    ("RRULE:FREQ=DAILY;BYHOUR=9;BYMINUTE=0;BYSECOND=0", None),
    ("RRULE:FREQ=WEEKLY;BYDAY=MO,WE,FR;BYHOUR=8;BYMINUTE=30", None),
    ("RRULE:FREQ=YEARLY;BYMONTH=3;BYDAY=-1SU;BYHOUR=1", "Europe/London"),
    ("RRULE:FREQ=HOURLY;INTERVAL=5", None),
    ("at(2027-06-01T09:00:00)", None),
]


def cpu_ms(fn):
    t = time.thread_time_ns()
    with budget.metered("bench", 10**12, 10**6) as m:
        try:
            got = fn()
        except ExpressionError as e:
            got = e
    return got, (time.thread_time_ns() - t) / 1e6, m.used


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def run(expr, zone, anchor, now, args, all_calls):
    zone = zone or args.zone
    parse = lambda: timeexpr.parse(expr, zone, anchor=anchor)  # noqa: E731
    gc.collect()
    first, first_ms, first_units = cpu_ms(parse)
    warm = [cpu_ms(parse)[1] for _ in range(args.repeats)]
    row = {"expr": expr.replace("\n", "\\n"), "zone": zone, "anchor": anchor.year, "first_ms": first_ms,
           "warm_ms": statistics.median(warm) if warm else first_ms, "units": first_units}
    if isinstance(first, ExpressionError):
        row["outcome"] = f"{type(first).__name__}: {str(first)[:70]}"
        return row
    row["outcome"] = "accepted"
    rule = first
    times, units = [], []
    t = max(anchor, now)
    for _ in range(args.calls):
        occ, ms, u = cpu_ms(lambda: rule.next_after(t))
        times.append(ms)
        units.append(u)
        if occ is None or isinstance(occ, ExpressionError):
            break
        t = occ.at
    for k in range(args.calls):
        after = now + timedelta(days=k * 75 * 365.25 / args.calls, seconds=k * 7919 % 86400)
        occ, ms, u = cpu_ms(lambda: rule.next_after(after))
        times.append(ms)
        units.append(u)
    all_calls.extend(times)
    row.update(p50=pct(times, 0.5), p99=pct(times, 0.99), max=max(times), max_units=max(units), calls=len(times))
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--zone", default="America/New_York")
    ap.add_argument("--now", default="2026-11-30T12:00:00+00:00")
    ap.add_argument("--only", default="")
    ap.add_argument("--quiet", action="store_true", help="summary only")
    args = ap.parse_args()
    now = datetime.fromisoformat(args.now)
    print(C.machine_line(pg_version="no database used"))
    print(f"tz database {timeexpr.tzdata_version()}; default zone {args.zone}; next_after from {now:%Y-%m-%d}; "
          f"budgets: validation {budget.VALIDATION_UNITS} units / {budget.VALIDATION_CPU_SECONDS * 1000:.0f} ms CPU, "
          f"probe {budget.PROBE_UNITS}, next_after {budget.NEXT_AFTER_UNITS}, preview {budget.PREVIEW_UNITS} units")
    rows, all_calls = [], []
    for group, corpus in (("issue 13", ISSUE), ("hard", HARD), ("normal", NORMAL)):
        if not args.quiet:
            print(f"\n## {group}\n")
            print(f"{'expression':58} {'zone':18} {'anchor':>6} {'first ms':>8} {'warm ms':>7} {'units':>6}  "
                  f"{'next p50':>8} {'p99':>6} {'max':>6} {'units':>5}  outcome")
        for expr, zone in corpus:
            if args.only and args.only not in expr:
                continue
            for anchor in ANCHORS:
                row = run(expr, zone, anchor, now, args, all_calls)
                row["group"] = group
                rows.append(row)
                if args.quiet:
                    continue
                nxt = (f"{row['p50']:8.3f} {row['p99']:6.3f} {row['max']:6.3f} {row['max_units']:5d}" if "p50" in row
                       else f"{'':8} {'':6} {'':6} {'':5}")
                print(f"{row['expr'][:58]:58} {row['zone'][:18]:18} {row['anchor']:>6} {row['first_ms']:8.2f} "
                      f"{row['warm_ms']:7.2f} {row['units']:6d}  {nxt}  {row['outcome']}")
    worst = max(rows, key=lambda r: r["first_ms"])
    worst_warm = max(rows, key=lambda r: r["warm_ms"])
    accepted = [r for r in rows if "p50" in r]
    print("\n## summary\n")
    print(f"expressions x anchors: {len(rows)}; accepted {len(accepted)}, refused {len(rows) - len(accepted)}")
    print(f"validation CPU, first parse: max {worst['first_ms']:.2f} ms ({worst['expr'][:60]}, {worst['anchor']}); "
          f"p50 {statistics.median(r['first_ms'] for r in rows):.2f} ms")
    print(f"validation CPU, warm: max {worst_warm['warm_ms']:.2f} ms ({worst_warm['expr'][:60]}, {worst_warm['anchor']}); "
          f"p50 {statistics.median(r['warm_ms'] for r in rows):.2f} ms")
    print(f"validation units: max {max(r['units'] for r in rows)} (budget {budget.VALIDATION_UNITS})")
    if all_calls:
        print(f"next_after CPU over {len(all_calls)} calls: p50 {pct(all_calls, .5):.3f} ms, p99 {pct(all_calls, .99):.3f} ms, "
              f"max {max(all_calls):.3f} ms; most units in one call {max(r['max_units'] for r in accepted)} "
              f"(probe budget {budget.PROBE_UNITS})")
        worst_p99 = max(accepted, key=lambda r: r["p99"])
        print(f"worst per-rule next_after p99: {worst_p99['p99']:.3f} ms ({worst_p99['expr'][:60]}, {worst_p99['zone']}, "
              f"anchor {worst_p99['anchor']})")


if __name__ == "__main__":
    main()
