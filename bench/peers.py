"""Peers, side by side in one run on the same machine: N no-op jobs through Procrastinate (on the
same PostgreSQL), N tasks through Celery with the local Redis as broker, each making the same HTTP
call as a run does, and N runs through the scheduler's workers, each a real HTTP call to the same
local target.

    .venv/bin/python bench/peers.py [--jobs 20000] [--rounds 3] [--config 2x1024x400]
        [--procrastinate-concurrency 20] [--celery-pools prefork:8,prefork:32,gevent:256]

Procrastinate and Celery are installed only in bench/.venv-peers (made here if missing, with
`pip install procrastinate psycopg[binary] celery[redis] gevent requests`) and driven by
bench/peers_procrastinate.py and bench/peers_celery.py in that environment. The database is
scheduler_bench_peers (dropped and made again): the project's tables and Procrastinate's.

Celery, per pool in --celery-pools (its best pool is what is compared): N tasks are sent to
Redis first (timed apart), then the workers start: prefork as one worker with C child
processes, gevent as as many worker processes as ours, each with C greenlets. Throughput =
N / (the target's first answer to one of them -> its N-th), read by polling the target's counter.

Each round: Procrastinate: defer N jobs (batch_defer_async, 1000 per call; timed apart), then as
many worker processes as ours (run_worker_async(concurrency=C, wait=False): each exits when the
queue is empty); its throughput = N / (last 'succeeded' event - first 'started' event). Then the
scheduler: N ready runs bulk-loaded due at an instant a few seconds ahead, our workers (same
process count) to a local target; throughput = N / (max(finished_at) - min(first_started_at)).
Both sides start from empty queue tables. Printed: both throughputs (median of the rounds) and
the ratio. Goal (issue 7): ours >= 5x Procrastinate's.
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402

PEERS_VENV = C.BENCH / ".venv-peers"
PEERS_PY = PEERS_VENV / "bin" / "python"
PEERS_PACKAGES = ["procrastinate", "psycopg[binary]", "celery[redis]", "gevent", "requests"]


def ensure_peers_venv():
    if PEERS_PY.exists() and subprocess.run([str(PEERS_PY), "-c", "import procrastinate, psycopg, celery, gevent, redis"],
                                            capture_output=True).returncode == 0:
        return
    print("making bench/.venv-peers (Procrastinate and Celery, for this benchmark only)...", flush=True)
    subprocess.run([sys.executable if "venv-peers" not in sys.executable else "python3", "-m", "venv", str(PEERS_VENV)],
                   check=True)
    subprocess.run([str(PEERS_PY), "-m", "pip", "install", "-q", *PEERS_PACKAGES], check=True)


def peers(dsn, *args, timeout=600) -> float:
    out = subprocess.run([str(PEERS_PY), str(C.BENCH / "peers_procrastinate.py"), dsn, *map(str, args)],
                         capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"procrastinate {args}: {out.stderr[-2000:]}")
    return float(out.stdout.strip().rsplit("seconds=", 1)[1])


def procrastinate_round(dsn, n, workers, concurrency):
    C.sql("TRUNCATE procrastinate_jobs CASCADE", fetch=False)
    defer_s = peers(dsn, "defer", n)
    C.vacuum_analyze("procrastinate_jobs", "procrastinate_events")
    t = time.perf_counter()
    procs = [subprocess.Popen([str(PEERS_PY), str(C.BENCH / "peers_procrastinate.py"), dsn, "work", str(concurrency), f"p{i}"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(workers)]
    for p in procs:
        _, err = p.communicate(timeout=900)
        if p.returncode != 0:
            raise RuntimeError(f"procrastinate worker: {err[-2000:]}")
    wall = time.perf_counter() - t
    done, span = C.sql(
        """SELECT (SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'),
                  extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded') - min(at) FILTER (WHERE type = 'started'))
           FROM procrastinate_events""")[0]
    return {"defer_rate": n / defer_s, "done": done, "span": float(span), "rate": n / float(span), "wall": wall}


CELERY_BROKER = "redis://127.0.0.1:6379/15"


def celery_round(pool: str, concurrency: int, processes: int, target, n: int) -> dict:
    env = {**os.environ, "PEERS_CELERY_BROKER": CELERY_BROKER}
    subprocess.run([str(PEERS_PY), "-c", "import redis; redis.Redis.from_url('%s').flushdb()" % CELERY_BROKER],
                   check=True, env=env)
    out = subprocess.run([str(PEERS_PY), str(C.BENCH / "peers_celery.py"), CELERY_BROKER, "enqueue", str(n), target.url],
                         capture_output=True, text=True, env=env, cwd=C.BENCH, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"celery enqueue: {out.stderr[-2000:]}")
    send_s = float(out.stdout.strip().rsplit("seconds=", 1)[1])
    count0 = target.count()
    argv = [str(PEERS_VENV / "bin" / "celery"), "-A", "peers_celery", "worker", "-P", pool, "-c", str(concurrency),
            "-Q", "peers", "--without-heartbeat", "--without-gossip", "--without-mingle", "-l", "WARNING"]
    procs = [subprocess.Popen(argv + ["-n", f"peers{i}@%h"], cwd=C.BENCH, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
             for i in range(processes if pool != "prefork" else 1)]
    first = last = None
    deadline = time.monotonic() + 900
    try:
        while time.monotonic() < deadline:
            got = target.count() - count0
            now = time.perf_counter()
            if got and first is None:
                first = now
            if got >= n:
                last = now
                break
            if any(p.poll() is not None for p in procs):
                raise RuntimeError(f"a celery worker exited: {procs[0].stderr.read()[-2000:] if procs[0].stderr else ''}")
            time.sleep(0.005)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
    done = target.count() - count0
    span = (last - first) if last and first else None
    return {"pool": f"{pool}:{concurrency}", "done": done, "span": span, "rate": n / span if span else None,
            "send_rate": n / send_s}


def scheduler_round(args, cfg, s, target, n, rep):
    C.truncate_runs()
    t = C.sql("SELECT date_trunc('second', statement_timestamp()) + make_interval(secs => %s)", [args.lead])[0][0]
    C.load_due_runs(s, n, f"'{t.isoformat()}'::timestamptz")
    C.vacuum_analyze("runs_run", "runs_occurrence", "runs_outboxevent", "runs_attempt")
    procs = C.Procs(args.database, {"SCHEDULER_POLL_SECONDS": args.poll})
    procs.start_workers(cfg, tag=f"peers{rep}-")
    procs.wait_connected("scheduler-work", cfg.workers)
    if C.db_now() >= t:
        procs.stop()
        raise SystemExit("loading and starting took past the instant: raise --lead")
    delivered0 = target.count()
    done = C.wait_drained(procs, timeout=900)
    procs.stop()
    r = C.run_outcome(t)
    span = r["all_succeeded"] - r["first_started"]
    return {"done": r["succeeded"], "span": span, "rate": n / span, "delivered": target.count() - delivered0,
            "finished": done}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--config", default="2x1024x400", help="our WORKERSxCONCURRENCYxBATCH; Procrastinate gets as many processes")
    ap.add_argument("--procrastinate-concurrency", type=int, default=20)
    ap.add_argument("--celery-pools", default="prefork:8,prefork:32,gevent:256",
                    help="comma-separated POOL:CONCURRENCY for Celery; the best is compared")
    ap.add_argument("--poll", type=float, default=1.0)
    ap.add_argument("--lead", type=float, default=8.0)
    ap.add_argument("--database", default="scheduler_bench_peers")
    args = ap.parse_args()
    cfg = C.WorkerConfig.parse(args.config)

    ensure_peers_venv()
    version = subprocess.run([str(PEERS_PY), "-c", "import importlib.metadata as m; print(m.version('procrastinate'))"],
                             capture_output=True, text=True).stdout.strip()
    print(C.machine_line(), flush=True)
    C.ensure_out_dir()
    C.setup_database(args.database)
    dsn = f"{C.PG_SERVER}/{args.database}"
    peers(dsn, "setup")
    target = C.Target(1)
    try:
        tenant = C.load_tenant("peers", target.prefix)
        s = C.load_schedules("pe", tenant, args.jobs, target_url=target.url, next_run_at="now() + interval '10 days'")
        C.vacuum_analyze("schedules_schedule", "schedules_scheduleversion")
        pools = [(p.split(":")[0], int(p.split(":")[1])) for p in args.celery_pools.split(",") if p]
        celery_version = subprocess.run([str(PEERS_PY), "-c", "import celery; print(celery.__version__)"],
                                        capture_output=True, text=True).stdout.strip()
        ours, theirs, celery = [], [], {f"{p}:{c}": [] for p, c in pools}
        for rep in range(args.rounds):
            p = procrastinate_round(dsn, args.jobs, cfg.workers, args.procrastinate_concurrency)
            theirs.append(p)
            print(f"  [#{rep + 1}] Procrastinate {version}: {p['done']}/{args.jobs} succeeded, {p['rate']:.0f} jobs/s "
                  f"({p['span']:.2f}s first start -> last success; workers' wall {p['wall']:.2f}s); "
                  f"batch defer {p['defer_rate']:.0f} jobs/s", flush=True)
            for pool, conc in pools:
                c = celery_round(pool, conc, cfg.workers, target, args.jobs)
                celery[c["pool"]].append(c)
                print(f"  [#{rep + 1}] Celery {celery_version} {c['pool']}: target answered {c['done']}/{args.jobs}, "
                      f"{C.fmt(c['rate'], '', 0)} tasks/s ({C.fmt(c['span'], 's', 2)} first call -> last); "
                      f"sent at {c['send_rate']:.0f} tasks/s", flush=True)
            o = scheduler_round(args, cfg, s, target, args.jobs, rep)
            ours.append(o)
            print(f"  [#{rep + 1}] scheduler: {o['done']}/{args.jobs} succeeded, {o['rate']:.0f} runs/s ({o['span']:.2f}s "
                  f"first start -> last success), target answered {o['delivered']}", flush=True)
        mo, mt = C.median([o["rate"] for o in ours]), C.median([p["rate"] for p in theirs])
        best_pool = max(celery, key=lambda k: C.median([c["rate"] for c in celery[k]]) or 0)
        mc = C.median([c["rate"] for c in celery[best_pool]])
        print(f"\npeers: {args.jobs} jobs each side, same machine, {cfg.workers} worker process(es) each side "
              f"(ours: {cfg}; Procrastinate {version}: concurrency {args.procrastinate_concurrency}; Celery "
              f"{celery_version} with Redis), median of {args.rounds}:")
        print(f"  Procrastinate  {C.spread([p['rate'] for p in theirs], 0)} jobs/s, no-op jobs   (batch defer "
              f"{C.fmt(C.median([p['defer_rate'] for p in theirs]), '', 0)} jobs/s, not counted)")
        for k, cs in celery.items():
            print(f"  Celery {k:<14} {C.spread([c['rate'] for c in cs], 0)} tasks/s, each the same HTTP call"
                  + ("   <- best" if k == best_pool else ""))
        print(f"  scheduler      {C.spread([o['rate'] for o in ours], 0)} runs/s, each a real HTTP call")
        per_round = ", ".join(f"{o['rate'] / p['rate']:.2f}" for o, p in zip(ours, theirs))
        print(f"  ratio          {mo / mt:.2f}x Procrastinate (per round: {per_round}); "
              f"{mo / mc:.2f}x Celery's best ({best_pool})")
        ok = (all(o["done"] == o["delivered"] == args.jobs for o in ours) and all(p["done"] == args.jobs for p in theirs)
              and all(c["done"] >= args.jobs for cs in celery.values() for c in cs))
        print(f"  completeness   {'OK' if ok else 'MISMATCH'}")
        print(f"goals: >= 10x Procrastinate: {'met' if mo / mt >= 10 else 'NOT met'} ({mo / mt:.2f}x); "
              f">= 3x Celery: {'met' if mo / mc >= 3 else 'NOT met'} ({mo / mc:.2f}x)")
    finally:
        target.close()


if __name__ == "__main__":
    main()
