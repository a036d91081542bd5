"""The midnight burst with and without spread (issue 28): N daily schedules of one tenant at one
minute, plus another tenant's schedules at the same minute, made by a real scanner and dispatched
by real workers to a local target that answers 200 at once.

    .venv/bin/python bench/spread_burst.py [--herd 20000] [--other 200] [--spread 600] [--repeats 2]

Per round, interleaved (no spread, spread, no spread, spread, ...): the run side is emptied; every
schedule gets the daily cron `M H * * *` of a whole minute T at least --lead seconds ahead, with
next_run_at = T and the overlap policy --overlap (`allow`, the default here, is made ahead of T by
the scanner's look-ahead; `skip` is made at T); the herd's versions get spreadSeconds = --spread (offsets from
schedules.spread.spread_offset, as the product computes them) or 0. A bench shortcut: versions are
changed in place by SQL, where the product would make a new version per edit. Then `manage.py scan`
and `manage.py work` processes start, and the round ends when every run has succeeded. Measured
from the database:

- peak due per second: the most runs whose eligible time (next_eligible_at) falls in one second;
- the other tenant's start lag (first_started_at - eligible time): p50, p99, max;
- the herd's: every run's eligible time in [T, T + window), started no earlier, and the last start
  after T + window (0 or less: all started within their window);
- made after the instant: runs created after their nominal time T (goal 0);
- nothing lost or doubled: one run per schedule, each succeeded once, the target's count of requests
  equal to the runs.

Load average printed each round. Database: scheduler_bench_spread_burst (dropped and made again).
"""

import argparse
import os
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402


def load(args, target):
    herd_t = C.load_tenant("herd", target.prefix)
    other_t = C.load_tenant("other", target.prefix)
    herd = C.load_schedules("herd", herd_t, args.herd, target_url=target.url + "/herd", expression="0 0 * * *",
                            next_run_at="now() + interval '10 days'")
    other = C.load_schedules("other", other_t, args.other, target_url=target.url + "/other",
                             expression="0 0 * * *", next_run_at="now() + interval '10 days'")
    # Each herd schedule's offset under the window, computed once as the product does.
    from schedules.spread import spread_offset

    ids = [r[0] for r in C.sql("SELECT id FROM schedules_schedule WHERE tenant_id = %s", [herd_t.id])]
    C.sql("CREATE TABLE bench_offsets (schedule_id uuid PRIMARY KEY, off integer NOT NULL)", fetch=False)
    for i in range(0, len(ids), 10_000):
        part = ids[i:i + 10_000]
        C.sql("INSERT INTO bench_offsets SELECT * FROM unnest(%s::uuid[], %s::integer[])",
              [[str(x) for x in part], [spread_offset(uuid.UUID(str(x)), args.spread) for x in part]], fetch=False)
    C.vacuum_analyze("schedules_schedule", "schedules_scheduleversion", "bench_offsets")
    return herd_t, other_t, herd, other


def prepare(args, herd_t, spread: int):
    """Empty the run side; every schedule due at T (a whole minute), the herd spread or not."""
    C.truncate_runs()
    t = C.sql("SELECT date_trunc('minute', statement_timestamp() + make_interval(secs => %s)) + interval '1 minute'",
              [args.lead])[0][0]
    expression = f"{t.minute} {t.hour} * * *"
    C.sql("UPDATE schedules_scheduleversion SET expression = %s, spread_seconds = 0, spread_offset_seconds = 0, "
          "overlap_policy = %s", [expression, args.overlap], fetch=False)
    if spread:
        C.sql("UPDATE schedules_scheduleversion v SET spread_seconds = %s, spread_offset_seconds = o.off "
              "FROM bench_offsets o WHERE v.schedule_id = o.schedule_id", [spread], fetch=False)
    C.sql("UPDATE schedules_schedule SET next_run_at = %s, anchor_at = %s - interval '1 day'", [t, t], fetch=False)
    C.vacuum_analyze("runs_run", "runs_occurrence", "runs_outboxevent", "runs_attempt", "schedules_schedule",
                     "schedules_scheduleversion")
    return t


