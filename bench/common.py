"""Shared pieces of the issue-7 benchmarks: the machine line, a bench database of its own, a bulk
loader, a fast local target, worker subprocesses, CPU/RSS sampling and small statistics.

Every script in bench/ uses its own PostgreSQL database (scheduler_bench_<name>), dropped and
made again at the start, migrated with the project's migrations, and loaded with set-based SQL
(INSERT ... SELECT FROM generate_series): creating 100k runs or 1M schedules through the services
one by one would take longer than the benchmarks themselves.

The loader fills every column from the Django model (`insert_series`): columns the caller does not
give get the model default (auto_now columns get now()), so a column added by a later migration
with a default does not break the benchmarks.

Only 127.0.0.1 is ever contacted (PostgreSQL and the target).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
PYTHON = ROOT / ".venv" / "bin" / "python"
# The project code under test: this checkout, or a snapshot (BENCH_CODE=/tmp/snap, made with
# `git archive HEAD | tar -x -C /tmp/snap`) when the working tree is mid-change.
CODE = Path(os.environ.get("BENCH_CODE", str(ROOT))).resolve()
PG_SERVER = os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
CLK_TCK = os.sysconf("SC_CLK_TCK")

if str(CODE) not in sys.path:
    sys.path.insert(0, str(CODE))


# --------------------------------------------------------------------------------------------
# statistics


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def percentile(xs, p: float):
    """Linear interpolation between closest ranks (the same as numpy's default and PostgreSQL's
    percentile_cont)."""
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def fmt(x, unit="", nd=3):
    if x is None:
        return "n/a"
    return f"{x:.{nd}f}{unit}"


def spread(xs, nd=3, unit=""):
    """'median (runs: a, b, c)' for a list of per-repeat figures."""
    return f"{fmt(median(xs), unit, nd)} (runs: {', '.join(fmt(x, '', nd) for x in xs)})"


# --------------------------------------------------------------------------------------------
# the machine


def machine_line(pg_version: str | None = None) -> str:
    cpu = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gb = None
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                mem_gb = int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    load = os.getloadavg()
    pg = pg_version or server_version()
    code = "" if CODE == ROOT else f"; code under test: {CODE}"
    return (
        f"machine: {cpu}, {os.cpu_count()} cores, {mem_gb:.1f} GiB RAM, {pg}, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}; load average at start {load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f}{code}"
    )


def server_version() -> str:
    import psycopg

    with psycopg.connect(PG_SERVER + "/postgres", autocommit=True) as c:
        v = c.execute("SHOW server_version").fetchone()[0]
        sb = c.execute("SHOW shared_buffers").fetchone()[0]
        sc = c.execute("SHOW synchronous_commit").fetchone()[0]
    return f"PostgreSQL {v.split()[0]} (shared_buffers {sb}, synchronous_commit {sc})"


# --------------------------------------------------------------------------------------------
# the bench database


def bench_env(dbname: str, **extra) -> dict:
    """Environment for the project's commands against the bench database."""
    env = dict(os.environ)
    env.update(
        DATABASE_URL=f"{PG_SERVER}/{dbname}",
        DJANGO_SETTINGS_MODULE="scheduler_project.settings",
        SCHEDULER_ALLOW_DEV_SECRET="1",
        SCHEDULER_TARGET_ALLOWED_NETWORKS="127.0.0.0/8",
        LOG_LEVEL="WARNING",
        PYTHONUNBUFFERED="1",
    )
    env.update({k: str(v) for k, v in extra.items()})
    return env


def setup_database(dbname: str, *, fresh: bool = True) -> None:
    """Drop and create the bench database, point Django at it, migrate. Call before any model
    import that touches the database."""
    assert dbname.startswith("scheduler_bench_"), "bench databases are named scheduler_bench_*"
    import psycopg

    with psycopg.connect(PG_SERVER + "/postgres", autocommit=True) as c:
        exists = c.execute("SELECT 1 FROM pg_database WHERE datname = %s", [dbname]).fetchone()
        if exists and fresh:
            c.execute(f'DROP DATABASE "{dbname}" WITH (FORCE)')
            exists = None
        if not exists:
            c.execute(f'CREATE DATABASE "{dbname}"')
    os.environ.update({k: v for k, v in bench_env(dbname).items() if k not in ("PYTHONUNBUFFERED",)})
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    maintain()


def maintain() -> None:
    """One pass of the history maintenance, as a deployment's `maintain` loop makes it: partitions
    for the time ahead, quiet ones sealed (so the dispatch statements plan only the live ones).
    Code from before the history partitions has no such loop."""
    try:
        from dispatch.maintenance import Maintenance
    except ImportError:
        return
    Maintenance().step()


