"""API create: how fast services can create schedules through the real API (gunicorn, DRF, an API
key, the tenant's allowlist, the audit log), as a load test from outside would.

    .venv/bin/python bench/api_create.py [--creates 3000] [--gunicorn-workers 4] [--threads 8] [--repeats 3]
                                         [--client requests|http] [--gunicorn-threads N]
    .venv/bin/python bench/api_create.py --client wrk --seconds 20 --repeats 3   # the default when wrk is installed
    .venv/bin/python bench/api_create.py --bulk 1000 --creates 500000 --threads 2 --repeats 1
    .venv/bin/python bench/api_create.py --with-bulk 1000 --repeats 3     # single, floor and bulk interleaved

Per repeat: N `POST /api/v1/schedules` (one-time `at(...)` schedules) from client threads with
keep-alive sessions, on the same machine as gunicorn and PostgreSQL (the client's CPU counts
against the same 2 cores). With `--bulk K`, the same N schedules go as N/K
`POST /api/v1/schedules/batch` requests of K items each (`rate(1 day)` rules with their own
anchors, as a fleet being loaded would send them). The per-key rate limit is raised for the run
(SCHEDULER_API_RATE_LIMIT_PER_MINUTE; the shipped 600 per minute would cap it at 10/s); the
tenant's schedule quota applies, as in a deployment, but is set far above what the run makes
(`--quota`; 0 for none). Prints
schedules created per second and the p50/p99 request time, and for single creates the CPU each
create cost gunicorn, PostgreSQL (all its processes) and the client; every answer must be 201
(every item 201 in a batch), and the database must hold every schedule. With wrk installed (Debian's
package `wrk`) the single creates come from it by default (bench/api_create_wrk.lua), for
`--seconds` per repeat (interleaved with the DRF floor app, bench/drf_floor, and with `--with-bulk K`
a bulk round after each, so both ratios of issue 31 come from one command): a C load generator whose CPU per request is a tenth of http.client's and a
tenth of requests', so the 2 cores shared with the server go almost all to the server, as they would
with the clients on other machines. `--client requests|http` measures with those Python clients.

Database: scheduler_bench_api (dropped and made again).
"""

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_clients(client, each_args) -> float:
    """Run `client(*args)` in one thread per entry of `each_args`, all at once; the wall time."""
    threads = [threading.Thread(target=client, args=args) for args in each_args]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def requests_poster(url, key):
    """POST with the requests library (what most Python services use), keep-alive session."""
    import requests

    s = requests.Session()
    s.headers["Authorization"] = "Bearer " + key

    def post(path, body):
        return s.post(url + path, json=body).status_code

    return post


def http_poster(url, key):
    """POST with the standard library's http.client: a quarter of requests' CPU per request, which
    matters when the client shares the server's 2 cores. Reconnects when the server closes (a sync
    gunicorn worker closes after every response)."""
    import http.client
    import json
    from urllib.parse import urlsplit

    host, port = urlsplit(url).hostname, urlsplit(url).port
    headers = {"Authorization": "Bearer " + key, "Content-Type": "application/json"}
    conn = [None]

    def post(path, body):
        if conn[0] is None:
            conn[0] = http.client.HTTPConnection(host, port)
        conn[0].request("POST", path, body=json.dumps(body), headers=headers)
        r = conn[0].getresponse()
        r.read()
        if r.will_close:
            conn[0].close()
            conn[0] = None
        return r.status

    return post


POSTERS = {"requests": requests_poster, "http": http_poster}


def one_run(args, url, key, tag):
    body = {"expression": "at(2030-01-01T00:00:00)", "timeZone": "UTC",
            "target": {"url": "http://127.0.0.1:9/run"}, "name": ""}
    codes, times, lock = {}, [], threading.Lock()

    def client(n, t):
        post = POSTERS[args.client](url, key)
        mine = []
        for i in range(n):
            body_i = dict(body, name=f"{tag}-{t}-{i}")
            t0 = time.perf_counter()
            status = post("/api/v1/schedules", body_i)
            mine.append(time.perf_counter() - t0)
            with lock:
                codes[status] = codes.get(status, 0) + 1
        with lock:
            times.extend(mine)

    if args.bulk:
        return bulk_run(args, url, key, tag)
    if args.client == "wrk":
        return wrk_run(args, url, key, tag)
    per = args.creates // args.threads
    meter, client0 = start_cpu(args), os.times()
    wall = run_clients(client, [(per, t) for t in range(args.threads)])
    n = per * args.threads
    return {"n": n, "wall": wall, "rate": n / wall, "codes": codes, "cpu": stop_cpu(meter, client0, n),
            "p50": C.percentile(times, 50), "p99": C.percentile(times, 99)}


