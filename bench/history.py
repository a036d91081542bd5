"""History: the hot path, the 100,000-run burst, every portal page and /metrics on an empty history,
then again after loading a long history (default 20,000,000 finished runs over 14 days of daily
partitions, with their attempts and occurrences, and the last 3 days' outbox events), and the ratio.

    .venv/bin/python bench/history.py [--runs 20000000] [--days 14] [--repeats 3] [--burst 100000]

Both measurements run on the same database with the same partitions (the 14 past days are made
first, empty): only the rows differ. Measured each time:
- queue: claim + complete of 20,000 due runs in batches of 200 in this process (as bench/queue_profile.py);
- burst: `--burst` runs loaded ready at one instant, real `manage.py work` processes (2 x 1024 x 400)
  and a local target: time until all started (as bench/burst.py);
- materialise: one scanner transaction making runs for 500 due schedules (scan_step), ms;
- portal: every page an operator opens (dashboard, runs, a run, the dead-letter queue, schedules, a
  schedule, the audit log, tenants, a tenant) and /metrics, median of 5 requests each through
  Django's test client (no HTTP server: only the page's own work), after the bursts and after the
  activity loop has caught up (its catch-up is timed), so that both measurements read a last hour
  as busy;
and once, after loading: table and index bytes per million runs, and WAL bytes per run of
materialising, claiming and completing. Both measurements have `--dead` dead runs of the last
hours, so the pages that list dead runs show full pages on the empty history as on the long one.

Database: scheduler_bench_history (dropped and made again; needs about 1.6 GB per million runs).
"""

import argparse
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402

QUEUE_RUNS = 20_000
WORKERS = "2x1024x400"


# --- loading ------------------------------------------------------------------------------------


def load_history(s, runs: int, days: int, *, events_days: int = 3) -> float:
    """`runs` finished runs over the `days` days before today (UTC), spread evenly, each with its
    occurrence and attempt; one in 1,000 dead (a dead-letter queue), the rest succeeded; the last
    `events_days` days' runs with their three events (the outbox keeps 72 h). Returns seconds."""
    from django.db import connection

    from runs.models import Attempt, Occurrence, OutboxEvent, Run
    from schedules.timeexpr import tzdata_version

    t0 = time.monotonic()
    per_day = runs // days
    today = C.sql("SELECT date_trunc('day', statement_timestamp())")[0][0]
    for d in range(days, 0, -1):
        day = today - timedelta(days=d)
        tag = f"{s.tag}h{d}"
        at = f"('{day.isoformat()}'::timestamptz + make_interval(secs => n * 86400.0 / {per_day}))"
        sid = f"md5('{s.tag}:s:' || (mod(n, {s.count}) + 1))::uuid"
        vid = f"{s.vbase} + mod(n, {s.count}) + 1"
        dead = "mod(n, 1000) = 0"
        with connection.cursor() as cur:
            cur.execute("SET synchronous_commit = off")
        C.insert_series(Occurrence, per_day, exprs={
            "id": C.uid(tag, "o"), "schedule_id": sid, "version_id": vid, "scheduled_time": at,
            "local_wall_time": f"to_char({at} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS')",
            "local_time": f"to_char({at} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS') || '+00:00'",
        }, values={"schedule_version": 1, "time_zone": "UTC", "tzdata_version": tzdata_version(), "kind": "scheduled"})
        C.insert_series(Run, per_day, exprs={
            "id": C.uid(tag, "r"), "occurrence_id": C.uid(tag, "o"), "tenant_id": f"'{s.tenant.id}'",
            "schedule_id": sid, "version_id": vid, "scheduled_time": at,
            "state": f"CASE WHEN {dead} THEN 'dead' ELSE 'succeeded' END",
            "created_at": f"{at} - interval '10 seconds'", "first_started_at": f"{at} + interval '20 milliseconds'",
            "finished_at": f"{at} + interval '60 milliseconds'",
            "last_error": f"CASE WHEN {dead} THEN 'HTTP 500 from the target' ELSE '' END",
            "target_host": "'127.0.0.1:9'",
        }, values={"schedule_version": 1, "kind": "scheduled", "generation": 1, "attempts_used": 1, "max_attempts": 5})
        C.insert_series(Attempt, per_day, exprs={
            "run_id": C.uid(tag, "r"), "scheduled_time": at, "started_at": f"{at} + interval '20 milliseconds'",
            "finished_at": f"{at} + interval '60 milliseconds'",
            "outcome": f"CASE WHEN {dead} THEN 'failed' ELSE 'succeeded' END",
            "http_status": f"CASE WHEN {dead} THEN 500 ELSE 200 END", "latency_ms": "40",
        }, values={"generation": 1, "worker_id": "bench-history", "remote_address": "127.0.0.1:9",
                   "response_excerpt": '{"ok":true}'})
        if d <= events_days:
            for kind, state in (("run.created", "ready"), ("run.leased", "leased"), ("run.succeeded", "succeeded")):
                C.insert_series(OutboxEvent, per_day, exprs={
                    "event_id": "gen_random_uuid()", "tenant_id": f"'{s.tenant.id}'", "run_id": C.uid(tag, "r"),
                    "kind": f"'{kind}'", "payload": f"jsonb_build_object('runId', {C.uid(tag, 'r')}::text, "
                                                     f"'state', '{state}', 'generation', 1)",
                    "created_at": f"{at}", "published_at": f"{at}",
                })
        print(f"    loaded day -{d}: {per_day} runs ({time.monotonic() - t0:.0f}s)", flush=True)
    # Vacuum and analyse the partitions loaded, not their parents: ANALYZE of a parent also
    # analyses today's partition while it is nearly empty, and the complete statement's plan then
    # took it for empty and scanned the attempts partition once per run (93 ms per batch of 200,
    # growing with the day; a stall in the 100,000-run burst). A deployment's partitions are never
    # analysed empty by the maintenance loop; autovacuum analyses them as they fill.
    for t in ("runs_occurrence", "runs_run", "runs_attempt", "runs_outboxevent"):
        for (part,) in C.sql("SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                             "WHERE i.inhparent = %s::regclass AND c.relname ~ '_p[0-9]{8}t' "
                             "AND to_timestamp(substring(c.relname from '_p([0-9]{8})t'), 'YYYYMMDD') < %s",
                             [t, today]):
            C.sql(f'VACUUM (ANALYZE) "{part}"', fetch=False)
    # In a deployment the activity loop counted these attempts as they ended, days ago: it is
    # where it would be now (its cursor past the history), not 20 million attempts behind.
    C.sql("UPDATE dispatch_activitycursor SET watermark = (SELECT coalesce(max(id), 0) FROM runs_attempt)",
          fetch=False)
    return time.monotonic() - t0


