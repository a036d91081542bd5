"""Burst: N runs (default 100,000) due at one instant, dispatched by real `manage.py work`
processes to a local target on 127.0.0.1 that answers 200 at once.

    .venv/bin/python bench/burst.py [--runs 100000] [--repeats 3] [--configs 2x1024x400,3x768x300]

Per configuration and repeat: the run side is emptied, N occurrences + ready runs (+ their
run.created events) are bulk-loaded with next_eligible_at = scheduled_time = T, an instant
--lead seconds ahead; the workers start and poll an empty queue until T. Measured from the
database afterwards: all started = max(first_started_at) - T, all succeeded = max(finished_at) - T,
runs/s = N / all succeeded, lag = first_started_at - scheduled_time (p50/p99). The target counts
the requests it answered (must equal N: every run delivered once), VmHWM gives each worker's peak
RSS, /proc gives the CPU each part used. Goal (issue 7): all started within 20 s (>= 5,000/s).

Database: scheduler_bench_burst (dropped and made again).
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402


def load(sets, total: int, lead: float, via_scanner: bool = False):
    """Empty the run side and make `total` runs due at T, spread over the schedule sets; returns
    T. Either the runs are loaded ready (the scanner's work done beforehand), or (via_scanner)
    only their schedules are made due at T, for real scanners to materialise."""
    C.truncate_runs()
    t = C.sql("SELECT date_trunc('second', statement_timestamp()) + make_interval(secs => %s)", [lead])[0][0]
    left = total
    for s in sets:
        k = min(left, s.count)
        if via_scanner:
            _due_schedules(s, k, t)
        elif k:
            _load(s, k, t)
        left -= k
    C.vacuum_analyze("runs_run", "runs_occurrence", "runs_outboxevent", "runs_attempt", "schedules_schedule")
    return t


def _due_schedules(s, k, t):
    # Schedules 1..k of the set fire at T (rate(1 day) anchored there), the rest in 10 days.
    C.sql(
        "UPDATE schedules_schedule SET next_run_at = CASE WHEN n <= %s THEN %s ELSE %s + interval '10 days' END, "
        "anchor_at = %s FROM generate_series(1, %s) AS n WHERE id = " + s.sid(),
        [k, t, t, t, s.count], fetch=False)


def _load(s, k, t):
    # The instant is a literal here: insert_series binds only its own defaults.
    C.load_due_runs(s, k, f"'{t.isoformat()}'::timestamptz")


def one_run(args, cfg, sets, target, n, tag):
    t = load(sets, n, args.lead, via_scanner=args.scanners > 0 or args.scheduler)
    procs = C.Procs(args.database, {"SCHEDULER_POLL_SECONDS": args.poll})
    if args.scheduler:
        # The all-in-one command as small deployments and the quickstart run it, on its defaults:
        # its own scanner makes the runs, its worker calls them.
        scanners, loops = [], []
        procs.start("scheduler", name=f"scheduler-{tag}")
        procs.wait_connected("scheduler-scheduler", 1)
    else:
        scanners = [procs.start("scan", "--shard", str(i), "--shards", str(args.scanners), name=f"scan-{tag}{i}")
                    for i in range(args.scanners)]
        loops = [procs.start(name, name=f"{name}-{tag}") for name in (("relay", "reconcile") if args.with_loops else ())]
        procs.start_workers(cfg, tag=tag)
        procs.wait_connected("scheduler-work", cfg.workers)
    if scanners:
        procs.wait_connected("scheduler-scan", len(scanners))
    now = C.db_now()
    if now >= t:
        procs.stop()
        raise SystemExit(f"loading and starting took past the instant ({(now - t).total_seconds():.1f}s late): raise --lead")
    delivered0 = target.count()
    # Each worker opens its other sessions (second database lane, LISTEN) as it starts: list the
    # backends just before the instant so the meter sees all of them.
    time.sleep(max(0, (t - now).total_seconds() - 1.0))
    backends = C.backend_pids("scheduler-work") + C.backend_pids("scheduler-scheduler")
    meter = C.CpuMeter()
    groups = {"workers": [p.pid for p in procs.procs if p not in scanners and p not in loops],
              "their PG backends": backends, "target": [p.pid for p in target.procs]}
    if loops:
        groups["relay + reconciler"] = [p.pid for p in loops]
        groups["relay/reconciler PG backends"] = C.backend_pids("scheduler-relay") + C.backend_pids("scheduler-reconcile")
    if scanners:
        groups["scanners"] = [p.pid for p in scanners]
        groups["scanners' PG backends"] = C.backend_pids("scheduler-scan")
    if args.statements:
        C.sql("SELECT pg_stat_statements_reset()")
    meter.start(groups)
    wal0 = C.sql("SELECT pg_current_wal_lsn()")[0][0]
    wait = (t - C.db_now()).total_seconds()
    time.sleep(max(0, wait - 0.05))
    if scanners or args.scheduler:
        # Until the scanners have made every run, an empty queue is not the end.
        C.wait_until(lambda: C.sql("SELECT count(*) FROM runs_run")[0][0] >= n, timeout=args.timeout)
        ready = C.sql("SELECT count(*) FILTER (WHERE created_at <= %s), extract(epoch FROM max(created_at) - %s) "
                      "FROM runs_run", [t, t])[0]
    done = C.wait_drained(procs, timeout=args.timeout)
    cpu = meter.stop()
    # WAL of the whole server while the burst was dispatched (claims, results, events, and
    # whatever else ran meanwhile: full-page images after a checkpoint count here too).
    wal = C.sql("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", [wal0])[0][0]
    if args.statements:
        r_statements = statements(n, args.statements)
    procs.sample_hwm()
    hwm = [procs.hwm.get(p.pid) for p in procs.procs]
    procs.stop()
    r = C.run_outcome(t)
    r["delivered"] = target.count() - delivered0
    r["attempts"] = C.sql("SELECT count(*) FROM runs_attempt")[0][0]
    r["rss"] = hwm[len(scanners) + len(loops):]
    if scanners or args.scheduler:
        r["made_before"], r["last_made"] = ready[0], float(ready[1])
        r["made_after_T"] = n - ready[0]
    r["cpu"] = cpu
    r["wal_per_run"] = float(wal) / n
    r["done"] = done
    if args.statements:
        r["statements"] = r_statements
    r["rate"] = n / r["all_succeeded"] if r["all_succeeded"] else None
    # Throughput once the first claim happened (excludes the idle poll before T).
    r["rate_busy"] = n / (r["all_succeeded"] - r["first_started"]) if r["all_succeeded"] else None
    return r


def statements(n: int, top: int) -> list[str]:
    """The burst's statements by time spent in PostgreSQL (pg_stat_statements: planning +
    execution, wall time of the backend, which on a busy host includes waiting for a core), per
    run, with their WAL and blocks dirtied per run: where a run's database cost goes."""
    rows = C.sql(
        """SELECT calls, total_plan_time + total_exec_time, total_plan_time, rows, wal_bytes, wal_records,
                  shared_blks_dirtied, shared_blks_hit + shared_blks_read,
                  coalesce(substring(query FROM '-- name: ([A-Za-z]+)'), left(regexp_replace(query, '\\s+', ' ', 'g'), 70))
           FROM pg_stat_statements
           WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
             AND query NOT LIKE '%%pg_stat_statements%%'
           ORDER BY 2 DESC LIMIT %s""", [top])
    total = C.sql("""SELECT sum(total_plan_time + total_exec_time), sum(wal_bytes) FROM pg_stat_statements
                     WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())""")[0]
    out = [f"statements (pg_stat_statements, per run): all {float(total[0]) * 1000 / n:.0f} µs, "
           f"WAL {float(total[1]) / n:.0f} B"]
    for calls, ms, plan_ms, nrows, wal, walrec, dirtied, blks, name in rows:
        out.append(f"{float(ms) * 1000 / n:7.1f} µs (plan {float(plan_ms) * 1000 / n:5.1f}) {float(wal) / n:6.0f} B WAL "
                   f"{float(walrec) / n:5.1f} WAL records {float(dirtied) / n:5.2f} dirtied {float(blks) / n:6.1f} blocks  "
                   f"{calls:6d} calls {nrows:7d} rows  {name}")
    return out