def sql(query, params=None, *, fetch=True):
    """Run one statement on Django's connection (autocommit unless inside atomic())."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(query, params)
        if fetch and cur.description:
            return cur.fetchall()
    return None


def db_now():
    return sql("SELECT statement_timestamp()")[0][0]


def truncate_runs() -> None:
    """Empty the run side (occurrences, runs, attempts, outbox); schedules stay."""
    sql("TRUNCATE runs_outboxevent, runs_attempt, runs_run, runs_occurrence", fetch=False)


def vacuum_analyze(*tables) -> None:
    for t in tables:
        sql(f"VACUUM (ANALYZE) {t}", fetch=False)


# --------------------------------------------------------------------------------------------
# the loader


def insert_series(model, n: int, exprs: dict | None = None, values: dict | None = None, *,
                  ordered_by: str | None = None) -> None:
    """INSERT n rows of `model` from generate_series(1, n) AS g(n), in SQL.

    `ordered_by` (an SQL expression over n): the rows go in in that order, and the expressions
    may also use r, the row's rank in it (1..n).

    `exprs` maps column names to SQL expressions over `n` (use mod(), not %, since parameters are
    bound); `values` maps attnames to Python values bound once for every row. Any other column
    gets the model's default (auto_now/auto_now_add: now()); a NOT NULL column with no default and
    no value is an error here rather than a confusing one from PostgreSQL."""
    from django.db import connection

    exprs, values = exprs or {}, values or {}
    cols, select, params = [], [], []
    from django.db.models.fields import AutoFieldMixin

    for f in model._meta.concrete_fields:
        if isinstance(f, AutoFieldMixin) and f.column not in exprs:
            continue  # identity column: PostgreSQL numbers the rows
        cols.append(f'"{f.column}"')
        if f.column in exprs:
            select.append(f"({exprs[f.column]})::{f.db_type(connection)}")
            continue
        if f.attname in values:
            v = values[f.attname]
        elif getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False):
            select.append("now()")
            continue
        elif f.has_default():
            v = f.get_default()
            if f.primary_key or f.unique:
                raise ValueError(f"{model.__name__}.{f.name} is unique: give an expression")
        elif f.null:
            v = None
        else:
            raise ValueError(f"{model.__name__}.{f.name} needs a value")
        select.append(f"%s::{f.db_type(connection)}")
        params.append(f.get_db_prep_save(v, connection))
    unknown = set(exprs) - {f.column for f in model._meta.concrete_fields}
    if unknown:
        raise ValueError(f"{model.__name__} has no column(s) {sorted(unknown)}")
    source = (f"generate_series(1, {int(n)}) AS g(n)" if ordered_by is None else
              f"(SELECT n, row_number() OVER (ORDER BY {ordered_by}) AS r "
              f"FROM generate_series(1, {int(n)}) AS s(n)) g ORDER BY r")
    query = (
        f"INSERT INTO {model._meta.db_table} ({', '.join(cols)}) "
        f"SELECT {', '.join(select)} FROM {source}"
    )
    with connection.cursor() as cur:
        cur.execute(query, params)


def uid(tag: str, kind: str) -> str:
    """SQL for a deterministic, random-looking UUID of row n (so rows of one load can be linked
    without a round trip): md5('<tag>:<kind>:' || n)::uuid."""
    return f"md5('{tag}:{kind}:' || n)::uuid"


@dataclass
class Tenant:
    id: str
    slug: str


def load_tenant(slug: str, target_prefix: str) -> Tenant:
    """One tenant allowed to call target_prefix (e.g. 'http://127.0.0.1:PORT/')."""
    from schedules.models import TargetPrefix
    from schedules.models import Tenant as TenantModel

    t = TenantModel.objects.create(slug=slug, name=slug)
    TargetPrefix.objects.create(tenant=t, prefix=target_prefix)
    return Tenant(str(t.id), slug)


def _next_version_id() -> int:
    return sql("SELECT coalesce(max(id), 0) + 1 FROM schedules_scheduleversion")[0][0]


@dataclass
class ScheduleSet:
    """Schedules n = 1..count of one load: ids are uid(tag, 's') of n, versions vbase + n."""

    tag: str
    tenant: Tenant
    count: int
    vbase: int

    def sid(self):
        return uid(self.tag, "s")

    def vid(self):
        return f"{self.vbase} + n"


def load_schedules(
    tag: str,
    tenant: Tenant,
    count: int,
    *,
    target_url: str,
    expression: str = "rate(1 minute)",
    next_run_at: str = "now() + interval '1 day'",
    anchor_at: str = "now()",
    enabled: bool = True,
) -> ScheduleSet:
    """`count` schedules at version 1 (schedule + version row, Schedule.current set) for one
    tenant. next_run_at and anchor_at are SQL expressions over n."""
    from django.db import transaction

    from schedules.models import Schedule, ScheduleVersion

    vbase = _next_version_id() - 1
    s = ScheduleSet(tag, tenant, count, vbase)
    # The FKs are deferred: schedule and version go in together. The version first, as the product
    # makes them: a schedule is counted in the forecast's summary when its row goes in pointing at
    # an existing version (dispatch.forecast_store).
    with transaction.atomic():
        insert_series(
            ScheduleVersion,
            count,
            exprs={"id": s.vid(), "schedule_id": s.sid(), "name": f"'{tag}-' || n"},
            values={
                "version": 1,
                "expression": expression,
                "time_zone": "UTC",
                "target_url": target_url,
                "payload": {"bench": tag},
                "created_by": "bench",
            },
        )
        insert_series(
            Schedule,
            count,
            exprs={
                "id": s.sid(),
                "tenant_id": f"'{tenant.id}'",
                "current_id": s.vid(),
                "next_run_at": next_run_at,
                "anchor_at": anchor_at,
                "shard": "mod(n, 4096)",
                "name": f"'{tag}-' || n",
            },
            values={"enabled": enabled, "status": "active", "version": 1},
        )
    sql(
        "SELECT setval(pg_get_serial_sequence('schedules_scheduleversion', 'id'), "
        "(SELECT max(id) FROM schedules_scheduleversion))"
    )
    return s


def fresh_idle_schedules(database: str, tag: str, count: int) -> ScheduleSet:
    """The bench database made again, with one tenant (allowed to call 127.0.0.1:9) and `count`
    schedules of it that fall due only in ten days: a bench then loads their runs as it needs."""
    setup_database(database)
    tenant = load_tenant(tag, "http://127.0.0.1:9/")
    return load_schedules(tag, tenant, count, target_url="http://127.0.0.1:9/run", next_run_at="now() + interval '10 days'")


def load_due_runs(s: ScheduleSet, count: int, at_sql: str, params=None) -> None:
    """For schedules 1..count of `s`: one occurrence at `at_sql` (an SQL timestamptz expression),
    its run (ready, next_eligible_at = the instant) and its run.created outbox event, as the
    scanner would have made them. Ids: uid(tag, 'o'|'r') of n."""
    from django.db import transaction

    from runs.models import Occurrence, OutboxEvent, Run
    from schedules.timeexpr import tzdata_version

    assert count <= s.count
    at = f"({at_sql})"
    with transaction.atomic():
        insert_series(
            Occurrence,
            count,
            exprs={
                "id": uid(s.tag, "o"),
                "schedule_id": s.sid(),
                "version_id": s.vid(),
                "scheduled_time": at,
                "local_wall_time": f"to_char({at} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS')",
                "local_time": f"to_char({at} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS') || '+00:00'",
            },
            values={"schedule_version": 1, "time_zone": "UTC", "tzdata_version": tzdata_version(), "kind": "scheduled"},
        )
        insert_series(
            Run,
            count,
            exprs={
                "id": uid(s.tag, "r"),
                "occurrence_id": uid(s.tag, "o"),
                "tenant_id": f"'{s.tenant.id}'",
                "schedule_id": s.sid(),
                "version_id": s.vid(),
                "scheduled_time": at,
                "next_eligible_at": at,
            },
            values={"schedule_version": 1, "kind": "scheduled", "state": "ready", "generation": 0, "max_attempts": 5},
        )
        insert_series(
            OutboxEvent,
            count,
            exprs={
                "event_id": "gen_random_uuid()",
                "tenant_id": f"'{s.tenant.id}'",
                "run_id": uid(s.tag, "r"),
                "kind": "'run.created'",
                "payload": (
                    f"jsonb_build_object('runId', {uid(s.tag, 'r')}::text, 'scheduleId', {s.sid()}::text, "
                    f"'scheduleVersion', 1, 'state', 'ready')"
                ),
            },
        )


# --------------------------------------------------------------------------------------------
# the local target


_RESPONSE = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{"ok":true}'


class _Answer200(asyncio.Protocol):
    """A minimal HTTP/1.1 keep-alive server: reads each request (headers + Content-Length body)
    and answers 200 at once. ~10x cheaper per request than aiohttp.web, so the target is never
    what limits a benchmark on a 2-core machine."""

    def __init__(self, counter, slot):
        self.counter, self.slot, self.buf = counter, slot, b""

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        buf = self.buf + data if self.buf else data
        answered = 0
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            head = buf[:end].lower()
            i = head.find(b"content-length:")
            length = 0
            if i >= 0:
                j = head.find(b"\r\n", i)
                length = int(head[i + 15 : j if j >= 0 else len(head)])
            if len(buf) < end + 4 + length:
                break
            buf = buf[end + 4 + length :]
            answered += 1
        self.buf = buf
        if answered:
            self.counter[self.slot] += answered
            self.transport.write(_RESPONSE * answered)


def _target_process(sock, counter, slot, kind, stop):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import uvloop  # noqa: F401  (not required; the stdlib loop is fine)
    except ImportError:
        pass

    async def main():
        loop = asyncio.get_running_loop()
        if kind == "raw":
            server = await loop.create_server(lambda: _Answer200(counter, slot), sock=sock, backlog=4096)
        else:
            from aiohttp import web

            async def ok(request):
                await request.read()
                counter[slot] += 1
                return web.Response(body=b'{"ok":true}', content_type="application/json")

            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", ok)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            server = web.SockSite(runner, sock)
            await server.start()
        while not stop.is_set():
            await asyncio.sleep(0.2)

    asyncio.run(main())


class Target:
    """`procs` processes answering 200 at once on one listening socket of 127.0.0.1 (the kernel
    spreads connections among them). `count()` is how many requests they have answered."""

    def __init__(self, procs: int = 1, kind: str = "raw"):
        ctx = multiprocessing.get_context("fork")
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4096)
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/run"
        self.prefix = f"http://127.0.0.1:{self.port}/"
        self.kind = kind
        self.counter = ctx.Array("q", procs, lock=False)
        self.stop_event = ctx.Event()
        self.procs = [
            ctx.Process(target=_target_process, args=(self.sock, self.counter, i, kind, self.stop_event), daemon=True)
            for i in range(procs)
        ]
        for p in self.procs:
            p.start()

    def count(self) -> int:
        return sum(self.counter)

    def cpu_seconds(self) -> float:
        return sum(proc_cpu(p.pid) or 0 for p in self.procs)

    def close(self):
        self.stop_event.set()
        for p in self.procs:
            p.join(3)
            if p.is_alive():
                p.terminate()
        self.sock.close()


# --------------------------------------------------------------------------------------------
# processes: CPU and peak RSS from /proc


def proc_cpu(pid) -> float | None:
    """utime + stime of one process, in seconds."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return (int(parts[11]) + int(parts[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