# --- the measurements ---------------------------------------------------------------------------


def wal_now():
    return C.sql("SELECT pg_current_wal_lsn()")[0][0]


def wal_bytes(a, b) -> int:
    return C.sql("SELECT pg_wal_lsn_diff(%s, %s)", [b, a])[0][0]


def queue_phase(qs, backend, tag):
    """claim + complete of QUEUE_RUNS due runs, batch 200: runs/s and PostgreSQL CPU per run; WAL per run."""
    from runs import queue
    from runs.decisions import Holding

    since = C.db_now() - timedelta(minutes=1)
    C.load_due_runs(qs, QUEUE_RUNS, "date_trunc('second', now()) - interval '1 second'")
    C.vacuum_analyze("runs_run")
    w0, pg0, t0 = wal_now(), C.proc_cpu(backend), time.perf_counter()
    done = 0
    while True:
        claims = queue.claim(f"hist-{tag}", 200, holding=Holding(200, 1.0, 1.0))  # shares off: whole batches
        if not claims:
            break
        queue.complete([queue.Result(claimed=c, outcome="succeeded", http_status=200, latency_ms=1,
                                     remote_address="127.0.0.1", response_excerpt='{"ok":true}') for c in claims])
        done += len(claims)
    wall = time.perf_counter() - t0
    r = {"rate": done / wall, "pg_us": (C.proc_cpu(backend) - pg0) / max(1, done) * 1e6,
         "wal": wal_bytes(w0, wal_now()) / max(1, done), "done": done}
    remove_runs_of(qs, since)
    return r


def materialise_phase(ms):
    """One scanner transaction over 500 due schedules: ms, and WAL per run made."""
    from dispatch.loops import scan_step

    since = C.db_now() - timedelta(minutes=1)
    C.sql(f"UPDATE schedules_schedule SET next_run_at = date_trunc('second', now()) - interval '1 second', "
          f"anchor_at = date_trunc('second', now()) - interval '61 seconds' WHERE id IN "
          f"(SELECT {ms.sid()} FROM generate_series(1, {ms.count}) n)", fetch=False)
    w0, t0 = wal_now(), time.perf_counter()
    scan_step(batch=ms.count)
    ms_taken = (time.perf_counter() - t0) * 1000
    made = C.sql(f"SELECT count(*) FROM runs_run WHERE scheduled_time >= %s AND schedule_id IN "
                 f"(SELECT {ms.sid()} FROM generate_series(1, {ms.count}) n)", [since])[0][0]
    r = {"ms": ms_taken, "wal": wal_bytes(w0, wal_now()) / max(1, made), "made": made}
    remove_runs_of(ms, since)
    C.sql(f"UPDATE schedules_schedule SET next_run_at = now() + interval '10 days' WHERE id IN "
          f"(SELECT {ms.sid()} FROM generate_series(1, {ms.count}) n)", fetch=False)
    return r