def wrk_run(args, url, key, tag, path="/api/v1/schedules", table="schedules_schedule", pid=None):
    """The single creates from wrk (Debian's package; a C load generator, one thread and
    `--threads` connections) for `--seconds`: a client of a few tens of microseconds of CPU per
    request, so the 2 cores are nearly all the server's. The schedules made are counted in the
    database."""
    import json

    if not shutil.which("wrk"):
        sys.exit("--client wrk needs wrk: apt-get install wrk")
    before = C.sql(f"SELECT count(*) FROM {table}")[0][0]
    meter, client0 = start_cpu(args, pid), os.times()
    t0 = time.perf_counter()
    out = subprocess.run(["wrk", "-t1", f"-c{args.threads}", f"-d{args.seconds}s", "--latency", "-s",
                          str(Path(__file__).with_name("api_create_wrk.lua")), url],
                         env={**os.environ, "KEY": key, "TAG": tag, "WRK_PATH": path}, capture_output=True, text=True,
                         check=True)
    wall = time.perf_counter() - t0
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    time.sleep(1)  # requests still in flight when wrk stopped finish in gunicorn and are counted
    made = C.sql(f"SELECT count(*) FROM {table}")[0][0] - before
    failed = seen["not_2xx"] + seen["socket_errors"]
    codes = {201: made, "not 201 or no answer": failed} if failed else {201: made}
    # wrk's own figures count from its start; the rate is what the database holds over the wall time.
    return {"n": made, "wall": wall, "rate": made / wall, "codes": codes, "cpu": stop_cpu(meter, client0, made),
            "p50": seen["p50_us"] / 1e6, "p99": seen["p99_us"] / 1e6, "created": made}