def proc_hwm_mb(pid) -> float | None:
    """Peak resident set size (VmHWM) of one process, in MiB."""
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    with open("/proc/stat") as f:
        vals = [int(x) for x in f.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    return sum(vals) - idle, sum(vals)


def backend_pids(application_name_like: str) -> list[int]:
    return [r[0] for r in sql("SELECT pid FROM pg_stat_activity WHERE application_name LIKE %s", [application_name_like])]


@dataclass
class CpuMeter:
    """CPU seconds spent by named groups of pids between start() and stop(), and by the whole
    machine (to show how much of the 2 cores others used meanwhile)."""

    groups: dict = field(default_factory=dict)
    start_cpu: dict = field(default_factory=dict)

    def start(self, groups: dict):
        self.groups = groups
        self.start_cpu = {name: {p: proc_cpu(p) or 0 for p in pids} for name, pids in groups.items()}
        self.m0 = machine_busy()
        self.t0 = time.monotonic()

    def stop(self) -> dict:
        out = {}
        for name, pids in self.groups.items():
            out[name] = sum((proc_cpu(p) or self.start_cpu[name][p]) - self.start_cpu[name][p] for p in pids)
        m1 = machine_busy()
        wall = time.monotonic() - self.t0
        out["_machine_busy_cores"] = (m1[0] - self.m0[0]) / max(1, m1[1] - self.m0[1]) * (os.cpu_count() or 1)
        out["_wall"] = wall
        return out


def cpu_line(c: dict) -> str:
    wall = c.get("_wall") or 1
    parts = [f"{k} {v:.1f}s ({v / wall:.2f} cores)" for k, v in c.items() if not k.startswith("_")]
    return f"CPU over {wall:.1f}s: " + ", ".join(parts) + f"; whole machine busy {c['_machine_busy_cores']:.2f} of {os.cpu_count()} cores"


# --------------------------------------------------------------------------------------------
# the project's commands as subprocesses


@dataclass
class WorkerConfig:
    workers: int
    concurrency: int
    batch: int

    @classmethod
    def parse(cls, text: str) -> "WorkerConfig":
        w, c, b = (int(x) for x in text.lower().split("x"))
        return cls(w, c, b)

    def __str__(self):
        return f"{self.workers} worker process(es) x concurrency {self.concurrency}, claim batch {self.batch}"

    @property
    def key(self):
        return f"{self.workers}x{self.concurrency}x{self.batch}"


class Procs:
    """Subprocesses of `manage.py <command>` against the bench database."""

    def __init__(self, dbname: str, env_extra: dict | None = None):
        self.env = bench_env(dbname, **(env_extra or {}))
        self.procs: list[subprocess.Popen] = []
        self.hwm: dict[int, float] = {}

    def start(self, *args, name: str) -> subprocess.Popen:
        log = open(BENCH / "out" / f"{name}.log", "w") if (BENCH / "out").is_dir() else subprocess.DEVNULL
        p = subprocess.Popen([str(PYTHON), str(CODE / "manage.py"), *args], cwd=CODE, env=self.env,
                             stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def start_workers(self, cfg: WorkerConfig, tag: str = "w") -> list[subprocess.Popen]:
        return [
            self.start("work", "--concurrency", str(cfg.concurrency), "--batch", str(cfg.batch),
                       "--worker-id", f"bench-{tag}{i}", name=f"work-{tag}{i}")
            for i in range(cfg.workers)
        ]

    def wait_connected(self, application_name: str, count: int, timeout: float = 60) -> list[int]:
        """Wait until `count` sessions named application_name are open (the commands are up)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            pids = backend_pids(application_name)
            if len(pids) >= count:
                return pids
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args} exited with {p.returncode} (see bench/out/ logs if present)")
            time.sleep(0.1)
        raise RuntimeError(f"only {len(backend_pids(application_name))} of {count} {application_name} sessions after {timeout}s")

    def sample_hwm(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                v = proc_hwm_mb(p.pid)
                if v is not None:
                    self.hwm[p.pid] = max(v, self.hwm.get(p.pid, 0))

    def stop(self, timeout: float = 30) -> None:
        self.sample_hwm()
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        end = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []


def wait_until(pred, *, timeout: float, every: float = 0.25, on_tick=None) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if on_tick:
            on_tick()
        if pred():
            return True
        time.sleep(every)
    return False


def wait_drained(procs: "Procs", *, timeout: float, stall: float = 30.0, where: str = "TRUE", params=()) -> bool:
    """Wait until no run matching `where` is ready or leased. Gives up after `timeout`, or when
    nothing has finished for `stall` seconds (then prints the tail of the worker logs: a broken
    worker should fail the benchmark loudly, not sit out the timeout)."""
    end = time.monotonic() + timeout
    last, last_change = None, time.monotonic()
    while time.monotonic() < end:
        procs.sample_hwm()
        # Counted over the partial queue indexes (one per state), so the poll costs what is still
        # open, not the whole table: a full count every quarter second took ~10% of the machine
        # in a 50,000-run burst, CPU the workers then did not have.
        open_ = sql(
            f"SELECT (SELECT count(*) FROM runs_run WHERE state = 'ready' AND ({where})) "
            f"+ (SELECT count(*) FROM runs_run WHERE state = 'leased' AND ({where}))", list(params) * 2)[0][0]
        if open_ == 0:
            return True
        if open_ != last:
            last, last_change = open_, time.monotonic()
        elif time.monotonic() - last_change > stall:
            print(f"    no progress for {stall:.0f}s ({open_} still open); worker log tails:", flush=True)
            for log in sorted((BENCH / "out").glob("work-*.log"))[-4:]:
                print("      --- " + log.name + "\n" + "".join(open(log).readlines()[-8:]), flush=True)
            return False
        time.sleep(0.25)
    return False


def run_outcome(instant_sql_param, where: str = "TRUE", params=()) -> dict:
    """Figures of runs selected by `where`, relative to the instant (a timestamptz parameter):
    how many in each state, time until all started / all succeeded, lag percentiles."""
    row = sql(
        f"""
        SELECT count(*),
               count(*) FILTER (WHERE state = 'succeeded'),
               count(*) FILTER (WHERE generation > 1),
               extract(epoch FROM max(first_started_at) - %s),
               extract(epoch FROM max(finished_at) - %s),
               extract(epoch FROM min(first_started_at) - %s),
               percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM first_started_at - scheduled_time)),
               extract(epoch FROM max(first_started_at - scheduled_time))
        FROM runs_run WHERE {where}
        """,
        [instant_sql_param, instant_sql_param, instant_sql_param, *params],
    )[0]
    return {
        "runs": row[0], "succeeded": row[1], "retried": row[2],
        "all_started": float(row[3]) if row[3] is not None else None,
        "all_succeeded": float(row[4]) if row[4] is not None else None,
        "first_started": float(row[5]) if row[5] is not None else None,
        "lag_p50": row[6][0] if row[6] else None, "lag_p99": row[6][1] if row[6] else None,
        "lag_max": float(row[7]) if row[7] is not None else None,
    }


def ensure_out_dir() -> Path:
    out = BENCH / "out"
    out.mkdir(exist_ok=True)
    return out


# --------------------------------------------------------------------------------------------
# the bulk loader: ten million schedules


def _bulk_tables_ddl(tables: tuple) -> tuple[list, list, list]:
    """What load_schedules_bulk drops and makes again on `tables`: (foreign keys on or into them,
    their primary/unique constraints, their other indexes), each as (table, name, definition).
    Only top-level constraints: a partitioned table's own foreign key brings its partitions'."""
    oids = "(" + ", ".join(f"'{t}'::regclass" for t in tables) + ")"
    cons = sql(
        f"SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid), contype FROM pg_constraint "
        f"WHERE conparentid = 0 AND contype IN ('f', 'p', 'u') "
        f"AND (conrelid IN {oids} OR (contype = 'f' AND confrelid IN {oids})) ORDER BY contype, conname")
    fks = [(t, n, d) for t, n, d, k in cons if k == "f"]
    keys = [(t, n, d) for t, n, d, k in cons if k in ("p", "u")]
    idx = sql(
        f"SELECT i.indrelid::regclass::text, c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i "
        f"JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid IN {oids} "
        f"AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid AND k.contype IN ('p', 'u')) "
        f"ORDER BY c.relname")
    return fks, keys, idx


def load_schedules_bulk(
    tag: str,
    tenant: Tenant,
    count: int,
    *,
    target_url: str,
    first: int = 1,
    owner_ids: list | None = None,
    rate_hours: int = 10,
    chunk: int = 1_000_000,
    log=print,
) -> dict:
    """Schedules n = first .. first + count - 1 of `tag` (ids uid(tag, 's') of n, version rows
    at version 1, Schedule.current set), as fast as PostgreSQL can write them: the two tables'
    indexes, keys and foreign keys (also those pointing into them) are dropped, the rows written
    by INSERT ... SELECT FROM generate_series in chunks of `chunk` (one statement and transaction
    each), then the keys and indexes are built (maintenance_work_mem raised for the session) and
    every foreign key added and validated again. Call it on a bench database nothing else uses.

    The rows are what `create_schedule` makes for `rate(<rate_hours> hours)` created at
    `anchor_at` = created_at, spread over the last `rate_hours` (one schedule a second of it in
    turn): next_run_at is anchor_at + rate_hours, within the next `rate_hours`, so the fleet
    comes due at count / rate_hours runs an hour. With `owner_ids`, schedule n belongs to
    owner_ids[n mod len]. Version ids are vbase + n. Returns timings (seconds) per phase and the
    version base."""
    from django.db import connection

    from schedules.models import Schedule, ScheduleVersion

    t_all = time.perf_counter()
    vbase = _next_version_id() - first
    period = rate_hours * 3600
    sql("SET maintenance_work_mem = '1GB'", fetch=False)
    sql("SET synchronous_commit = off", fetch=False)  # a bench database; each chunk commits
    tables = (Schedule._meta.db_table, ScheduleVersion._meta.db_table)
    fks, keys, idx = _bulk_tables_ddl(tables)
    t = time.perf_counter()
    for table, name, _ in fks + keys:
        sql(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"', fetch=False)
    for _, name, _ in idx:
        sql(f'DROP INDEX "{name}"', fetch=False)
    timings = {"drop": time.perf_counter() - t}
    owners = None
    if owner_ids:
        owners = "'{" + ",".join(str(o) for o in owner_ids) + "}'::uuid[]"
    # k is the schedule's number; every expression is over k (n counts within the chunk).
    with connection.cursor() as cur:
        cur.execute("SELECT date_trunc('second', statement_timestamp())")
        now = cur.fetchone()[0]
    anchor = f"'{now.isoformat()}'::timestamptz - make_interval(secs => mod({{k}}, {period}))"
    t_ins = {"schedules": 0.0, "versions": 0.0}
    done = 0
    while done < count:
        size = min(chunk, count - done)
        off = first - 1 + done
        k = f"(n + {off})"

        def over_k(expr: str) -> str:
            return expr.replace("{k}", k)

        t = time.perf_counter()
        insert_series(
            Schedule, size,
            exprs={
                "id": over_k(f"md5('{tag}:s:' || {{k}})::uuid"),
                "tenant_id": f"'{tenant.id}'",
                "current_id": over_k(f"{vbase} + {{k}}"),
                "owner_id": over_k(f"({owners})[1 + mod({{k}}, {len(owner_ids)})]") if owners else "NULL",
                "anchor_at": over_k(anchor),
                "created_at": over_k(anchor),
                "updated_at": over_k(anchor),
                "next_run_at": over_k(anchor) + f" + interval '{rate_hours} hours'",
                "shard": over_k("mod({k}, 4096)"),
                "name": over_k(f"'{tag}-' || {{k}}"),
            },
            values={"enabled": True, "status": "active", "version": 1},
        )
        t_ins["schedules"] += time.perf_counter() - t
        t = time.perf_counter()
        insert_series(
            ScheduleVersion, size,
            exprs={
                "id": over_k(f"{vbase} + {{k}}"),
                "schedule_id": over_k(f"md5('{tag}:s:' || {{k}})::uuid"),
                "name": over_k(f"'{tag}-' || {{k}}"),
                "created_at": over_k(anchor),
            },
            values={
                "version": 1, "expression": f"rate({rate_hours} hours)", "time_zone": "UTC",
                "target_url": target_url, "payload": {"bench": tag}, "created_by": "bench",
            },
        )
        t_ins["versions"] += time.perf_counter() - t
        done += size
        log(f"    bulk: {first - 1 + done:,} schedules written ({time.perf_counter() - t_all:.0f}s)")
    timings.update({f"insert {k}": v for k, v in t_ins.items()})
    t = time.perf_counter()
    for table, name, definition in keys:
        sql(f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}', fetch=False)
    for _, _, definition in idx:
        sql(definition, fetch=False)
    timings["keys and indexes"] = time.perf_counter() - t
    t = time.perf_counter()
    for table, name, definition in fks:
        sql(f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}', fetch=False)
    timings["foreign keys (validated)"] = time.perf_counter() - t
    sql("SELECT setval(pg_get_serial_sequence('schedules_scheduleversion', 'id'), "
        "(SELECT max(id) FROM schedules_scheduleversion))")
    t = time.perf_counter()
    vacuum_analyze(*tables)
    timings["vacuum analyze"] = time.perf_counter() - t
    sql("RESET maintenance_work_mem", fetch=False)
    sql("RESET synchronous_commit", fetch=False)
    timings["total"] = time.perf_counter() - t_all
    return {"vbase": vbase, "timings": timings}


# the fast loader (ten million schedules)


def load_schedules_fast(parts: list[dict]) -> list[ScheduleSet]:
    """Like load_schedules, for many schedules at once: each part is load_schedules' keyword
    arguments (tag, tenant, count, target_url, expression, next_run_at, anchor_at) plus
    `time_zone` (default UTC) and `spread` (an SQL condition over n: those schedules get a 600 s
    spread window, their offset spread over it).

    Each part is one INSERT ... SELECT FROM generate_series per table, in one transaction, inside
    schedule_tables_bulk (triggers off, indexes built afterwards). The forecast's summary is left
    for the caller to rebuild (bench/forecast_cost.py times it). Only for a bench database."""
    sets = []
    with schedule_tables_bulk(rebuild_forecast=False):
        for p in parts:
            p = dict(p)
            zone = p.pop("time_zone", "UTC")
            spread_when = p.pop("spread", None)
            t0 = time.perf_counter()
            s = _load_ordered(**p)
            # The versions that differ from load_schedules' are rewritten in place: the zone for the
            # whole part, the spread for the rows `spread` selects (only those rows are rewritten).
            part = f"id > {s.vbase} AND id <= {s.vbase + s.count}"
            if zone != "UTC":
                sql(f"UPDATE schedules_scheduleversion SET time_zone = %s WHERE {part}", [zone], fetch=False)
            if spread_when:
                # (n here is the row's rank in the load order: as random as the ids)
                sql(f"UPDATE schedules_scheduleversion SET spread_seconds = 600, "
                    f"spread_offset_seconds = mod(g.n * 7919, 600) FROM (SELECT id AS vid, id - {s.vbase} AS n "
                    f"FROM schedules_scheduleversion WHERE {part}) g WHERE id = g.vid AND {spread_when}",
                    fetch=False)
            print(f"  loaded {s.count:,} ({p['tag']}) in {time.perf_counter() - t0:.1f} s", flush=True)
            sets.append(s)
    return sets


@contextlib.contextmanager
def schedule_tables_bulk(*, rebuild_forecast: bool = True, log=print):
    """Around a bulk load of schedules and versions: the two tables' triggers (the deferred
    foreign-key checks, which queue one event per row, the tenants' counts and the forecast's
    deltas) are switched off and their indexes other than the keys dropped; afterwards the indexes
    are built again (one sort each instead of one random insert per row), the triggers switched
    on, the tenants' counts recounted as the migration counts them, the forecast's summary rebuilt
    from the schedules (unless the caller times that itself), and the tables analysed. The caller
    makes its rows complete by construction (every schedule's version exists), so nothing is left
    unchecked that the triggers would have caught. Only for a bench database nothing else writes
    meanwhile."""
    from django.db import connection, transaction

    from dispatch import forecast_store

    tables = ("schedules_schedule", "schedules_scheduleversion")
    indexes = sql(
        "SELECT i.indexname, i.indexdef FROM pg_indexes i WHERE i.tablename = ANY(%s) AND NOT EXISTS ("
        "SELECT 1 FROM pg_constraint c WHERE c.conindid = (quote_ident(i.indexname))::regclass)",
        [list(tables)],
    )
    for t in tables:
        sql(f"ALTER TABLE {t} DISABLE TRIGGER ALL", fetch=False)
    for name, _ in indexes:
        sql(f'DROP INDEX "{name}"', fetch=False)
    try:
        yield
    finally:
        t0 = time.perf_counter()
        with connection.cursor() as cur:
            cur.execute("SET maintenance_work_mem = '1GB'")
            for _, definition in indexes:
                cur.execute(definition)
            cur.execute("RESET maintenance_work_mem")
        for t in tables:
            sql(f"ALTER TABLE {t} ENABLE TRIGGER ALL", fetch=False)
        with transaction.atomic():
            sql("DELETE FROM schedules_tenantschedulecount", fetch=False)
            sql("INSERT INTO schedules_tenantschedulecount (tenant_id, slot, live, sub_minute) "
                "SELECT s.tenant_id, 0, count(*), count(*) FILTER (WHERE v.sub_minute) "
                "FROM schedules_schedule s LEFT JOIN schedules_scheduleversion v ON v.id = s.current_id "
                "WHERE s.status <> 'archived' GROUP BY s.tenant_id", fetch=False)
        if rebuild_forecast:
            forecast_store.rebuild()
        rebuilt = " and the forecast rebuilt" if rebuild_forecast else ""
        log(f"  indexes built, counts recounted{rebuilt} in {time.perf_counter() - t0:.1f} s")
        vacuum_analyze(*tables)


def _load_ordered(tag: str, tenant: Tenant, count: int, *, target_url: str, expression: str,
                  next_run_at: str, anchor_at: str = "now()", enabled: bool = True) -> ScheduleSet:
    """load_schedules' rows, inserted in the order of the schedules' ids, with version ids in the
    same order (version vbase + r for the schedule of rank r): every key and unique index then
    grows at its end instead of taking each row at a random page (which, past shared_buffers,
    costs a page write and a full-page image in the WAL per row). The set's vid() is vbase + n
    for load_schedules; here it is vbase + r, so only the fast loader's callers use these sets."""
    from django.db import transaction

    from schedules.models import Schedule, ScheduleVersion

    vbase = _next_version_id() - 1
    s = ScheduleSet(tag, tenant, count, vbase)
    order = s.sid()
    with transaction.atomic():
        insert_series(
            ScheduleVersion, count,
            exprs={"id": f"{vbase} + r", "schedule_id": s.sid(), "name": f"'{tag}-' || n"},
            values={"version": 1, "expression": expression, "time_zone": "UTC", "target_url": target_url,
                    "payload": {"bench": tag}, "created_by": "bench"},
            ordered_by=order,
        )
        insert_series(
            Schedule, count,
            exprs={"id": s.sid(), "tenant_id": f"'{tenant.id}'", "current_id": f"{vbase} + r",
                   "next_run_at": next_run_at, "anchor_at": anchor_at, "shard": "mod(n, 4096)",
                   "name": f"'{tag}-' || n"},
            values={"enabled": enabled, "status": "active", "version": 1},
            ordered_by=order,
        )
    sql("SELECT setval(pg_get_serial_sequence('schedules_scheduleversion', 'id'), "
        "(SELECT max(id) FROM schedules_scheduleversion))")
    return s