def remove_runs_of(s, since):
    """Remove the runs (with attempts, occurrences, events) of schedule set `s` made for times from
    `since` on: a measurement's own runs, so that the history stays what was loaded."""
    ids = f"(SELECT {s.sid()} FROM generate_series(1, {s.count}) n)"
    mine = f"SELECT id FROM runs_run WHERE scheduled_time >= %s AND schedule_id IN {ids}"
    C.sql(f"DELETE FROM runs_outboxevent WHERE created_at >= %s AND run_id IN ({mine})", [since, since], fetch=False)
    C.sql(f"DELETE FROM runs_attempt WHERE scheduled_time >= %s AND run_id IN ({mine})", [since, since], fetch=False)
    C.sql(f"DELETE FROM runs_run WHERE scheduled_time >= %s AND schedule_id IN {ids}", [since], fetch=False)
    C.sql(f"DELETE FROM runs_occurrence WHERE scheduled_time >= %s AND schedule_id IN {ids}", [since], fetch=False)


def burst_phase(args, bs, target, tag, *, keep: bool = False):
    """`args.burst` runs loaded ready at one instant, dispatched by real workers: seconds until all
    started. With `keep`, its runs stay (r["t"] says which; remove_runs_of removes them)."""
    cfg = C.WorkerConfig.parse(WORKERS)
    t = C.sql("SELECT date_trunc('second', statement_timestamp()) + interval '30 seconds'")[0][0]
    C.load_due_runs(bs, args.burst, f"'{t.isoformat()}'::timestamptz")
    # Only the tables just loaded: statistics of the attempts and events partitions taken while the
    # last phase's rows are deleted would say "empty" (see load_history); autovacuum keeps them.
    C.vacuum_analyze("runs_run", "runs_occurrence")
    procs = C.Procs(args.database, {"SCHEDULER_POLL_SECONDS": 1.0})
    procs.start_workers(cfg, tag=f"h{tag}")
    try:
        procs.wait_connected("scheduler-work", cfg.workers)
        time.sleep(max(0, (t - C.db_now()).total_seconds()))
        ok = C.wait_drained(procs, timeout=args.timeout, where="scheduled_time = %s", params=[t])
        r = C.run_outcome(t, where="scheduled_time = %s", params=[t])
    finally:
        procs.stop()
    r["ok"] = ok and r["succeeded"] == args.burst
    r["t"] = t
    if not keep:
        remove_runs_of(bs, t)
    return r


PAGES = ("/", "/runs/", "/runs/?state=dead", "/runs/{run}/", "/dlq/", "/schedules/", "/schedules/{schedule}/",
         "/audit/", "/tenants/", "/tenants/{tenant}/", "/metrics")


def portal_phase(client, ids, repeats: int = 5) -> dict:
    out = {}
    for page in PAGES:
        path = page.format(**ids)
        times = []
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            resp = client.get(path)
            times.append((time.perf_counter() - t0) * 1000)
            assert resp.status_code == 200, (path, resp.status_code)
        out[page] = C.median(times[1:])  # the first request warms caches
    return out


def sizes(runs: int) -> dict:
    """Heap and index bytes of each history table per million runs (all partitions)."""
    out = {}
    for t in ("runs_run", "runs_attempt", "runs_occurrence", "runs_outboxevent"):
        heap, idx, rows = C.sql(
            "SELECT sum(pg_table_size(inhrelid)), sum(pg_indexes_size(inhrelid)), sum(c.reltuples) "
            "FROM pg_inherits JOIN pg_class c ON c.oid = inhrelid WHERE inhparent = %s::regclass", [t])[0]
        heap, idx = float(heap or 0), float(idx or 0)  # sum() of bigint is numeric: a Decimal
        out[t] = {"heap_mb_per_m": heap / runs * 1e6 / 2**20, "index_mb_per_m": idx / runs * 1e6 / 2**20,
                  "rows": int(rows)}
    return out