def one_round(args, cfg, herd_t, other_t, target, spread: int, tag: str) -> dict:
    n = args.herd + args.other
    t = prepare(args, herd_t, spread)
    procs = C.Procs(args.database, {"SCHEDULER_POLL_SECONDS": args.poll})
    try:
        for i in range(args.scanners):
            procs.start("scan", "--shard", str(i), "--shards", str(args.scanners), name=f"scan-{tag}{i}")
        procs.start_workers(cfg, tag=tag)
        procs.wait_connected("scheduler-work", cfg.workers)
        procs.wait_connected("scheduler-scan", args.scanners)
        if C.db_now() >= t:
            raise SystemExit("starting took past the instant: raise --lead")
        delivered0 = target.count()
        wait = (t - C.db_now()).total_seconds()
        time.sleep(max(0, wait))
        C.wait_until(lambda: C.sql("SELECT count(*) FROM runs_run")[0][0] >= n,
                     timeout=args.timeout + spread)
        done = C.wait_drained(procs, timeout=args.timeout + spread, stall=max(30.0, spread + 30.0))
    finally:
        procs.stop()
    r = {"done": done, "delivered": target.count() - delivered0, "spread": spread, "load": os.getloadavg()}
    row = C.sql("SELECT count(*), count(DISTINCT schedule_id), count(*) FILTER (WHERE state = 'succeeded'), "
                "count(*) FILTER (WHERE created_at > scheduled_time), "
                "count(*) FILTER (WHERE scheduled_time <> %s) FROM runs_run", [t])[0]
    r.update(runs=row[0], schedules=row[1], succeeded=row[2], made_after=row[3], nominal_off=row[4])
    r["attempts"] = C.sql("SELECT count(*) FROM runs_attempt")[0][0]
    # A run's eligible time is its nominal instant plus its version's offset (next_eligible_at is
    # cleared once it leaves `ready`).
    runs = ("(SELECT r.*, r.scheduled_time + make_interval(secs => v.spread_offset_seconds) AS eligible, "
            "v.spread_seconds AS win FROM runs_run r JOIN schedules_scheduleversion v ON v.id = r.version_id) e")
    r["peak_per_second"] = C.sql(f"SELECT coalesce(max(c), 0) FROM (SELECT count(*) c FROM {runs} "
                                 "GROUP BY date_trunc('second', eligible)) x")[0][0]
    for who, tenant in (("other", other_t), ("herd", herd_t)):
        lag = C.sql("SELECT percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP "
                    "(ORDER BY extract(epoch FROM first_started_at - eligible)), "
                    f"max(extract(epoch FROM first_started_at - eligible)) FROM {runs} WHERE tenant_id = %s",
                    [tenant.id])[0]
        r[f"{who}_p50"], r[f"{who}_p99"], r[f"{who}_max"] = lag[0][0], lag[0][1], float(lag[1])
    row = C.sql("SELECT count(*) FILTER (WHERE eligible >= scheduled_time "
                "AND eligible < scheduled_time + make_interval(secs => greatest(win, 1))), "
                "count(*) FILTER (WHERE first_started_at < eligible), "
                "extract(epoch FROM max(first_started_at) - (%s + make_interval(secs => %s))), "
                f"max(extract(epoch FROM eligible - scheduled_time)) FROM {runs} WHERE tenant_id = %s",
                [t, spread, herd_t.id])[0]
    r.update(eligible_in_window=row[0], started_early=row[1], last_start_past_window=float(row[2]),
             max_offset=float(row[3]))
    return r