def describe(r):
    return (
        f"all started {C.fmt(r['all_started'], 's', 2)}, all succeeded {C.fmt(r['all_succeeded'], 's', 2)}, "
        f"{C.fmt(r['rate'], '', 0)} runs/s ({C.fmt(r['rate_busy'], '', 0)}/s from first claim), "
        f"lag p50 {C.fmt(r['lag_p50'], 's', 2)} p99 {C.fmt(r['lag_p99'], 's', 2)}, "
        f"succeeded {r['succeeded']}/{r['runs']}, delivered {r['delivered']}, attempts {r['attempts']}, "
        f"peak RSS/worker {', '.join(C.fmt(x, '', 0) for x in r['rss'])} MiB, "
        f"WAL while dispatching {r['wal_per_run'] / 1024:.1f} KiB/run"
        + (f", made by the scanners: {r['made_before']} before T (made_after_T={r['made_after_T']}), "
           f"the last {r['last_made']:+.2f}s after T" if "made_before" in r else "")
        + ("" if r["done"] else "  [TIMED OUT]")
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--configs", default="2x1024x400",
                    help="comma-separated WORKERSxCONCURRENCYxBATCH; the best (by median time to all succeeded) is reported")
    ap.add_argument("--tenants", type=int, default=10, help="runs are spread over this many tenants")
    ap.add_argument("--target-procs", type=int, default=1)
    ap.add_argument("--target-kind", choices=["raw", "aiohttp"], default="raw")
    ap.add_argument("--poll", type=float, default=1.0, help="SCHEDULER_POLL_SECONDS for the workers (default as shipped)")
    ap.add_argument("--lead", type=float, default=40.0, help="seconds between the start of loading and the instant")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--scanners", type=int, default=0,
                    help="0: runs are loaded ready; K > 0: only the schedules are made due at T, and K real "
                         "`manage.py scan --shard i --shards K` processes materialise them (the whole path)")
    ap.add_argument("--scheduler", action="store_true",
                    help="one `manage.py scheduler` (scanner, worker, reconciler and relay in one command, on its "
                         "defaults) instead of separate scan and work processes; --configs is then ignored")
    ap.add_argument("--with-loops", action="store_true",
                    help="also run `manage.py relay` and `manage.py reconcile`, as a deployment does (the relay "
                         "publishes or marks every event the burst writes)")
    ap.add_argument("--statements", type=int, default=0,
                    help="print the top K statements of each burst by PostgreSQL time per run, with WAL "
                         "(needs pg_stat_statements in shared_preload_libraries)")
    ap.add_argument("--database", default="scheduler_bench_burst")
    args = ap.parse_args()
    configs = [C.WorkerConfig.parse(x) for x in args.configs.split(",")]

    print(C.machine_line(), flush=True)
    C.ensure_out_dir()
    C.setup_database(args.database)
    if args.statements:
        C.sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements", fetch=False)
    target = C.Target(args.target_procs, args.target_kind)
    try:
        t0 = time.monotonic()
        per = -(-args.runs // args.tenants)
        sets = []
        for i in range(args.tenants):
            tenant = C.load_tenant(f"bench-{i}", target.prefix)
            sets.append(C.load_schedules(f"b{i}", tenant, per, target_url=target.url, expression="rate(1 day)",
                                         next_run_at="now() + interval '10 days'"))
        C.vacuum_analyze("schedules_schedule", "schedules_scheduleversion")
        print(f"loaded {per * args.tenants} schedules over {args.tenants} tenants in {time.monotonic() - t0:.1f}s; "
              f"target: {args.target_procs} x {args.target_kind} on {target.url}", flush=True)
        results = {}
        for cfg in configs:
            results[cfg.key] = []
            for rep in range(args.repeats):
                t1 = time.monotonic()
                r = one_run(args, cfg, sets, target, args.runs, tag=f"{cfg.key}-{rep}-")
                results[cfg.key].append(r)
                print(f"  [{cfg.key} #{rep + 1}] {describe(r)}  ({time.monotonic() - t1:.0f}s with loading)", flush=True)
                print(f"      {C.cpu_line(r['cpu'])}", flush=True)
                for line in r.get("statements", []):
                    print(f"      {line}", flush=True)

        print(f"\nburst: {args.runs} runs due at one instant, target answering 200 at once "
              f"({args.target_procs} x {args.target_kind}), worker poll {args.poll}s, median of {args.repeats}:")
        best = None
        for cfg in configs:
            rs = results[cfg.key]
            m = C.median([r["all_succeeded"] for r in rs])
            print(f"  {cfg}:")
            print(f"    all started    {C.spread([r['all_started'] for r in rs], 2, 's')}")
            print(f"    all succeeded  {C.spread([r['all_succeeded'] for r in rs], 2, 's')}")
            print(f"    runs/s         {C.spread([r['rate'] for r in rs], 0)}  (from first claim: {C.fmt(C.median([r['rate_busy'] for r in rs]), '', 0)})")
            print(f"    lag p50        {C.spread([r['lag_p50'] for r in rs], 3, 's')}")
            print(f"    lag p99        {C.spread([r['lag_p99'] for r in rs], 3, 's')}")
            rss = [x for r in rs for x in r["rss"] if x]
            print(f"    peak RSS/worker median {C.fmt(C.median(rss), ' MiB', 0)}, max {C.fmt(max(rss) if rss else None, ' MiB', 0)}")
            ok = all(r["succeeded"] == args.runs == r["delivered"] == r["attempts"] for r in rs)
            if "made_after_T" in rs[0]:
                print(f"    made_after_T   {C.spread([r['made_after_T'] for r in rs], 0)}  (goal 0: every run made before its instant)")
            print(f"    delivery check {'OK: every run succeeded once, the target answered exactly N requests' if ok else 'MISMATCH (see lines above)'}")
            if m is not None and (best is None or m < best[1]):
                best = (cfg, m)
        if best:
            cfg = best[0]
            rs = results[cfg.key]
            started = C.median([r["all_started"] for r in rs])
            print(f"best: {cfg}; goal all started <= 20 s: {'met' if started is not None and started <= 20 else 'NOT met'} "
                  f"({C.fmt(started, 's', 2)})")
    finally:
        target.close()


if __name__ == "__main__":
    main()