def settle() -> str:
    """Start each measurement from the same state: no checkpoint or autovacuum still busy with
    what was just loaded. Right after loading 10,000,000 runs, the checkpoint of its ~20 GB of WAL
    and autovacuum's passes took the disk and a core for minutes, and the first phase measured
    them (claim + complete 2,111 runs/s, then 4,779-5,023 on the same database once quiet)."""
    t0 = time.monotonic()
    C.sql("CHECKPOINT", fetch=False)
    checkpoint = time.monotonic() - t0
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and C.sql(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker' "
            "AND datname = current_database()")[0][0]:
        time.sleep(2)
    return f"checkpoint {checkpoint:.1f} s, autovacuum idle after {time.monotonic() - t0:.0f} s"


def measure(args, label, sets, client, ids, target, backend):
    print(f"\n== {label} ({settle()})", flush=True)
    res = {"queue": [], "burst": [], "materialise": [], "portal": []}
    for rep in range(args.repeats):
        q = queue_phase(sets["queue"], backend, f"{label}{rep}")
        m = materialise_phase(sets["mat"])
        res["queue"].append(q)
        res["materialise"].append(m)
        print(f"  [#{rep + 1}] queue {q['rate']:.0f} runs/s (PostgreSQL {q['pg_us']:.0f} µs/run, WAL {q['wal'] / 1024:.1f} KiB/run); "
              f"materialise 500 in {m['ms']:.0f} ms (WAL {m['wal'] / 1024:.1f} KiB/run); load "
              + "/".join(f"{x:.2f}" for x in os.getloadavg()), flush=True)
    for rep in range(args.burst_repeats):
        b = burst_phase(args, sets["burst"], target, f"{label[0]}{rep}", keep=rep == args.burst_repeats - 1)
        res["burst"].append(b)
        print(f"  [burst #{rep + 1}] {b['runs']} runs, all started {C.fmt(b['all_started'], 's', 2)}, "
              f"lag p99 {C.fmt(b['lag_p99'], 's', 2)}, {'OK' if b['ok'] else 'INCOMPLETE'}; load "
              + "/".join(f"{x:.2f}" for x in os.getloadavg()), flush=True)
    # The pages last, with the last burst's runs still there, in both measurements: the
    # dashboard reads the last hour's attempts (a bounded tail) and the activity loop's rows, so
    # both see an hour as busy as a burst makes it and differ by the history only. The activity
    # loop runs in every deployment (`reconcile`, `scheduler`); here it catches up on the burst,
    # timed.
    n, secs = aggregate_phase()
    print(f"  [activity] {n} attempts counted in {secs:.1f} s ({n / secs if secs else 0:.0f}/s)", flush=True)
    for rep in range(args.repeats):
        p = portal_phase(client, ids)
        res["portal"].append(p)
        print(f"  [pages #{rep + 1}] " + ", ".join(f"{k} {v:.0f}" for k, v in p.items()) + " ms; load "
              + "/".join(f"{x:.2f}" for x in os.getloadavg()), flush=True)
    if res["burst"]:
        remove_runs_of(sets["burst"], res["burst"][-1]["t"])
    return res


def aggregate_phase() -> tuple[int, float]:
    """The activity loop's passes until it has caught up (as `manage.py aggregate --once`):
    attempts counted and seconds."""
    from dispatch.activity import ActivityAggregator
    from dispatch.models import ALL_TENANTS, ActivityMinute

    def counted():
        return sum(r.succeeded + r.failed + r.unknown for r in ActivityMinute.objects.filter(tenant_id=ALL_TENANTS))

    before, t0 = counted(), time.monotonic()
    # No settle time: the workers have stopped, every attempt is committed.
    agg = ActivityAggregator(settle=timedelta(0))
    while agg.step():
        pass
    return counted() - before, time.monotonic() - t0