def describe(r, args):
    return (f"spread {r['spread']:>4} s: peak {r['peak_per_second']:,} due/s; other tenant's lag p50 "
            f"{C.fmt(r['other_p50'], 's', 3)} p99 {C.fmt(r['other_p99'], 's', 3)} max {C.fmt(r['other_max'], 's', 2)}; "
            f"herd lag p99 {C.fmt(r['herd_p99'], 's', 2)}; herd eligible in window {r['eligible_in_window']:,}/"
            f"{args.herd:,}, started before eligible {r['started_early']}, last start {r['last_start_past_window']:+.1f} s "
            f"from T + window; made after the instant {r['made_after']}; runs {r['runs']:,} for {r['schedules']:,} "
            f"schedules, succeeded {r['succeeded']:,}, attempts {r['attempts']:,}, delivered {r['delivered']:,}"
            f"{'' if r['done'] else ' [TIMED OUT]'}; load average {' '.join(f'{x:.2f}' for x in r['load'])}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--herd", type=int, default=20_000)
    ap.add_argument("--other", type=int, default=200)
    ap.add_argument("--spread", type=int, default=600)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--config", default="2x256x200",
                    help="WORKERSxCONCURRENCYxBATCH (default: two workers at the settings' defaults, "
                         "SCHEDULER_WORKER_CONCURRENCY 256 and SCHEDULER_CLAIM_BATCH 200)")
    ap.add_argument("--scanners", type=int, default=1)
    ap.add_argument("--poll", type=float, default=1.0)
    ap.add_argument("--lead", type=float, default=150.0,
                    help="seconds from preparing a round to the instant: the scanner's look-ahead "
                         "(SCHEDULER_LOOKAHEAD_SECONDS, 120) fits in it")
    ap.add_argument("--overlap", default="allow", choices=["allow", "skip"],
                    help="the schedules' overlap policy: only `allow` is made ahead of the instant (runs.decisions."
                         "made_ahead); with `skip` the scanner makes every run at the instant itself")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--database", default="scheduler_bench_spread_burst")
    args = ap.parse_args()
    cfg = C.WorkerConfig.parse(args.config)
    print(C.machine_line(), flush=True)
    C.ensure_out_dir()
    C.setup_database(args.database)
    target = C.Target(1, "raw")
    try:
        t0 = time.monotonic()
        herd_t, other_t, _, _ = load(args, target)
        print(f"loaded {args.herd:,} + {args.other:,} schedules in {time.monotonic() - t0:.1f} s; {cfg}, "
              f"{args.scanners} scanner(s), overlap policy {args.overlap}", flush=True)
        results = {0: [], args.spread: []}
        for rep in range(args.repeats):
            for spread in (0, args.spread):
                r = one_round(args, cfg, herd_t, other_t, target, spread, tag=f"s{spread}-{rep}-")
                results[spread].append(r)
                print(f"  [{rep + 1}] {describe(r, args)}", flush=True)
        print(f"\nmidnight burst: {args.herd:,} daily schedules of one tenant and {args.other:,} of another at one "
              f"minute, median of {args.repeats}:")
        for spread, rs in results.items():
            print(f"  spread {spread} s: peak due/s {C.spread([r['peak_per_second'] for r in rs], 0)}; other tenant's "
                  f"lag p99 {C.spread([r['other_p99'] for r in rs], 3, 's')}; made after the instant "
                  f"{[r['made_after'] for r in rs]}; all eligible in window "
                  f"{all(r['eligible_in_window'] == args.herd for r in rs)}; one run per schedule, delivered once "
                  f"{all(r['runs'] == r['schedules'] == r['succeeded'] == r['attempts'] == r['delivered'] == args.herd + args.other for r in rs)}")
        p0 = C.median([r["other_p99"] for r in results[0]])
        p1 = C.median([r["other_p99"] for r in results[args.spread]])
        if p0 is not None and p1:
            print(f"other tenant's p99 lag without / with spread: {p0 / p1:.1f}x (goal: at least 10x)")
    finally:
        target.close()


if __name__ == "__main__":
    main()
