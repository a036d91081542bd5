"""Retention under load: many "days" of history at a steady 278 runs/s (1,000,000 an hour) with time
compressed, a short retention, and removal running all along; disk use, start lag during removals,
and a check that nothing unfinished was removed.

    .venv/bin/python bench/retention_load.py [--minutes 70] [--day 60] [--keep-days 3] [--dead-days 5]

A "day" is `--day` seconds: partitions are that wide (SCHEDULER_PARTITION_SECONDS), finished runs are
kept `--keep-days` of them and dead runs `--dead-days` (SCHEDULER_RETENTION_DAYS and
SCHEDULER_DEAD_RETENTION_DAYS in real days), and the `maintain` loop runs every 5 s. The outbox's
retention is whole hours (SCHEDULER_OUTBOX_RETENTION_HOURS, here 1): its partitions go after an
hour, so its size is flat only after that.

The load, as bench/steady.py makes it: 16,680 `rate(1 minute)` schedules (278 due per second) made
due by a real `manage.py scan` and dispatched by real `manage.py work` processes to a local target;
besides them, 100 schedules whose target refuses connections (their runs retry and go dead: dead
runs outlive their partitions and are moved to the kept one), and 500 runs made ready for an
instant before the first partition and eligible only next year (never claimed: they must survive
every removal). `manage.py reconcile` and `manage.py maintain` run beside them.

Printed: database and per-table size every few "days"; every removal (partition, rows kept, how
long the tables were locked); start lag p50/p99 over the whole run and for the runs due while a
removal held the lock (+-2 s); and the checks: the 500 unclaimed runs are all there, every
occurrence of the retention window of every schedule is there, dead runs younger than their
retention are there, the invariant checker finds nothing.

Database: scheduler_bench_retention (dropped and made again).
"""

import argparse
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402

TABLES = ("runs_run", "runs_attempt", "runs_occurrence", "runs_outboxevent")


def table_bytes() -> dict:
    out = {}
    for t in TABLES:
        out[t] = C.sql("SELECT coalesce(sum(pg_total_relation_size(inhrelid)), 0) FROM pg_inherits "
                       "WHERE inhparent = %s::regclass", [t])[0][0]
    out["database"] = C.sql("SELECT pg_database_size(current_database())")[0][0]
    return out