def summary(res) -> dict:
    s = {
        "queue runs/s": C.median([q["rate"] for q in res["queue"]]),
        "queue PG µs/run": C.median([q["pg_us"] for q in res["queue"]]),
        "materialise 500 (ms)": C.median([m["ms"] for m in res["materialise"]]),
        "burst all started (s)": C.median([b["all_started"] for b in res["burst"]]),
    }
    for page in PAGES:
        s[f"page {page} (ms)"] = C.median([p[page] for p in res["portal"]])
    return s


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20_000_000, help="runs of history to load")
    ap.add_argument("--days", type=int, default=14)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--burst", type=int, default=100_000)
    ap.add_argument("--burst-repeats", type=int, default=2)
    ap.add_argument("--dead", type=int, default=2500,
                    help="dead runs in the last hours in both measurements (full dead-letter pages); at most 10,000")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--database", default="scheduler_bench_history")
    args = ap.parse_args()

    print(C.machine_line(), flush=True)
    C.ensure_out_dir()
    C.setup_database(args.database)
    from django.contrib.auth import get_user_model
    from django.test import Client

    from runs import partitions

    target = C.Target(1)
    try:
        tenant = C.load_tenant("hist", target.prefix)
        hs = C.load_schedules("hs", tenant, 10_000, target_url=target.url, expression="rate(1 hour)",
                              next_run_at="now() + interval '10 days'")
        sets = {
            "queue": C.load_schedules("hq", tenant, QUEUE_RUNS, target_url=target.url, next_run_at="now() + interval '10 days'"),
            "mat": C.load_schedules("hm", tenant, 500, target_url=target.url, expression="rate(1 minute)",
                                    next_run_at="now() + interval '10 days'"),
            "burst": C.load_schedules("hb", tenant, args.burst, target_url=target.url, expression="rate(1 day)",
                                      next_run_at="now() + interval '10 days'"),
        }
        made = partitions.extend_back(C.db_now() - timedelta(days=args.days))
        C.maintain()
        C.vacuum_analyze("schedules_schedule", "schedules_scheduleversion")
        print(f"partitions: {len(made)} made for the {args.days} past days; "
              f"{sum(1 for _ in partitions.layout('runs_run'))} per history table", flush=True)
        User = get_user_model()
        User.objects.create_superuser("bench-operator", "op@example.invalid", "x")
        client = Client()
        client.force_login(User.objects.get(username="bench-operator"))
        from django.db import connection

        connection.ensure_connection()
        backend = C.sql("SELECT pg_backend_pid()")[0][0]

        # Dead runs of the last hours, in both measurements (they stay in the history throughout):
        # the dead runs list and the dead-letter queue then show full pages (50 runs, the newest
        # 2,000 counted) on the empty history too, so the ratio measures the history behind them,
        # not a page of one run against a page of fifty. One of them is the run of the detail page.
        C.load_due_runs(hs, args.dead, "date_trunc('second', now()) - interval '1 hour' - make_interval(secs => n)")
        C.sql("UPDATE runs_run SET state = 'dead', finished_at = now(), generation = 0, "
              "last_error = 'HTTP 500 from the target' WHERE state = 'ready' AND schedule_id IN "
              f"(SELECT {hs.sid()} FROM generate_series(1, {hs.count}) n)", fetch=False)
        run = C.sql("SELECT id FROM runs_run WHERE state = 'dead' ORDER BY scheduled_time DESC LIMIT 1")[0][0]
        ids = {"run": run, "schedule": C.sql("SELECT schedule_id FROM runs_run WHERE id = %s", [run])[0][0],
               "tenant": tenant.id}

        empty = measure(args, "empty history", sets, client, ids, target, backend)
        print(f"\nloading {args.runs} runs of history over {args.days} days ...", flush=True)
        w0 = wal_now()
        secs = load_history(hs, args.runs, args.days)
        print(f"loaded in {secs:.0f}s ({args.runs / secs:.0f} runs/s with attempts and occurrences); "
              f"WAL {wal_bytes(w0, wal_now()) / args.runs:.0f} B/run while loading; database "
              f"{C.sql('SELECT pg_size_pretty(pg_database_size(current_database()))')[0][0]}", flush=True)
        full = measure(args, f"{args.runs} runs of history", sets, client, ids, target, backend)

        print("\nsizes per million runs of history (heap / indexes, all partitions):")
        for t, v in sizes(args.runs).items():
            print(f"  {t:18s} {v['heap_mb_per_m']:7.1f} MiB / {v['index_mb_per_m']:7.1f} MiB  ({v['rows']} rows)")
        a, b = summary(empty), summary(full)
        print(f"\nhistory: empty vs {args.runs} runs ({args.days} days), medians; goal: within 1.5x")
        worst = 0.0
        for k in a:
            hib = "runs/s" in k
            ratio = (a[k] / b[k] if hib else b[k] / a[k]) if a[k] and b[k] else None
            worst = max(worst, ratio or 0)
            print(f"  {k:36s} {C.fmt(a[k], '', 2):>10s} -> {C.fmt(b[k], '', 2):>10s}   x{C.fmt(ratio, '', 2)}")
        print(f"goal within 1.5x of an empty history: {'met' if worst <= 1.5 else 'NOT met'} (worst x{worst:.2f})")
    finally:
        target.close()


if __name__ == "__main__":
    main()
