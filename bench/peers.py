"""Peers, side by side in one command on the same machine and the same PostgreSQL, in interleaved
rounds: pgqueuer, DBOS, Procrastinate and Celery, the raw-SQL floor of a queue, and the
scheduler's own workers. Every ratio is printed, per round and as the median.

    .venv/bin/python bench/peers.py [--jobs 20000] [--slow-jobs 5000] [--dbos-jobs 2000]
        [--floor-jobs 100000] [--rounds 3] [--config 2x1024x400] [--skip celery,dbos]

- **scheduler**: N ready runs bulk-loaded due at an instant a few seconds ahead, our workers
  (WORKERS processes) each making a real HTTP call per run to a local target; throughput =
  N / (min(first_started_at) -> max(finished_at)).
- **pgqueuer** (bench/.venv-pgqueuer: `pip install pgqueuer asyncpg uvloop aiohttp`, made here if
  missing): N jobs enqueued (batches of 1000, timed apart), then as many worker processes as
  ours, each with --pgqueuer-managers queue managers (one asyncpg connection each, dequeue batch
  --pgqueuer-batch, drain mode); once with no-op jobs and once with jobs that make the same HTTP
  call (aiohttp) to the same target. Throughput = N / (first job started -> last job finished).
- **DBOS** (bench/.venv-dbos: `pip install dbos aiohttp psycopg[binary]`): --dbos-jobs async
  workflows enqueued by a DBOSClient, then as many worker processes as ours (worker_concurrency
  --dbos-concurrency, queue polled every 0.1 s); no-op, and with the HTTP call as a step.
- **Procrastinate** (bench/.venv-peers): --slow-jobs no-op jobs (batch_defer_async), then as many
  worker processes as ours (concurrency --procrastinate-concurrency); throughput = N / (first
  'started' event -> last 'succeeded' event).
- **Celery** with the local Redis (bench/.venv-peers), per pool in --celery-pools: --slow-jobs tasks
  making the same HTTP call, sent first, then the workers; throughput = N / (the target's first
  answer to one of them -> its N-th). Its best pool is compared.
- **raw floor** (bench/floor.py): claim + complete in batches of 100 and of 500 on 2 connections,
  --floor-jobs jobs, nothing else (no HTTP, no history).

The slow peers run fewer jobs so that one command stays well under 15 minutes on a 2-core
machine; each side's count is large enough for its rate to settle (it runs for seconds).
PostgreSQL CPU per job is the CPU of that side's own PostgreSQL backends (from /proc, read while
their connections are open) over the jobs: for pgqueuer, the floor and ours (DBOS and the others
are not instrumented). The database is scheduler_bench_peers (dropped and made again): the
project's tables and every peer's schema. Goals (issue 31): ours >= 1.5x pgqueuer with the same
HTTP call and >= 0.5x pgqueuer with no-op jobs, >= 10x Procrastinate, >= 5x Celery's best pool,
>= 5x DBOS (with the HTTP call).
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
PGQ_PY = C.BENCH / ".venv-pgqueuer" / "bin" / "python"
DBOS_PY = C.BENCH / ".venv-dbos" / "bin" / "python"
# Each peer in a virtualenv of its own (none is a dependency of the project, and their
# requirements need not agree): (python, a check that it is complete, what to install).
VENVS = {
    "peers": (PEERS_PY, "import procrastinate, psycopg, celery, gevent, redis",
              ["procrastinate", "psycopg[binary]", "celery[redis]", "gevent", "requests"]),
    "pgqueuer": (PGQ_PY, "import pgqueuer, asyncpg, uvloop, aiohttp", ["pgqueuer", "asyncpg", "uvloop", "aiohttp"]),
    "dbos": (DBOS_PY, "import dbos, aiohttp, psycopg", ["dbos", "aiohttp", "psycopg[binary]"]),
}


def ensure_venv(name: str) -> None:
    py, check, packages = VENVS[name]
    if py.exists() and subprocess.run([str(py), "-c", check], capture_output=True).returncode == 0:
        return
    print(f"making bench/{py.parent.parent.name} ({', '.join(packages)}; for this benchmark only)...", flush=True)
    subprocess.run(["python3", "-m", "venv", str(py.parent.parent)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", *packages], check=True)


def ensure_peers_venv():
    ensure_venv("peers")


def version_of(py, dist: str) -> str:
    return subprocess.run([str(py), "-c", f"import importlib.metadata as m; print(m.version('{dist}'))"],
                          capture_output=True, text=True).stdout.strip()


def backends_cpu(application_name: str) -> dict:
    """CPU seconds so far of each open PostgreSQL backend named application_name."""
    return {pid: C.proc_cpu(pid) or 0.0 for pid in C.backend_pids(application_name)}


def _seconds(out) -> float:
    return float(out.strip().rsplit("seconds=", 1)[1])


def _first_last(line: str) -> dict:
    kv = dict(x.split("=", 1) for x in line.split())
    return {k: (None if v == "None" else float(v)) for k, v in kv.items()}


def pgqueuer_round(dsn, n, kind, target, workers, batch, managers) -> dict:
    """N pgqueuer jobs (KIND noop or http), `workers` processes x `managers` queue managers."""
    C.sql("TRUNCATE pgqueuer, pgqueuer_log", fetch=False)
    out = subprocess.run([str(PGQ_PY), str(C.BENCH / "peers_pgqueuer.py"), dsn, "enqueue", str(n)],
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"pgqueuer enqueue: {out.stderr[-2000:]}")
    enqueue_s = _seconds(out.stdout)
    C.vacuum_analyze("pgqueuer")
    count0 = target.count()
    procs = [subprocess.Popen([str(PGQ_PY), str(C.BENCH / "peers_pgqueuer.py"), dsn, "work", kind, target.url,
                               str(batch), str(managers), f"q{i}"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(workers)]
    try:
        for p in procs:
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError(f"pgqueuer worker: {p.stderr.read()[-2000:]}")
        cpu0 = backends_cpu("peers-pgqueuer")
        for p in procs:
            p.stdin.write("\n")
            p.stdin.flush()
        got = []
        for p in procs:
            line = p.stdout.readline()
            if not line.startswith("first="):
                raise RuntimeError(f"pgqueuer worker: {p.stderr.read()[-2000:]}")
            got.append(_first_last(line))
        cpu1 = backends_cpu("peers-pgqueuer")
        for p in procs:
            p.stdin.write("\n")
            p.stdin.flush()
        for p in procs:
            p.wait(60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    done = int(sum(g["jobs"] for g in got))
    span = max(g["last"] for g in got if g["last"]) - min(g["first"] for g in got if g["first"])
    pg = sum(cpu1.get(pid, c0) - c0 for pid, c0 in cpu0.items())
    left = C.sql("SELECT count(*) FROM pgqueuer")[0][0]
    return {"done": done, "left": left, "span": span, "rate": n / span, "pg_us": pg / n * 1e6,
            "enqueue_rate": n / enqueue_s, "delivered": target.count() - count0}


def dbos_round(dsn, n, kind, target, workers, concurrency) -> dict:
    """N DBOS workflows (KIND noop, or http: the call as a step), `workers` processes."""
    C.sql("TRUNCATE dbos.workflow_status CASCADE", fetch=False)
    out = subprocess.run([str(DBOS_PY), str(C.BENCH / "peers_dbos.py"), dsn, "enqueue", str(n), kind, target.url],
                         capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"dbos enqueue: {out.stderr[-2000:]}")
    enqueue_s = _seconds(out.stdout)
    count0 = target.count()
    procs = [subprocess.Popen([str(DBOS_PY), str(C.BENCH / "peers_dbos.py"), dsn, "work", kind, target.url,
                               str(concurrency), f"dbos{i}"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(workers)]
    got = []
    try:
        for p in procs:
            line = p.stdout.readline()
            if not line.startswith("first="):
                raise RuntimeError(f"dbos worker: {p.stderr.read()[-2000:]}")
            got.append(_first_last(line))
        for p in procs:
            p.stdin.write("\n")
            p.stdin.flush()
        for p in procs:
            p.wait(60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    done = C.sql("SELECT count(*) FROM dbos.workflow_status WHERE status = 'SUCCESS'")[0][0]
    span = max(g["last"] for g in got if g["last"]) - min(g["first"] for g in got if g["first"])
    return {"done": done, "span": span, "rate": n / span, "enqueue_rate": n / enqueue_s,
            "delivered": target.count() - count0}


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
    now = C.db_now()
    if now >= t:
        procs.stop()
        raise SystemExit("loading and starting took past the instant: raise --lead")
    # Each worker opens its other sessions as it starts: list the backends just before the instant.
    time.sleep(max(0, (t - now).total_seconds() - 1.0))
    cpu0 = backends_cpu("scheduler-work")
    delivered0 = target.count()
    done = C.wait_drained(procs, timeout=900)
    cpu1 = backends_cpu("scheduler-work")
    procs.stop()
    r = C.run_outcome(t)
    span = r["all_succeeded"] - r["first_started"]
    pg = sum(cpu1.get(pid, c0) - c0 for pid, c0 in cpu0.items())
    return {"done": r["succeeded"], "span": span, "rate": n / span, "delivered": target.count() - delivered0,
            "finished": done, "pg_us": pg / n * 1e6}


def ratio_line(name, ours, theirs, goal=None):
    """'name  x.xx (per round: a, b, c)' of our rate over theirs."""
    per = [o["rate"] / t["rate"] for o, t in zip(ours, theirs) if o.get("rate") and t.get("rate")]
    m = C.median([o["rate"] for o in ours]) / C.median([t["rate"] for t in theirs])
    verdict = "" if goal is None else f"   goal >= {goal}x: {'met' if m >= goal else 'NOT met'}"
    return m, f"  ours / {name:<28} {m:6.2f}x (per round: {', '.join(f'{x:.2f}' for x in per)}){verdict}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=20_000, help="runs of ours and jobs of pgqueuer per round")
    ap.add_argument("--slow-jobs", type=int, default=5_000, help="jobs of Procrastinate and Celery per round")
    ap.add_argument("--dbos-jobs", type=int, default=2_000, help="workflows of DBOS per round (each kind)")
    ap.add_argument("--floor-jobs", type=int, default=100_000, help="jobs of the raw floor per round (each batch)")
    ap.add_argument("--floor-batches", default="100,500")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--config", default="2x1024x400", help="our WORKERSxCONCURRENCYxBATCH; every peer gets as many processes")
    ap.add_argument("--pgqueuer-batch", type=int, default=100)
    ap.add_argument("--pgqueuer-managers", type=int, default=2, help="queue managers per pgqueuer process")
    ap.add_argument("--dbos-concurrency", type=int, default=200)
    ap.add_argument("--procrastinate-concurrency", type=int, default=20)
    ap.add_argument("--celery-pools", default="prefork:8,gevent:256",
                    help="comma-separated POOL:CONCURRENCY for Celery; the best is compared")
    ap.add_argument("--skip", default="", help="comma-separated sides to leave out: pgqueuer,dbos,procrastinate,celery,floor")
    ap.add_argument("--poll", type=float, default=1.0)
    ap.add_argument("--lead", type=float, default=15.0, help="seconds from loading our runs to their instant (raise it on a loaded machine)")
    ap.add_argument("--database", default="scheduler_bench_peers")
    args = ap.parse_args()
    cfg = C.WorkerConfig.parse(args.config)
    skip = {x for x in args.skip.split(",") if x}
    sides = [x for x in ("pgqueuer", "dbos", "procrastinate", "celery", "floor") if x not in skip]

    for name in {"procrastinate": "peers", "celery": "peers", "pgqueuer": "pgqueuer", "dbos": "dbos"}.items():
        if name[0] in sides:
            ensure_venv(name[1])
    print(C.machine_line(), flush=True)
    t_start = time.monotonic()
    C.ensure_out_dir()
    C.setup_database(args.database)
    dsn = f"{C.PG_SERVER}/{args.database}"
    versions = {}
    if "procrastinate" in sides:
        peers(dsn, "setup")
        versions["procrastinate"] = version_of(PEERS_PY, "procrastinate")
    if "celery" in sides:
        versions["celery"] = version_of(PEERS_PY, "celery")
    if "pgqueuer" in sides:
        subprocess.run([str(PGQ_PY), str(C.BENCH / "peers_pgqueuer.py"), dsn, "setup"], check=True, capture_output=True)
        versions["pgqueuer"] = version_of(PGQ_PY, "pgqueuer")
    if "dbos" in sides:
        subprocess.run([str(DBOS_PY), str(C.BENCH / "peers_dbos.py"), dsn, "setup"], check=True, capture_output=True)
        versions["dbos"] = version_of(DBOS_PY, "dbos")
    target = C.Target(1)
    pools = [(p.split(":")[0], int(p.split(":")[1])) for p in args.celery_pools.split(",") if p]
    floor_batches = [int(b) for b in args.floor_batches.split(",") if b]
    res = {k: [] for k in ("ours", "pgq_noop", "pgq_http", "dbos_noop", "dbos_http", "procrastinate")}
    res.update({f"celery {p}:{c}": [] for p, c in pools})
    res.update({f"floor {b}": [] for b in floor_batches})
    try:
        tenant = C.load_tenant("peers", target.prefix)
        s = C.load_schedules("pe", tenant, args.jobs, target_url=target.url, next_run_at="now() + interval '10 days'")
        C.vacuum_analyze("schedules_schedule", "schedules_scheduleversion")
        for rep in range(args.rounds):
            tag = f"  [#{rep + 1}]"
            if "pgqueuer" in sides:
                r = pgqueuer_round(dsn, args.jobs, "noop", target, cfg.workers, args.pgqueuer_batch, args.pgqueuer_managers)
                res["pgq_noop"].append(r)
                print(f"{tag} pgqueuer {versions['pgqueuer']} no-op: {r['done']}/{args.jobs} done ({r['left']} left), "
                      f"{r['rate']:.0f} jobs/s ({r['span']:.2f}s), PostgreSQL {r['pg_us']:.0f} µs/job; "
                      f"enqueued at {r['enqueue_rate']:.0f}/s", flush=True)
            o = scheduler_round(args, cfg, s, target, args.jobs, rep)
            res["ours"].append(o)
            print(f"{tag} scheduler: {o['done']}/{args.jobs} succeeded, {o['rate']:.0f} runs/s ({o['span']:.2f}s first "
                  f"start -> last success), target answered {o['delivered']}, PostgreSQL {o['pg_us']:.0f} µs/run",
                  flush=True)
            if "pgqueuer" in sides:
                r = pgqueuer_round(dsn, args.jobs, "http", target, cfg.workers, args.pgqueuer_batch, args.pgqueuer_managers)
                res["pgq_http"].append(r)
                print(f"{tag} pgqueuer {versions['pgqueuer']} HTTP call: {r['done']}/{args.jobs} done, target answered "
                      f"{r['delivered']}, {r['rate']:.0f} jobs/s ({r['span']:.2f}s), PostgreSQL {r['pg_us']:.0f} µs/job",
                      flush=True)
            if "floor" in sides:
                from floor import floor_round

                for b in floor_batches:
                    r = floor_round(dsn, args.floor_jobs, b, 2)
                    res[f"floor {b}"].append(r)
                    print(f"{tag} raw floor, batches of {b}, 2 connections: {r['done']}/{args.floor_jobs}, "
                          f"{r['rate']:.0f} jobs/s ({r['span']:.2f}s), PostgreSQL {r['pg_us']:.0f} µs/job", flush=True)
            if "dbos" in sides:
                for kind in ("noop", "http"):
                    r = dbos_round(dsn, args.dbos_jobs, kind, target, cfg.workers, args.dbos_concurrency)
                    res[f"dbos_{kind}"].append(r)
                    print(f"{tag} DBOS {versions['dbos']} {'no-op' if kind == 'noop' else 'HTTP call as a step'}: "
                          f"{r['done']}/{args.dbos_jobs} succeeded, target answered {r['delivered']}, "
                          f"{r['rate']:.0f} workflows/s ({r['span']:.2f}s); enqueued at {r['enqueue_rate']:.0f}/s",
                          flush=True)
            if "procrastinate" in sides:
                p = procrastinate_round(dsn, args.slow_jobs, cfg.workers, args.procrastinate_concurrency)
                res["procrastinate"].append(p)
                print(f"{tag} Procrastinate {versions['procrastinate']}: {p['done']}/{args.slow_jobs} succeeded, "
                      f"{p['rate']:.0f} jobs/s ({p['span']:.2f}s first start -> last success; workers' wall "
                      f"{p['wall']:.2f}s); batch defer {p['defer_rate']:.0f} jobs/s", flush=True)
            if "celery" in sides:
                for pool, conc in pools:
                    c = celery_round(pool, conc, cfg.workers, target, args.slow_jobs)
                    res[f"celery {c['pool']}"].append(c)
                    print(f"{tag} Celery {versions['celery']} {c['pool']}: target answered {c['done']}/{args.slow_jobs}, "
                          f"{C.fmt(c['rate'], '', 0)} tasks/s ({C.fmt(c['span'], 's', 2)} first call -> last); "
                          f"sent at {c['send_rate']:.0f} tasks/s", flush=True)

        print(f"\npeers, median of {args.rounds} interleaved rounds, {cfg.workers} worker process(es) each side "
              f"(ours: {cfg}), same machine and PostgreSQL, {time.monotonic() - t_start:.0f}s in all:")
        ours = res["ours"]
        print(f"  scheduler, HTTP call per run       {C.spread([o['rate'] for o in ours], 0)} runs/s, "
              f"PostgreSQL {C.fmt(C.median([o['pg_us'] for o in ours]), ' µs/run', 0)}  ({args.jobs} runs)")
        rows = [("pgq_noop", f"pgqueuer {versions.get('pgqueuer')} no-op", "jobs/s", True),
                ("pgq_http", f"pgqueuer {versions.get('pgqueuer')} HTTP call", "jobs/s", True),
                *((f"floor {b}", f"raw floor, batches of {b}", "jobs/s", True) for b in floor_batches),
                ("dbos_noop", f"DBOS {versions.get('dbos')} no-op", "workflows/s", False),
                ("dbos_http", f"DBOS {versions.get('dbos')} HTTP step", "workflows/s", False),
                ("procrastinate", f"Procrastinate {versions.get('procrastinate')} no-op", "jobs/s", False),
                *((f"celery {p}:{c}", f"Celery {versions.get('celery')} {p}:{c}, HTTP", "tasks/s", False) for p, c in pools)]
        for key, label, unit, has_pg in rows:
            if res[key]:
                pg = f", PostgreSQL {C.fmt(C.median([r['pg_us'] for r in res[key]]), ' µs/job', 0)}" if has_pg else ""
                print(f"  {label:<34} {C.spread([r['rate'] for r in res[key]], 0)} {unit}{pg}")
        print("ratios (ours over theirs, each round's pair from the same round):")
        met = {}
        if res["pgq_http"]:
            met["pgq_http"] = ratio_line("pgqueuer, same HTTP call", ours, res["pgq_http"], 1.5)
            met["pgq_noop"] = ratio_line("pgqueuer, no-op", ours, res["pgq_noop"], 0.5)
            pg_ratio = C.median([o["pg_us"] for o in ours]) / C.median([r["pg_us"] for r in res["pgq_noop"]])
        for b in floor_batches:
            if res[f"floor {b}"]:
                met[f"floor {b}"] = ratio_line(f"raw floor, batches of {b}", ours, res[f"floor {b}"], 0.4 if b == 500 else None)
        if res["dbos_http"]:
            met["dbos"] = ratio_line("DBOS, HTTP step", ours, res["dbos_http"], 5)
            met["dbos_noop"] = ratio_line("DBOS, no-op", ours, res["dbos_noop"])
        if res["procrastinate"]:
            met["procrastinate"] = ratio_line("Procrastinate, no-op", ours, res["procrastinate"], 10)
        celery_keys = [k for k in res if k.startswith("celery ") and res[k]]
        if celery_keys:
            best = max(celery_keys, key=lambda k: C.median([c["rate"] for c in res[k]]) or 0)
            met["celery"] = ratio_line(f"Celery's best ({best[7:]})", ours, res[best], 5)
        for _, (m, line) in met.items():
            print(line)
        if res["pgq_noop"]:
            print(f"  PostgreSQL CPU per run / pgqueuer's per no-op job: {pg_ratio:.2f}x "
                  f"(ours {C.median([o['pg_us'] for o in ours]):.0f} µs, pgqueuer {C.median([r['pg_us'] for r in res['pgq_noop']]):.0f} µs)")
        ok = (all(o["done"] == o["delivered"] == args.jobs for o in ours)
              and all(r["done"] == args.jobs for r in res["pgq_noop"] + res["pgq_http"])
              and all(r["delivered"] == args.jobs for r in res["pgq_http"])
              and all(r["done"] == args.dbos_jobs for r in res["dbos_noop"] + res["dbos_http"])
              and all(r["done"] == args.floor_jobs for b in floor_batches for r in res[f"floor {b}"])
              and all(p["done"] == args.slow_jobs for p in res["procrastinate"])
              and all(c["done"] >= args.slow_jobs for k in celery_keys for c in res[k]))
        print(f"  completeness: {'OK (every job of every side done, every HTTP side answered N times)' if ok else 'MISMATCH'}")
    finally:
        target.close()


if __name__ == "__main__":
    main()