def mb(x) -> str:
    return f"{x / 2**20:,.0f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=70.0)
    ap.add_argument("--day", type=int, default=60, help="seconds in a compressed day (the partition width)")
    ap.add_argument("--keep-days", type=float, default=3.0, help="finished runs are kept this many compressed days")
    ap.add_argument("--dead-days", type=float, default=5.0, help="dead runs are kept this many compressed days")
    ap.add_argument("--rate", type=int, default=278)
    ap.add_argument("--config", default="2x256x200")
    ap.add_argument("--database", default="scheduler_bench_retention")
    args = ap.parse_args()
    day = args.day / 86400
    env = {
        "SCHEDULER_PARTITION_SECONDS": args.day,
        "SCHEDULER_PARTITION_AHEAD_SECONDS": 3 * args.day,
        "SCHEDULER_RETENTION_DAYS": args.keep_days * day,
        "SCHEDULER_DEAD_RETENTION_DAYS": args.dead_days * day,
        "SCHEDULER_MAINTENANCE_SECONDS": 5,
        "SCHEDULER_OUTBOX_RETENTION_HOURS": 1,
        "SCHEDULER_POLL_SECONDS": 1.0,
        "SCHEDULER_HORIZON_SECONDS": 10,
        "SCHEDULER_MAX_SCHEDULES_PER_TENANT": 0,
    }
    os.environ.update({k: str(v) for k, v in env.items()})

    print(C.machine_line(), flush=True)
    print(f"a day is {args.day}s; finished runs kept {args.keep_days} days ({args.keep_days * args.day:.0f}s), "
          f"dead {args.dead_days} ({args.dead_days * args.day:.0f}s); {args.rate} runs/s for {args.minutes} min", flush=True)
    C.ensure_out_dir()
    C.setup_database(args.database)
    target = C.Target(1)
    procs = C.Procs(args.database, env)
    try:
        tenant = C.load_tenant("ret", target.prefix)
        from schedules.models import TargetPrefix

        TargetPrefix.objects.create(tenant_id=tenant.id, prefix="http://127.0.0.1:1/")
        n = args.rate * 60
        start = C.sql("SELECT date_trunc('second', statement_timestamp()) + interval '20 seconds'")[0][0]
        s = f"'{start.isoformat()}'::timestamptz"
        C.load_schedules("rl", tenant, n, target_url=target.url, expression="rate(1 minute)",
                         next_run_at=f"{s} + make_interval(secs => mod(n, 60))",
                         anchor_at=f"{s} + make_interval(secs => mod(n, 60) - 60)")
        C.load_schedules("rd", tenant, 100, target_url="http://127.0.0.1:1/refused", expression="rate(1 minute)",
                         next_run_at=f"{s} + make_interval(secs => mod(n, 60))",
                         anchor_at=f"{s} + make_interval(secs => mod(n, 60) - 60)")
        stuck = C.load_schedules("rs", tenant, 500, target_url=target.url, expression="rate(1 day)",
                                 next_run_at="now() + interval '400 days'")
        C.load_due_runs(stuck, 500, "now() - interval '1 day'")
        C.sql("UPDATE runs_run SET next_eligible_at = now() + interval '365 days' WHERE state = 'ready'", fetch=False)
        stuck_ids = [r[0] for r in C.sql("SELECT id FROM runs_run WHERE state = 'ready'")]
        C.vacuum_analyze("schedules_schedule", "schedules_scheduleversion", "runs_run")

        cfg = C.WorkerConfig.parse(args.config)
        procs.start("scan", name="ret-scan")
        procs.start("reconcile", "--no-activity", name="ret-reconcile")
        procs.start("maintain", name="ret-maintain")
        procs.start_workers(cfg, tag="ret")
        procs.wait_connected("scheduler-work", cfg.workers)
        t_end = start + timedelta(minutes=args.minutes)
        print(f"\n{'minute':>6s} {'days':>5s} {'database MiB':>13s} " + " ".join(f"{t:>17s}" for t in TABLES)
              + "  partitions(runs)  removals  load", flush=True)
        samples = []
        while C.db_now() < t_end:
            time.sleep(15)
            now = C.db_now()
            b = table_bytes()
            parts = C.sql("SELECT count(*) FROM pg_inherits WHERE inhparent = 'runs_run'::regclass")[0][0]
            removals = C.sql("SELECT count(*) FROM runs_historyremoval")[0][0]
            minute = (now - start).total_seconds() / 60
            samples.append((minute, b))
            if len(samples) % 4 == 0:
                print(f"{minute:6.1f} {minute * 60 / args.day:5.1f} {mb(b['database']):>13s} "
                      + " ".join(f"{mb(b[t]):>17s}" for t in TABLES)
                      + f"  {parts:16d}  {removals:8d}  {os.getloadavg()[0]:.2f}", flush=True)
            for p in procs.procs:
                if p.poll() is not None:
                    raise SystemExit(f"{p.args} exited with {p.returncode}; see bench/out/ret-*.log")
        procs.stop()

        # --- the figures
        removals = C.sql("SELECT at, what, lock_ms, kept, removed FROM runs_historyremoval ORDER BY at")
        print(f"\n{len(removals)} removals; tables locked per removal: median "
              f"{C.fmt(C.median([r[2] for r in removals if r[2] is not None]), ' ms', 0)}, max "
              f"{C.fmt(max((r[2] for r in removals if r[2] is not None), default=None), ' ms', 0)}")
        for at, what, lock_ms, kept, removed in removals[:3] + removals[-3:]:
            print(f"  {at:%H:%M:%S} {what}: locked {C.fmt(lock_ms, ' ms', 0)}, kept {kept}")
        lag = C.sql("""SELECT percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM first_started_at - scheduled_time)),
                              count(*) FROM runs_run WHERE first_started_at IS NOT NULL AND scheduled_time >= %s""", [start])[0]
        windows = " OR ".join(["(r.scheduled_time BETWEEN %s AND %s)"] * len(removals)) or "false"
        params = [x for at, _, lock_ms, _, _ in removals
                  for x in (at - timedelta(milliseconds=(lock_ms or 0)) - timedelta(seconds=2), at + timedelta(seconds=2))]
        during = C.sql(f"""SELECT percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM r.first_started_at - r.scheduled_time)),
                                  count(*), max(extract(epoch FROM r.first_started_at - r.scheduled_time))
                           FROM runs_run r WHERE r.first_started_at IS NOT NULL AND ({windows})""", params)[0]
        print(f"start lag of the runs still kept (the last {args.keep_days} days): p50 {C.fmt(lag[0][0] if lag[0] else None, 's', 3)}, "
              f"p99 {C.fmt(lag[0][1] if lag[0] else None, 's', 3)} over {lag[1]} runs")
        print(f"start lag of runs due within 2 s of a removal's lock: p50 {C.fmt(during[0][0] if during[0] else None, 's', 3)}, "
              f"p99 {C.fmt(during[0][1] if during[0] else None, 's', 3)}, max {C.fmt(during[2], 's', 3)} over {during[1]} runs "
              f"(goal p99 <= 1 s)")

        first_full = next((b for m, b in samples if m * 60 >= (args.keep_days + 2) * args.day), None)
        last = samples[-1][1]
        if first_full:
            print("disk after the window (keep + 2 days) and at the end, MiB: "
                  + ", ".join(f"{t} {mb(first_full[t])} -> {mb(last[t])}" for t in ("runs_run", "runs_attempt", "runs_occurrence")))
        print(f"outbox (kept {env['SCHEDULER_OUTBOX_RETENTION_HOURS']} h): {mb(last['runs_outboxevent'])} MiB at the end")

        # --- the checks
        left = C.sql("SELECT count(*) FROM runs_run WHERE id = ANY(%s::uuid[]) AND state = 'ready'", [stuck_ids])[0][0]
        now = C.db_now()
        window_lo = now - timedelta(seconds=args.keep_days * args.day)
        gaps = C.sql(f"""SELECT count(*) FROM (
                SELECT schedule_id, count(*) AS have, extract(epoch FROM max(scheduled_time) - min(scheduled_time)) / 60 + 1 AS want
                FROM runs_run WHERE scheduled_time >= %s AND schedule_id IN (SELECT {C.uid('rl', 's')} FROM generate_series(1, {n}) n)
                GROUP BY schedule_id) x WHERE have < want""", [window_lo])[0][0]
        dead_young = C.sql("SELECT count(*) FROM runs_run WHERE state = 'dead' AND finished_at >= %s",
                           [now - timedelta(seconds=args.dead_days * args.day)])[0][0]
        audit = subprocess.run([str(C.PYTHON), str(C.CODE / "manage.py"), "check_invariants"], env=C.bench_env(args.database, **env),
                               capture_output=True, text=True, cwd=C.CODE)
        print(f"\nchecks: unclaimed ready runs from before the partitions still there: {left}/{len(stuck_ids)}; "
              f"schedules missing an occurrence of the last {args.keep_days} days: {gaps}; dead runs within their "
              f"retention: {dead_young}; invariant checker: {audit.stdout.strip().splitlines()[-1] if audit.stdout else audit.stderr[-300:]}")
        ok = left == len(stuck_ids) and gaps == 0 and audit.returncode == 0
        print(f"nothing unfinished removed, nothing removed early, audit clean: {'OK' if ok else 'FAILED'}")
    finally:
        procs.stop()
        target.close()


if __name__ == "__main__":
    main()