def start_cpu(args, pid=None):
    """Where the CPU goes: gunicorn (master and workers), every PostgreSQL process (the backends
    serving the workers, the WAL writer, the checkpointer), and this process (the clients)."""
    pid = pid or args.gunicorn_pid
    gunicorn = [pid] + [int(p) for p in subprocess.run(
        ["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()]
    meter = C.CpuMeter()
    meter.start({"gunicorn": gunicorn})
    meter.database = args.database if args.own_backends else None
    meter.postgres0 = postgres_cpu(meter.database)
    # Sampled through the run too: a backend that ends mid-run (Django reconnects after
    # CONN_MAX_AGE) keeps the CPU it was last seen with.
    meter.postgres_seen = dict(meter.postgres0)
    meter.sampling = threading.Event()

    def sample():
        while not meter.sampling.wait(0.5):
            meter.postgres_seen.update(postgres_cpu(meter.database))

    meter.sampler = threading.Thread(target=sample, daemon=True)
    meter.sampler.start()
    return meter


def postgres_cpu(database: str | None = None) -> dict:
    """CPU seconds of PostgreSQL processes by pid: a backend a worker opens during the run is
    counted from its start. With `database`, only the backends connected to it (their process
    title names it): on a machine shared with other work, the server's other sessions are not
    this benchmark's; the WAL writer and checkpointer are then left out too."""
    pids = subprocess.run(["pgrep", "-u", "postgres"], capture_output=True, text=True).stdout.split()
    if database:
        def ours(pid):
            try:
                return f" {database} ".encode() in open(f"/proc/{pid}/cmdline", "rb").read()
            except OSError:
                return False
        pids = [p for p in pids if ours(p)]
    return {p: cpu for p in pids if (cpu := C.proc_cpu(int(p))) is not None}


def stop_cpu(meter, client0, n) -> dict:
    used = meter.stop()
    client1 = os.times()
    meter.sampling.set()
    meter.sampler.join()
    meter.postgres_seen.update(postgres_cpu(meter.database))
    used["postgres"] = sum(cpu - meter.postgres0.get(pid, 0.0) for pid, cpu in meter.postgres_seen.items())
    # This process's threads, and a client process it ran and waited for (wrk).
    used["client"] = sum(getattr(client1, f) - getattr(client0, f)
                         for f in ("user", "system", "children_user", "children_system"))
    n = max(n, 1)
    return {"gunicorn": used["gunicorn"] / n * 1000, "postgres": used["postgres"] / n * 1000,
            "client": used["client"] / n * 1000, "busy": used["_machine_busy_cores"]}


def bulk_run(args, url, key, tag):
    """N schedules in requests of args.bulk items to /schedules/batch, from args.threads clients."""
    import json

    import requests

    codes, times, lock = {}, [], threading.Lock()
    requests_total = args.creates // args.bulk
    per = requests_total // args.threads

    def client(t):
        s = requests.Session()
        s.headers["Authorization"] = "Bearer " + key
        s.headers["Content-Type"] = "application/json"
        mine = []
        for i in range(per):
            items = [{"expression": "rate(1 day)", "timeZone": "UTC", "target": {"url": "http://127.0.0.1:9/run"},
                      "name": f"{tag}-{t}-{i}-{j}"} for j in range(args.bulk)]
            body = json.dumps({"schedules": items})
            t0 = time.perf_counter()
            r = s.post(url + "/api/v1/schedules/batch", data=body)
            mine.append(time.perf_counter() - t0)
            got = r.json() if r.status_code in (201, 207) else {}
            with lock:
                codes[r.status_code] = codes.get(r.status_code, 0) + 1
                if r.status_code not in (201, 207):
                    codes.setdefault("first error", r.text[:300])
                codes["items created"] = codes.get("items created", 0) + got.get("created", 0)
        with lock:
            times.extend(mine)

    wall = run_clients(client, [(t,) for t in range(args.threads)])
    n = per * args.threads * args.bulk
    created = codes.pop("items created", 0)
    return {"n": n, "wall": wall, "rate": created / wall, "codes": codes, "created": created,
            "p50": C.percentile(times, 50), "p99": C.percentile(times, 99)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--creates", type=int, default=3000)
    ap.add_argument("--gunicorn-workers", type=int, default=4,
                    help="as the README's production command (a sync worker waits on PostgreSQL between "
                         "statements, so two leave the 2 cores partly idle)")
    ap.add_argument("--gunicorn-threads", type=int, default=0,
                    help="with N > 0, the gthread worker class with N threads per worker (keeps connections alive)")
    ap.add_argument("--client", choices=sorted([*POSTERS, "wrk"]), default="wrk" if shutil.which("wrk") else "requests",
                    help="load generator of the single creates: wrk when installed (the least CPU taken from "
                         "the server's 2 cores), else requests; the bulk run always uses requests")
    ap.add_argument("--seconds", type=int, default=15, help="with --client wrk: how long each repeat runs")
    ap.add_argument("--threads", type=int, default=8, help="client threads, each with a keep-alive session")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--bulk", type=int, default=0, help="items per POST /schedules/batch (0: single creates)")
    ap.add_argument("--with-bulk", type=int, default=0,
                    help="single creates, and after each round a bulk round of this many items per batch "
                         "(--bulk-creates schedules): the bulk / single ratio in one command (issue 31)")
    ap.add_argument("--bulk-creates", type=int, default=40_000, help="schedules per bulk round with --with-bulk")
    ap.add_argument("--quota", type=int, default=1_000_000_000,
                    help="the tenant's schedule quota (SCHEDULER_MAX_SCHEDULES_PER_TENANT): by default one that "
                         "applies, as a deployment's does, and is never reached; 0: no quota")
    ap.add_argument("--own-backends", action="store_true",
                    help="count only the PostgreSQL backends of the bench database (on a machine shared with other "
                         "work), not every PostgreSQL process")
    ap.add_argument("--warmup", type=float, default=3.0,
                    help="seconds of wrk sent to each server before the measured repeats (not counted): the first "
                         "request of each worker imports the URL configuration")
    ap.add_argument("--no-floor", action="store_true",
                    help="single creates with wrk are interleaved with the DRF floor app (bench/drf_floor) unless this is given")
    ap.add_argument("--database", default="scheduler_bench_api")
    args = ap.parse_args()

    print(C.machine_line(), flush=True)
    if not args.bulk and args.client != "wrk" and not shutil.which("wrk"):
        print("note: wrk is not installed (apt-get install wrk): the single creates come from Python's "
              f"{args.client}, whose CPU per request is taken from the same 2 cores as the server's", flush=True)
    C.setup_database(args.database)
    from schedules.tenants import create_api_key, create_tenant

    tenant = create_tenant("bench-api", allow_targets=["http://127.0.0.1:9/"])
    _, key = create_api_key(tenant, label="bench")
    port = free_port()
    env = C.bench_env(args.database, SCHEDULER_API_RATE_LIMIT_PER_MINUTE=10_000_000,
                      SCHEDULER_MAX_SCHEDULES_PER_TENANT=args.quota)
    gunicorn = subprocess.Popen(
        [str(C.PYTHON.parent / "gunicorn"), "scheduler_project.wsgi", "--bind", f"127.0.0.1:{port}",
         "--workers", str(args.gunicorn_workers), "--log-level", "warning", "--timeout", "120",
         *(["--worker-class", "gthread", "--threads", str(args.gunicorn_threads)] if args.gunicorn_threads else [])],
        cwd=C.CODE, env=env)
    args.gunicorn_pid = gunicorn.pid
    floor = None
    with_floor = not args.bulk and args.client == "wrk" and not args.no_floor
    if with_floor:
        # The framework's floor (bench/drf_floor): the same gunicorn, workers and wrk, its own table.
        sys.path.insert(0, str(C.BENCH))
        from drf_floor.table import TABLE_SQL

        C.sql(TABLE_SQL, fetch=False)
        floor_port = free_port()
        floor = subprocess.Popen(
            [str(C.PYTHON.parent / "gunicorn"), "drf_floor.wsgi", "--bind", f"127.0.0.1:{floor_port}",
             "--workers", str(args.gunicorn_workers), "--log-level", "warning", "--timeout", "120",
             *(["--worker-class", "gthread", "--threads", str(args.gunicorn_threads)] if args.gunicorn_threads else [])],
            cwd=C.BENCH, env={**C.bench_env(args.database), "DJANGO_SETTINGS_MODULE": "drf_floor.settings"})
    try:
        url = f"http://127.0.0.1:{port}"
        import requests

        for health in [url + "/healthz"] + ([f"http://127.0.0.1:{floor_port}/items"] if floor else []):
            for _ in range(100):
                try:
                    if requests.get(health, timeout=1).status_code in (200, 405):
                        break
                except requests.RequestException:
                    pass
                time.sleep(0.1)
        if args.client == "wrk" and not args.bulk and args.warmup:
            seconds, args.seconds = args.seconds, max(1, round(args.warmup))
            wrk_run(args, url, key, "warm")
            if floor:
                wrk_run(args, f"http://127.0.0.1:{floor_port}", key, "warm", path="/items",
                        table="bench_drf_floor_item", pid=floor.pid)
            args.seconds = seconds
            warm = C.sql("SELECT count(*) FROM schedules_schedule")[0][0]
        else:
            warm = 0
        results, floors, bulks = [], [], []
        for rep in range(args.repeats):
            r = one_run(args, url, key, f"r{rep}")
            results.append(r)
            cpu = r.get("cpu")
            where = (f"; CPU per create: gunicorn {cpu['gunicorn']:.2f} ms, PostgreSQL {cpu['postgres']:.2f} ms, "
                     f"client {cpu['client']:.2f} ms; machine busy {cpu['busy']:.2f} cores") if cpu else ""
            print(f"  [#{rep + 1}] {r['n']} {'schedules in batches of ' + str(args.bulk) if args.bulk else 'creates'} in {r['wall']:.1f}s: {r['rate']:.0f}/s, request p50 "
                  f"{r['p50'] * 1000:.1f} ms p99 {r['p99'] * 1000:.1f} ms, answers {r['codes']}{where}", flush=True)
            if floor:
                f = wrk_run(args, f"http://127.0.0.1:{floor_port}", key, f"f{rep}", path="/items",
                            table="bench_drf_floor_item", pid=floor.pid)
                floors.append(f)
                cpu = f["cpu"]
                print(f"  [#{rep + 1}] DRF floor: {f['n']} creates in {f['wall']:.1f}s: {f['rate']:.0f}/s, request p50 "
                      f"{f['p50'] * 1000:.1f} ms p99 {f['p99'] * 1000:.1f} ms, answers {f['codes']}; CPU per create: "
                      f"gunicorn {cpu['gunicorn']:.2f} ms, PostgreSQL {cpu['postgres']:.2f} ms; ours/floor "
                      f"{r['rate'] / f['rate']:.2f}x", flush=True)
            if args.with_bulk:
                single = (args.bulk, args.creates)
                args.bulk, args.creates = args.with_bulk, args.bulk_creates
                try:
                    b = bulk_run(args, url, key, f"b{rep}")
                finally:
                    args.bulk, args.creates = single
                bulks.append(b)
                print(f"  [#{rep + 1}] bulk: {b['created']} schedules in batches of {args.with_bulk} in {b['wall']:.1f}s: "
                      f"{b['rate']:.0f}/s, request p50 {b['p50'] * 1000:.0f} ms, answers {b['codes']}; bulk/single "
                      f"{b['rate'] / r['rate']:.1f}x", flush=True)
        ok = all(set(r["codes"]) == {201} for r in results) and all(r.get("created", r["n"]) == r["n"] for r in results)
        made = C.sql("SELECT count(*) FROM schedules_schedule")[0][0]
        ok = ok and all(set(b["codes"]) == {201} and b["created"] == b["n"] for b in bulks)
        ok = ok and made == warm + sum(r["n"] for r in results) + sum(b["created"] for b in bulks)
        how = f"batches of {args.bulk} (POST /api/v1/schedules/batch)" if args.bulk else "single creates"
        if args.client == "wrk" and not args.bulk:
            how += f", as many as {args.seconds} s of wrk make,"
        server = f"{args.gunicorn_workers} workers" + (f" x {args.gunicorn_threads} threads" if args.gunicorn_threads else "")
        client = "" if args.bulk else f" ({args.client})"
        wrk = args.client == "wrk" and not args.bulk
        amount = "" if wrk else f"{args.creates} schedules per repeat in "
        clients = f"{args.threads} connections" if wrk else f"{args.threads} client threads"
        quota = f"a quota of {args.quota:,} schedules" if args.quota else "no quota"
        print(f"\napi create: {amount}{how} through gunicorn "
              f"({server}), {clients}{client} on the same machine, {quota}, median of {args.repeats}:")
        print(f"  schedules/s   {C.spread([r['rate'] for r in results], 0)}")
        print(f"  request p50   {C.spread([r['p50'] * 1000 for r in results], 1, ' ms')}")
        print(f"  request p99   {C.spread([r['p99'] * 1000 for r in results], 1, ' ms')}")
        if not args.bulk:
            for part in ("gunicorn", "postgres", "client"):
                print(f"  CPU/create    {part} {C.spread([r['cpu'][part] for r in results], 2, ' ms')}")
        if floors:
            ratio = C.median([r["rate"] for r in results]) / C.median([f["rate"] for f in floors])
            print(f"  DRF floor     {C.spread([f['rate'] for f in floors], 0)} creates/s (bench/drf_floor: one "
                  f"ModelSerializer, a CreateAPIView, a 10-column row; same gunicorn and wrk, interleaved)")
            for part in ("gunicorn", "postgres"):
                print(f"  floor CPU     {part} {C.spread([f['cpu'][part] for f in floors], 2, ' ms')}")
            per = ", ".join(f"{r['rate'] / f['rate']:.2f}" for r, f in zip(results, floors))
            print(f"  ours / floor  {ratio:.2f}x (per round: {per}); "
                  f"goal (issue 31) >= 1.0x: {'met' if ratio >= 1.0 else 'NOT met'}")
        if bulks:
            ratio = C.median([b["rate"] for b in bulks]) / C.median([r["rate"] for r in results])
            per = ", ".join(f"{b['rate'] / r['rate']:.1f}" for r, b in zip(results, bulks))
            print(f"  bulk          {C.spread([b['rate'] for b in bulks], 0)} schedules/s in batches of {args.with_bulk} "
                  f"(requests, {args.threads} threads), interleaved")
            print(f"  bulk / single {ratio:.1f}x (per round: {per}); goal (issue 31) >= 15x: "
                  f"{'met' if ratio >= 15 else 'NOT met'}")
        sent = sum(r["n"] for r in results) + sum(b["n"] for b in bulks)
        print(f"  check         {'OK: every answer 201' if ok else 'NOT every answer was 201'}, "
              f"{made - warm} schedules in the database (of {sent} sent; {warm} more from the "
              f"warm-up); load "
              + "/".join(f"{x:.2f}" for x in os.getloadavg()))
    finally:
        for server in (gunicorn, floor):
            if server is not None:
                server.send_signal(signal.SIGTERM)
                server.wait(30)


if __name__ == "__main__":
    main()
