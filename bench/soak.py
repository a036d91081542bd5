"""Soak: the design load all at once, with faults in the middle, and one SLO table at the end.

    .venv/bin/python bench/soak.py --minutes 60                  # the record (long form)
    .venv/bin/python bench/soak.py --minutes 5                   # the short form (fewer schedules; exits 1 on a loss)
    .venv/bin/python bench/soak.py --ci                          # what CI runs: the short form at a quarter of its load
    .venv/bin/python bench/soak.py --minutes 60 --schedules 1000000   # fewer schedules loaded

What runs (real processes, every one on its own log under bench/out/soak/):
- a pg_auto_failover formation (tests/faults/pgcluster.py: a monitor, a primary and a synchronous
  standby on free ports under a temporary folder; the machine's PostgreSQL is not used);
- `scan`, `work` twice (the second on a "host" of its own, a network namespace: tests/faults/netns.py),
  `reconcile`, `relay`, `maintain` (partitions of --partition-seconds, finished runs kept
  --keep-partitions of them, so partitions are made and dropped all along), gunicorn;
- a local target (three ports on one address of this machine) that answers 200 at once, 500 for the
  "fail" schedules, 500 half the time for the "flaky" ones and after --slow seconds for the noisy
  tenant's.

The load, loaded by SQL (bench/common.py's insert_series) before the start:
- --schedules schedules in all. Of them --rate x 60 fire every minute, their instants spread over the
  seconds of the minute so that --rate runs fall due every second: `rate(1 minute)`,
  `RRULE:FREQ=MINUTELY;BYSECOND=s` and, for those due at second 0, `* * * * *`; spread over eight
  quiet tenants and three target ports; 4 % "flaky" (retried up to 6 attempts), 1 % "fail"
  (dead after 2 attempts). The rest fire once a day, a month from now (the scanner's idle cost).
- a noisy tenant firing max(30, rate/7) runs a second at a slow target with max_in_flight 2: far over
  its budget all along (its unclaimed runs are skipped after their 60 s misfire grace, by design).
- the "midnight": --spike schedules (the seven quiet tenants other than the first) due at one
  instant T in the middle of the run, placed just after a partition boundary, when `maintain` drops
  the partition that has aged out. In the long form the same spike is first run on the quiet
  system (before the steady load starts): the baseline its time is compared with.
- while it runs, bounded loops against gunicorn on 127.0.0.1: the API (creates every-minute
  schedules, edits them, reads them and the runs) and portal readers (dashboard, runs, schedules,
  DLQ, workers, audit, tenants, forecast, incidents, /metrics), each bounded in count and in time.

The faults, at fixed fractions of the run (the table gives each one's time): kill -9 of the
scanner (restarted, as a supervisor would), a pg_auto_failover switchover, the namespaced worker
cut off from the database and the target for twice its lease, the spike, kill -9 of a worker
(restarted), and a SIGKILL of the primary's whole node (restarted: it rejoins as standby). Each
fault waits for synchronous replication first (the failover promise's precondition).

Counted (docs/failure-model.md defines them; tests/faults/harness.py counts the same way):
- reconciliation, window by window while the run goes on (before retention drops the partitions;
  `maintain` is stopped with the steady load, so the drain's last windows stay until they are read):
  every instant each firing schedule's rule was due (the rule engine, schedules.services.rule_for)
  against the runs made: lost = an instant with no run, or a run not terminal once all is quiet;
  duplicate runs = two runs for one (schedule, instant), leaving out a run an edit canceled before
  it started (superseded: the new version makes that instant again, one delivery in all);
- stale results applied (a result event whose generation is not the run's current lease, from the
  outbox), audit violations (dispatch.invariants, as `manage.py audit`);
- start lag (first_started_at - scheduled_time) of the quiet tenants' every-minute runs, per minute
  and whole, outside the spike; the spike's all-started time, made_after_T (runs the scanner made
  after T; must be 0), the first quiet tenant's p99 during the spike;
- the dispatch gap after each fault (the longest time with no attempt started, fault to +60 s);
- disk (database, the runs tables, the outbox, WAL) and the RSS of every process over time;
- every web answer: 5xx only as 503 during a fault, and the portal's page times.

Exit status 1 if a zero figure is not zero (lost, duplicate runs, stale results, audit violations,
made_after_T, 5xx other than 503 during a fault); the lag and time figures are printed, not asserted.
Needs root (network namespaces, pg_autoctl as the postgres user) and pg-auto-failover-cli,
postgresql-15-auto-failover, iptables, iproute2.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import json
import multiprocessing
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

QUIET_TENANTS = 8
TARGET_PORTS = 3
FLAKY_500_RATE = 0.5
OBSERVE_SECONDS = 60.0  # the dispatch gap is looked for from a fault to this long after it
# The steady window whose statements and CPU are printed: from this long after the steady load
# begins (the first minute's instants are all armed by then) to the switchover.
STATEMENTS_FROM = 30.0
# The spike's window of CPU starts this long before its instant: the scanner's look-ahead
# (SCHEDULER_LOOKAHEAD_SECONDS, 120 s by default) starts making it about then.
SPIKE_LEAD = 130.0
STATEMENTS_RESET_SQL = "SELECT pg_stat_statements_reset()"
# Planning counted too: a statement over partitioned tables is planned at each call.
STATEMENTS_PLANNING_SQL = ("ALTER SYSTEM SET pg_stat_statements.track_planning = on", "SELECT pg_reload_conf()")
# Statements of this database by the name on their first line (`-- name: X`), else their text.
STATEMENTS_SQL = r"""
SELECT coalesce(substring(query from '-- name: (\w+)'), left(regexp_replace(query, '\s+', ' ', 'g'), 56)),
       sum(calls)::bigint, sum(total_exec_time), sum(rows)::bigint, sum(wal_bytes)::bigint, sum(total_plan_time)
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
GROUP BY 1 ORDER BY sum(total_exec_time) + sum(total_plan_time) DESC LIMIT 20
"""
WEB_GRACE_SECONDS = 5.0  # after a fault ends, answers must be good again this soon


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


# --------------------------------------------------------------------------------------------
# the target: three ports, answers by path


class _Answer(asyncio.Protocol):
    """HTTP/1.1 keep-alive: reads each request and answers by the first path segment: `fail` 500,
    `flaky` 500 half the time, `slow` 200 after a pause, anything else 200 at once."""

    def __init__(self, counter, rng, slow):
        self.counter, self.rng, self.slow, self.buf = counter, rng, slow, b""

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        buf = self.buf + data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            head = buf[:end]
            low = head.lower()
            i = low.find(b"content-length:")
            length = 0
            if i >= 0:
                j = low.find(b"\r\n", i)
                length = int(low[i + 15: j if j >= 0 else len(low)])
            if len(buf) < end + 4 + length:
                break
            buf = buf[end + 4 + length:]
            path = head.split(b" ", 2)[1] if head.count(b" ") >= 2 else b"/"
            kind = path.split(b"/")[1] if path.count(b"/") >= 1 else b""
            if kind == b"fail" or (kind == b"flaky" and self.rng.random() < FLAKY_500_RATE):
                self.counter[1] += 1
                self.transport.write(_response(500))
            elif kind == b"slow":
                self.counter[2] += 1
                asyncio.get_running_loop().call_later(self.slow, self._late)
            else:
                self.counter[0] += 1
                self.transport.write(_response(200))
        self.buf = buf

    def _late(self):
        if not self.transport.is_closing():
            self.transport.write(_response(200))


def _response(status: int) -> bytes:
    body = b'{"ok":true}' if status == 200 else b'{"ok":false}'
    reason = b"OK" if status == 200 else b"Internal Server Error"
    return b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        status, reason, len(body), body)


def _target_main(socks, counter, slow, stop, seed):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    rng = random.Random(seed)

    async def main():
        loop = asyncio.get_running_loop()
        for s in socks:
            await loop.create_server(lambda: _Answer(counter, rng, slow), sock=s, backlog=4096)
        while not stop.is_set():
            await asyncio.sleep(0.2)

    asyncio.run(main())


class SoakTarget:
    def __init__(self, host: str, slow: float, seed: int):
        ctx = multiprocessing.get_context("fork")
        self.socks = []
        for _ in range(TARGET_PORTS):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, 0))
            s.listen(4096)
            s.setblocking(False)
            self.socks.append(s)
        self.prefixes = [f"http://{host}:{s.getsockname()[1]}/" for s in self.socks]
        self.counter = ctx.Array("q", 3, lock=False)  # 200 at once, 500, slow 200
        self.stop = ctx.Event()
        self.proc = ctx.Process(target=_target_main, args=(self.socks, self.counter, slow, self.stop, seed), daemon=True)
        self.proc.start()

    def counts(self) -> dict:
        return {"200": self.counter[0], "500": self.counter[1], "slow": self.counter[2]}

    def close(self):
        self.stop.set()
        self.proc.join(3)
        if self.proc.is_alive():
            self.proc.kill()
        for s in self.socks:
            s.close()


# --------------------------------------------------------------------------------------------
# loading


@dataclass
class Plan:
    minutes: float
    schedules: int
    rate: int
    spike: int
    quiet_spike: bool
    partition_seconds: int
    keep_partitions: int
    lease: int
    sweep_every: float
    sweep_margin: float
    noisy_rate: int = 0
    slow: float = 0.25
    strict_spike: bool = True

    @property
    def firing(self) -> int:
        return self.rate * 60

    @property
    def seconds(self) -> float:
        return self.minutes * 60


def tenant_array(ids: list[str]) -> str:
    return "(ARRAY[" + ", ".join(f"'{i}'" for i in ids) + "]::uuid[])"


def load_set(C, tag: str, count: int, *, tenant_sql: str, expression_sql: str, target_sql: str, next_run_sql: str,
             anchor_sql: str, version: dict | None = None):
    """`count` schedules at version 1, like bench/common.load_schedules, with the tenant, rule,
    target and retry policy given per row (SQL over n)."""
    from django.db import transaction

    from schedules.models import Schedule, ScheduleVersion

    vbase = C._next_version_id() - 1
    # In the order of the schedules' ids, version ids in the same order (vbase + the row's rank r):
    # every key then grows at its end instead of taking each row at a random page.
    sid, vid = C.uid(tag, "s"), f"{vbase} + r"
    v = {"version": 1, "time_zone": "UTC", "payload": {"soak": tag}, "created_by": "soak",
         "misfire_policy": "catch_up", "catchup_limit": 10_000, "misfire_grace_seconds": 86_400,
         "target_timeout_seconds": 5, **(version or {})}
    with transaction.atomic():
        C.insert_series(Schedule, count, exprs={
            "id": sid, "tenant_id": tenant_sql, "current_id": vid, "next_run_at": next_run_sql,
            "anchor_at": anchor_sql, "shard": "mod(n, 4096)", "name": f"'{tag}-' || n",
        }, values={"enabled": True, "status": "active", "version": 1}, ordered_by=sid)
        C.insert_series(ScheduleVersion, count, exprs={
            "id": vid, "schedule_id": sid, "name": f"'{tag}-' || n", "expression": expression_sql,
            "target_url": target_sql, "max_attempts": "CASE WHEN " + _kind_case("fail") + " THEN 2 WHEN "
            + _kind_case("flaky") + " THEN 6 ELSE 5 END" if tag.startswith("f") else "5",
            "backoff_base_seconds": "CASE WHEN " + _kind_case("fail") + " THEN 0.5 ELSE 1.0 END"
            if tag.startswith("f") else "1.0",
            "backoff_max_seconds": "4.0",
        }, values=v, ordered_by=sid)
    C.sql("SELECT setval(pg_get_serial_sequence('schedules_scheduleversion', 'id'), "
          "(SELECT max(id) FROM schedules_scheduleversion))")
    return vbase


def _kind_case(kind: str) -> str:
    # Per hundred firing schedules: 4 flaky (n mod 100 in 90..93), 1 fail (94).
    return {"flaky": "mod(n, 100) BETWEEN 90 AND 93", "fail": "mod(n, 100) = 94"}[kind]


def load(C, plan: Plan, target: SoakTarget, log) -> dict:
    """Tenants, the firing set (parked a month ahead until armed), the noisy tenant's set, the
    spike sets (parked) and the rest, all by SQL. Returns what the run needs to know."""
    from schedules.models import TargetPrefix, Tenant

    def tenant(slug, **kw):
        t = Tenant.objects.create(slug=slug, name=slug, **kw)
        for p in target.prefixes:
            TargetPrefix.objects.create(tenant=t, prefix=p)
        return str(t.id)

    quiet = [tenant(f"quiet-{i}") for i in range(QUIET_TENANTS)]
    noisy = tenant("noisy", max_in_flight=2)
    api = tenant("api")
    ports = "(ARRAY[" + ", ".join(f"'{p}'" for p in target.prefixes) + "])"
    port = f"{ports}[mod(n, {TARGET_PORTS}) + 1]"
    parked = "now() + interval '30 days'"
    t0 = time.monotonic()

    # The firing set: second of the minute s = n mod 60; kind by n mod 100.
    expression = ("CASE WHEN mod(n, 60) = 0 THEN '* * * * *' WHEN mod(n, 100) < 55 THEN 'rate(1 minute)' "
                  "ELSE 'RRULE:FREQ=MINUTELY;BYSECOND=' || mod(n, 60) END")
    url = (f"{port} || CASE WHEN {_kind_case('fail')} THEN 'fail/' WHEN {_kind_case('flaky')} THEN 'flaky/' "
           f"ELSE 'ok/' END || n")
    load_set(C, "f", plan.firing, tenant_sql=f"{tenant_array(quiet)}[mod(n, {QUIET_TENANTS}) + 1]",
             expression_sql=expression, target_sql=url, next_run_sql=parked, anchor_sql=parked)
    noisy_n = plan.noisy_rate * 60
    load_set(C, "n", noisy_n, tenant_sql=f"'{noisy}'::uuid", expression_sql="'rate(1 minute)'",
             target_sql=f"{port} || 'slow/' || n", next_run_sql=parked, anchor_sql=parked,
             version={"misfire_policy": "run_once", "misfire_grace_seconds": 60, "catchup_limit": 10})
    spike_tenants = tenant_array(quiet[1:])
    spikes = {}
    for tag in (["sq"] if plan.quiet_spike else []) + ["sm"]:
        vbase = load_set(C, tag, plan.spike, tenant_sql=f"{spike_tenants}[mod(n, {QUIET_TENANTS - 1}) + 1]",
                         expression_sql="'rate(1 day)'", target_sql=f"{port} || 'ok/spike/' || n",
                         next_run_sql=parked, anchor_sql=parked)
        spikes[tag] = (vbase + 1, vbase + plan.spike)
    rest = max(0, plan.schedules - plan.firing - noisy_n - plan.spike * len(spikes))
    chunk, done = 1_000_000, 0
    # The idle bulk with the tables' triggers off and their indexes built afterwards (the forecast
    # and the tenants' counts recomputed from the rows): at ten million, row by row would take the
    # better part of an hour through synchronous replication.
    with C.schedule_tables_bulk(log=log):
        while done < rest:
            k = min(chunk, rest - done)
            load_set(C, f"b{done // chunk}", k,
                     tenant_sql=f"{tenant_array(quiet + [noisy])}[mod(n, {QUIET_TENANTS + 1}) + 1]",
                     expression_sql="'rate(1 day)'", target_sql=f"{port} || 'ok/b/' || n",
                     next_run_sql="now() + interval '30 days' + make_interval(secs => mod(n, 86400))",
                     anchor_sql="now()")
            done += k
            log(f"  loaded {done:,} of {rest:,} idle schedules ({time.monotonic() - t0:.0f}s)")
    if not rest:
        C.vacuum_analyze("schedules_schedule", "schedules_scheduleversion")
    total = plan.firing + noisy_n + plan.spike * len(spikes) + rest
    log(f"loaded {total:,} schedules in {time.monotonic() - t0:.0f}s: {plan.firing:,} firing every minute "
        f"({plan.rate}/s), {noisy_n:,} of the noisy tenant ({plan.noisy_rate}/s, max_in_flight 2, "
        f"answers after {plan.slow}s), {len(spikes)} spike set(s) of {plan.spike:,}, {rest:,} idle")
    return {"quiet": quiet, "noisy": noisy, "api": api, "spikes": spikes, "total": total}


def arm_spike(C, tag: str, at: datetime) -> None:
    C.sql(f"UPDATE schedules_schedule SET next_run_at = %s, anchor_at = %s WHERE name LIKE '{tag}-%%'",
          [at, at], fetch=False)


def arm_steady(C, t0: datetime) -> None:
    """The firing sets start at t0: schedule n at the first instant from t0 on whose second of the
    minute is n mod 60 (the cron ones, n mod 60 = 0, at a whole minute), its anchor one period
    earlier (rate() counts from it; an RRULE takes its time of day from it)."""
    first = ("date_trunc('minute', %(t0)s::timestamptz) + make_interval(secs => mod(split_part(name, '-', 2)::int, 60)) "
             "+ CASE WHEN date_trunc('minute', %(t0)s::timestamptz) + make_interval(secs => mod(split_part(name, '-', 2)::int, 60)) "
             "< %(t0)s::timestamptz THEN interval '1 minute' ELSE interval '0' END")
    for tag in ("f", "n"):
        C.sql(f"UPDATE schedules_schedule SET next_run_at = {first}, anchor_at = {first} - interval '1 minute' "
              f"WHERE name LIKE '{tag}-%%'", {"t0": t0}, fetch=False)


# --------------------------------------------------------------------------------------------
# reconciliation: due against made, window by window


def superseded(state: str, reason: str, first_started) -> bool:
    """A run an edit canceled before it started (its instant passes to the new version)."""
    return state == "canceled" and reason == "superseded" and first_started is None


class Ledger:
    """Every instant each firing schedule was due, from its rule, against the runs made; checked
    window by window while the run goes on, before retention drops the partitions."""

    def __init__(self, start: datetime, noisy: str, first_quiet: str):
        self.a = start
        self.noisy, self.first_quiet = noisy, first_quiet
        self.rules: dict = {}  # schedule id -> (rule, first instant, tenant id, steady)
        self.lost = self.duplicates = self.expected = self.runs = self.superseded = 0
        self.unstarted: list = []  # (schedule, instant) not started when their window was checked
        self.when = array.array("d")  # scheduled time (epoch) of each quiet steady run
        self.lag = array.array("d")  # its start lag
        self.first = array.array("b")  # 1 if of the first quiet tenant
        self.not_started = Counter()  # terminal without a start (canceled, skipped, ...) by state
        self.examples: list = []
        self.lock = threading.Lock()
        # Finished runs of a window whose check is held back (an instant in it not made yet), read
        # ahead by peek(): retention may remove them before the window is checked.
        self.seen: dict = {}  # run id -> its row as check() reads it
        self.removed_before_check = 0  # runs peeked, then gone when their window was checked
        self.skip_versions: list = []  # (lo, hi) version ids of sets not peeked (the spikes: spike_figures)

    def add(self, schedules, *, steady: bool, starts: dict | None = None):
        from schedules.services import rule_for

        for s in schedules:
            start = (starts or {}).get(s.id) or s.next_run_at
            self.rules[s.id] = (rule_for(s.current, s.anchor_at), start, str(s.tenant_id), steady)

    COLUMNS = ("id", "schedule_id", "scheduled_time", "state", "first_started_at", "tenant_id", "schedule_version",
               "reason")

    def _runs(self, a: datetime, b: datetime, *, skip=(), **where) -> list:
        from runs.models import Run
        from tests.faults.failover import retry_db

        qs = Run.objects.filter(scheduled_time__gte=a, scheduled_time__lt=b, **where)
        for lo, hi in skip:
            qs = qs.exclude(version_id__gte=lo, version_id__lte=hi)
        return retry_db(lambda: list(qs.values_list(*self.COLUMNS)))

    def peek(self, b: datetime) -> None:
        """Read the finished runs of [a, b) while their window's check is held back: retention
        removes finished runs once their partition is past it, which can come first when an
        instant of the window is made late (a spike, the scanner behind)."""
        with self.lock:
            if b > self.a:
                for row in self._runs(self.a, b, skip=self.skip_versions, finished_at__isnull=False):
                    self.seen[row[0]] = row

    def check(self, b: datetime, bounds: dict | None = None) -> None:
        with self.lock:
            a = self.a
            if b <= a:
                return
            present = self._runs(a, b)
            ids = {r[0] for r in present}
            peeked = [r for i, r in list(self.seen.items()) if a <= r[2] < b and i not in ids]
            for i in [i for i, r in self.seen.items() if r[2] < b]:
                del self.seen[i]
            self.removed_before_check += len(peeked)
            found = [r[1:] for r in present + peeked]
            rows = [r[:5] for r in found]
            # An instant has a run if any version made one. A duplicate is a second run of an
            # instant that could be delivered: an edit cancels the old version's run of an instant
            # not started yet (superseded) and the new version makes that instant again, by design
            # (docs/time-semantics.md); those two are one delivery, not a duplicate.
            have = Counter((r[0], r[1]) for r in found)
            deliverable = Counter((r[0], r[1]) for r in found if not superseded(r[2], r[6], r[3]))
            self.runs += len(found)
            self.superseded += sum(1 for r in found if superseded(r[2], r[6], r[3]))
            self.duplicates += sum(n - 1 for n in deliverable.values() if n > 1)
            for key in [k for k, n in deliverable.items() if n > 1][:max(0, 10 - len(self.examples))]:
                # What each copy was, for the table: the evidence is gone with the formation.
                states = [(r[5], r[2], r[6], r[3].isoformat() if r[3] else None) for r in found if (r[0], r[1]) == key]
                self.examples.append(f"{len(states)} runs for schedule {key[0]} at {key[1].isoformat()}: "
                                     f"(version, state, reason, first started) {states}")
            for sid, (rule, start, tenant, steady) in self.rules.items():
                hi = min(b, bounds[sid]) if bounds and sid in bounds else b
                lo = max(a, start)
                if lo >= hi:
                    continue
                for occ in rule.between(lo, hi, 100_000):
                    self.expected += 1
                    if (sid, occ.at) not in have:
                        self.lost += 1
                        if len(self.examples) < 10:
                            self.examples.append(f"no run for schedule {sid} at {occ.at.isoformat()}")
            for sid, at, state, started, tenant in rows:
                entry = self.rules.get(sid)
                if not entry or not entry[3] or str(tenant) == self.noisy:
                    continue
                if started is None:
                    if state in ("ready", "leased"):
                        self.unstarted.append((sid, at))
                    else:
                        self.not_started[state] += 1
                    continue
                self._sample(at, started, tenant)
            self.a = b

    def _sample(self, at, started, tenant):
        self.when.append(at.timestamp())
        self.lag.append((started - at).total_seconds())
        self.first.append(1 if str(tenant) == self.first_quiet else 0)

    def recheck_unstarted(self) -> int:
        """The runs not started when their window was checked, once all is quiet: their lag now."""
        import common as C

        left = 0
        for i in range(0, len(self.unstarted), 5000):
            chunk = self.unstarted[i:i + 5000]
            rows = C.sql("SELECT r.schedule_id, r.scheduled_time, r.first_started_at, r.state, r.tenant_id "
                         "FROM runs_run r JOIN unnest(%s::uuid[], %s::timestamptz[]) AS u(s, t) "
                         "ON r.schedule_id = u.s AND r.scheduled_time = u.t",
                         [[str(sid) for sid, _ in chunk], [at for _, at in chunk]])
            found = {(sid, at): (started, state, tenant) for sid, at, started, state, tenant in rows}
            for sid, at in chunk:
                row = found.get((sid, at))
                if row and row[0]:
                    self._sample(at, row[0], row[2])
                else:
                    left += 1
                    if row:
                        self.not_started[row[1]] += 1
        return left

    def figures(self, lo: float, hi: float, exclude=(), first_only=False) -> dict:
        xs = [lag for w, lag, f in zip(self.when, self.lag, self.first)
              if lo <= w < hi and not any(a <= w < b for a, b in exclude) and (f or not first_only)]
        return lag_stats(xs)


def lag_stats(xs) -> dict:
    import common as C

    xs = sorted(xs)
    return {"n": len(xs), "p50": C.percentile(xs, 50), "p99": C.percentile(xs, 99), "max": xs[-1] if xs else None}


# --------------------------------------------------------------------------------------------
# web load: the API and portal readers, bounded in count and time


class WebLoad:
    def __init__(self, base: str, api_key: str, session: str, prefixes: list, readers: int, until: float,
                 max_requests: int, seed: int):
        self.base, self.key, self.session = base, api_key, session
        self.prefixes = prefixes
        self.readers, self.until, self.max_requests = readers, until, max_requests
        self.answers = []  # (wall time, kind, path, status or exception name, seconds)
        self.created = {}  # schedule id -> (version, nextRunAt)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.rng = random.Random(seed)
        self.threads = [threading.Thread(target=self._api, daemon=True)]
        self.threads += [threading.Thread(target=self._reader, args=(i,), daemon=True) for i in range(readers)]

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def close(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=40)

    def _go(self) -> bool:
        return not self.stop.is_set() and time.time() < self.until and len(self.answers) < self.max_requests

    def _call(self, kind, method, path, body=None, headers=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers or {})
        if data is not None:
            req.add_header("Content-Type", "application/json")
        t0 = time.perf_counter()
        payload = None
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                status = r.status
                raw = r.read()
                if kind == "api" and raw:
                    payload = json.loads(raw)
        except urllib.error.HTTPError as e:
            status = e.code
            e.read()
        except Exception as e:  # refused, reset, timeout: recorded as what happened
            status = type(e).__name__
        took = time.perf_counter() - t0
        with self.lock:
            self.answers.append((time.time(), kind, f"{method} {path.split('?')[0]}" if kind == "api" else path,
                                 status, took))
        return status, payload

    def _api(self):
        auth = {"Authorization": "Bearer " + self.key}
        i = 0
        while self._go():
            i += 1
            step = i % 4
            if step == 1:
                body = {"name": f"api-{i}", "expression": "rate(1 minute)", "timeZone": "UTC",
                        "target": {"url": f"{self.prefixes[i % len(self.prefixes)]}ok/api-{i}", "timeoutSeconds": 5},
                        "misfirePolicy": "catch_up", "catchupLimit": 1000, "misfireGraceSeconds": 86400,
                        "spreadSeconds": 0, "payload": {"n": i}}
                status, out = self._call("api", "POST", "/api/v1/schedules", body, auth)
                if status == 201 and out:
                    with self.lock:
                        self.created[out["id"]] = (out["version"], out.get("nextRunAt"))
            elif step == 2 and self.created:
                with self.lock:
                    sid, (version, nxt) = self.rng.choice(list(self.created.items()))
                status, out = self._call("api", "PATCH", f"/api/v1/schedules/{sid}",
                                         {"expectedVersion": version, "payload": {"edit": i}}, auth)
                if status == 200 and out:
                    with self.lock:
                        self.created[sid] = (out["version"], nxt)
            elif step == 3 and self.created:
                sid = self.rng.choice(list(self.created))
                self._call("api", "GET", f"/api/v1/schedules/{sid}", None, auth)
            else:
                self._call("api", "GET", "/api/v1/runs?limit=50", None, auth)
            self.stop.wait(0.5)

    PAGES = ["/", "/runs/", "/schedules/", "/dlq/", "/workers/", "/audit/", "/tenants/", "/forecast/",
             "/incidents/", "/metrics"]

    def _reader(self, n):
        cookie = {"Cookie": f"sessionid={self.session}"}
        i = n
        while self._go():
            path = self.PAGES[i % len(self.PAGES)]
            i += 1
            self._call("page", "GET", path, None, cookie)
            self.stop.wait(1.0)


def make_session() -> str:
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
    from django.contrib.sessions.backends.db import SessionStore

    user = get_user_model().objects.create_superuser("soak-operator", "soak@example.invalid", "soak-not-a-secret")
    s = SessionStore()
    s[SESSION_KEY] = str(user.pk)
    s[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    s[HASH_SESSION_KEY] = user.get_session_auth_hash()
    s.create()
    return s.session_key


# --------------------------------------------------------------------------------------------
# sampling: RSS of every process, disk


def rss_mb(pid: int) -> float | None:
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def children(pid: int) -> list[int]:
    try:
        return [int(x) for x in open(f"/proc/{pid}/task/{pid}/children").read().split()]
    except OSError:
        return []


DISK_SQL = """
SELECT pg_database_size(current_database()),
       (SELECT coalesce(sum(pg_total_relation_size(inhrelid)), 0) FROM pg_inherits
        WHERE inhparent IN ('runs_run'::regclass, 'runs_attempt'::regclass, 'runs_occurrence'::regclass)),
       (SELECT coalesce(sum(pg_total_relation_size(inhrelid)), 0) FROM pg_inherits
        WHERE inhparent = 'runs_outboxevent'::regclass),
       (SELECT coalesce(sum(size), 0) FROM pg_ls_waldir()),
       (SELECT count(*) FROM pg_inherits WHERE inhparent = 'runs_run'::regclass),
       (SELECT count(*) FROM runs_historyremoval)
"""


TICKS = os.sysconf("SC_CLK_TCK")
CPU_EVERY = 1.0  # seconds between two samples of every process's CPU
PG_BACKENDS_SQL = "SELECT pid, coalesce(nullif(application_name, ''), backend_type) FROM pg_stat_activity"


def cpu_seconds(pid: int) -> tuple[str, float, float, int] | None:
    """(command name, user + system CPU seconds, the same of its children that have ended and
    been waited for, parent pid) of a process, or None once it is gone. The third is where a
    short-lived process's CPU is seen after it ends: a PostgreSQL backend's in its postmaster's,
    a killed postmaster's (its whole life's, its backends' included) in whoever reaped it."""
    try:
        raw = open(f"/proc/{pid}/stat").read()
    except OSError:
        return None
    comm = raw[raw.index("(") + 1:raw.rindex(")")]
    fields = raw[raw.rindex(")") + 2:].split()
    return (comm, (int(fields[11]) + int(fields[12])) / TICKS, (int(fields[13]) + int(fields[14])) / TICKS,
            int(fields[1]))


def machine_ticks() -> tuple[int, int, int]:
    """The machine's clock ticks since boot, all CPUs: (busy, iowait, idle), busy counting user,
    nice, system, irq, softirq and steal."""
    f = [int(x) for x in open("/proc/stat").readline().split()[1:9]]
    return f[0] + f[1] + f[2] + f[5] + f[6] + f[7], f[4], f[3]


def pg_role(pid: int) -> str:
    """What a PostgreSQL process that is not a client backend of the primary does ('walreceiver',
    'startup recovering', 'checkpointer', ...), from its title."""
    try:
        title = open(f"/proc/{pid}/cmdline").read().replace("\0", " ").strip()
    except OSError:
        return "?"
    if ": " not in title:
        return "postmaster"
    words = [w for w in title.split(": ")[-1].split() if not any(ch.isdigit() for ch in w)]
    return " ".join(words[:2]) or title[:30]


class Sampler:
    def __init__(self, procs: dict, every: float, t0: float):
        self.procs, self.every, self.t0 = procs, every, t0
        self.rss = []  # (seconds since t0, {name: MiB})
        # (seconds since t0, {pid: (label, CPU seconds)}, {pid: parent pid}): every process on the
        # machine, so the report can say where the machine's time went (ours, PostgreSQL's by
        # client, the rest).
        self.cpu = []
        self.machine = []  # (seconds since t0, (busy, iowait, idle) clock ticks of the machine)
        self.disk = []  # (seconds since t0, db, runs tables, outbox, wal, partitions, removals)
        self.load = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self.thread.start()
        return self

    def close(self):
        self.stop.set()
        self.thread.join(timeout=60)

    def sample_once(self):
        import common as C

        from tests.faults.failover import retry_db

        now = time.time() - self.t0
        out = {}
        for name, p in self.procs.items():
            if p.alive():
                key = f"{name}#{p.starts}" if p.starts > 1 else name
                v = rss_mb(p.popen.pid)
                if v is not None:
                    out[key] = v
                for c in children(p.popen.pid):  # gunicorn's workers
                    v = rss_mb(c)
                    if v is not None:
                        out[f"{key}/{c}"] = v
        self.rss.append((now, out))
        self.cpu.append((now, *self._cpu_by_pid()))
        self.machine.append((now, machine_ticks()))
        try:
            row = retry_db(lambda: C.sql(DISK_SQL)[0], timeout=20)
            self.disk.append((now, *row))
        except Exception:
            pass
        self.load.append((now, os.getloadavg()[0]))

    def _cpu_by_pid(self) -> tuple[dict, dict]:
        import common as C

        ours = {}
        for name, p in self.procs.items():
            if p.alive():
                ours[p.popen.pid] = name
                for c in children(p.popen.pid):
                    ours[c] = f"{name} (children)"
        ours[os.getpid()] = "soak (this process: ledger, web load)"
        try:
            backends = {pid: f"pg: {app}" for pid, app in C.sql(PG_BACKENDS_SQL)}
        except Exception:
            backends = {}
        out, parents = {}, {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            got = cpu_seconds(pid)
            if got is None or got[1] + got[2] == 0:
                continue
            comm, secs, reaped, parents[pid] = got
            if pid in ours:
                label = ours[pid]
            elif pid in backends:
                label = backends[pid]
            elif comm == "postgres":
                label = f"pg other: {pg_role(pid)}"
            else:
                label = comm
            out[pid] = (label, secs)
            if reaped:
                # Negative keys: a process's ended children, kept apart from its own CPU.
                out[-pid] = (f"{label}: its ended children", reaped)
        return out, parents

    def cpu_by_label(self, since: float, until: float = float("inf")) -> tuple[float, dict]:
        """CPU seconds per label between the first sample at or after `since` and the last one at
        or before `until`; a process first seen later counts from its first sample, one gone
        before the end up to its last."""
        samples = [(t, d, parents) for t, d, parents in self.cpu if since <= t <= until]
        if len(samples) < 2:
            return 0.0, {}
        first, last = {}, {}
        for _, d, _ in samples:
            for pid, v in d.items():
                first.setdefault(pid, v)
                last[pid] = v
        out: dict = {}
        for pid, (label, secs) in last.items():
            out[label] = out.get(label, 0.0) + max(0.0, secs - first[pid][1])
        # A process that ended between two samples (a killed worker's backend, a killed primary's
        # postmaster) was counted while it lived, and then its whole life's CPU, its own ended
        # children's included, reached its parent's ended children: take out what it had at its
        # last sample, so only its time after that sample is counted there (and a process never
        # sampled is counted whole).
        seen_ended: dict = {}
        for (_, before, parents), (_, after, _) in zip(samples, samples[1:]):
            for pid, (_, secs) in before.items():
                parent = parents.get(pid)
                if pid > 0 and pid not in after and parent in before:
                    # A parent that ended in the same interval (a killed primary's postmaster, whose
                    # backends end after it) left it to init, which reaped it.
                    reaper = parent if parent in after or 1 not in before else 1
                    key = f"{before[reaper][0]}: its ended children"
                    seen_ended[key] = seen_ended.get(key, 0.0) + secs + before.get(-pid, (None, 0.0))[1]
        for key, secs in seen_ended.items():
            if key in out:
                out[key] = max(0.0, out[key] - secs)
        return samples[-1][0] - samples[0][0], out

    def machine_cores(self, since: float, until: float = float("inf")) -> tuple[float, float, float] | None:
        """The machine's (busy, iowait, idle) cores, mean between the first sample at or after
        `since` and the last at or before `until`."""
        samples = [(t, m) for t, m in self.machine if since <= t <= until]
        if len(samples) < 2 or samples[-1][0] <= samples[0][0]:
            return None
        span = (samples[-1][0] - samples[0][0]) * TICKS
        return tuple((b - a) / span for a, b in zip(samples[0][1], samples[-1][1]))

    def _run(self):
        # CPU every second, the rest every `every`: a process that begins and ends between two CPU
        # samples is seen only in its parent's ended children (a PostgreSQL autovacuum or parallel
        # worker in its postmaster's), so the more of them are seen alive, the more the table names.
        next_full = 0.0
        while not self.stop.wait(CPU_EVERY):
            try:
                now = time.time() - self.t0
                if now >= next_full:
                    next_full = now + self.every
                    self.sample_once()
                else:
                    self.cpu.append((now, *self._cpu_by_pid()))
                    self.machine.append((now, machine_ticks()))
            except Exception as exc:
                print(f"  sampler: {type(exc).__name__}: {exc}", flush=True)


# --------------------------------------------------------------------------------------------
# the run


@dataclass
class Fault:
    name: str
    at: datetime
    until: datetime | None = None
    note: str = ""
    gap: float | None = None


@dataclass
class Outcome:
    faults: list = field(default_factory=list)
    spike: dict = field(default_factory=dict)
    quiet_spike: dict = field(default_factory=dict)
    spike_lead: float = 0.0
    lost: int = 0
    duplicates: int = 0
    stale: int = 0
    audit: int = 0
    unfinished: int = 0
    details: list = field(default_factory=list)
    # pg_stat_statements by statement name over the steady window: (name, calls, exec ms, rows, WAL bytes)
    statements: list = field(default_factory=list)
    statements_window: tuple = (0.0, 0.0)


def spike_figures(C, vrange, at: datetime, timeout: float, log) -> dict:
    """Wait until every run of the spike has started; its figures from the database."""
    from tests.faults.failover import retry_db

    lo, hi = vrange
    n = hi - lo + 1
    q = ("SELECT count(*), count(first_started_at), count(*) FILTER (WHERE created_at > %s), "
         "extract(epoch FROM max(first_started_at) - %s), extract(epoch FROM max(created_at) - %s), "
         "extract(epoch FROM min(created_at) - %s) "
         "FROM runs_run WHERE scheduled_time = %s AND version_id BETWEEN %s AND %s")
    end = time.monotonic() + timeout
    row = None
    while time.monotonic() < end:
        row = retry_db(lambda: C.sql(q, [at, at, at, at, at, lo, hi])[0])
        if row[0] >= n and row[1] >= n:
            break
        time.sleep(1.0)
    made, started, after, all_started, last_made, first_made = row
    out = {"runs": n, "made": made, "started": started, "made_after_T": after + (n - made),
           "all_started": float(all_started) if all_started is not None else None,
           "last_made": float(last_made) if last_made is not None else None,
           "first_made": float(first_made) if first_made is not None else None, "done": started >= n}
    log(f"  spike at {at:%H:%M:%S}: {started}/{n} started, all started {C.fmt(out['all_started'], 's', 1)} after T, "
        f"made_after_T={out['made_after_T']} (made from {C.fmt(out['first_made'], 's', 1)} to "
        f"{C.fmt(out['last_made'], 's', 1)} after T)")
    return out


def _at_least(low):
    """An argparse type: a number not below `low` (a soak of -1 minutes ran nothing and printed its
    zeros as a pass)."""
    def parse(text):
        value = float(text) if isinstance(low, float) else int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"{text}: at least {low}")
        return value
    parse.__name__ = "number"  # argparse names the type in its message: "invalid number value"
    return parse


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=_at_least(1.0), default=None, help="default 60 (4 with --ci)")
    ap.add_argument("--ci", action="store_true",
                    help="the form CI runs beside the test suite's PostgreSQL pass: 4 minutes, 5,000 schedules, "
                         "5 runs/s, noisy tenant 2/s, spike 500, one portal reader; every fault and every zero "
                         "check as in the short form, at the load the suite's lane beside it leaves room for "
                         "(flags given as well override these)")
    ap.add_argument("--schedules", type=_at_least(1), default=None, help="default 10,000,000 (20,000 below 30 minutes)")
    ap.add_argument("--rate", type=_at_least(1), default=None, help="runs due per second; default 278 (20 below 30 minutes)")
    ap.add_argument("--spike", type=_at_least(0), default=None, help="runs due at the midnight; default 100,000 (2,000 below 30 minutes)")
    ap.add_argument("--quiet-spike", action=argparse.BooleanOptionalAction, default=None,
                    help="first run the spike on the quiet system (the baseline); default on from 30 minutes")
    ap.add_argument("--partition-seconds", type=int, default=None, help="default 60 (30 below 30 minutes)")
    ap.add_argument("--keep-partitions", type=int, default=4, help="finished runs kept this many partitions")
    ap.add_argument("--lease", type=int, default=10, help="SCHEDULER_LEASE_SECONDS")
    ap.add_argument("--scanners", type=_at_least(1), default=1,
                    help="`scan` processes; with N > 1, each `--shards N --shard I` (docs/scaling.md)")
    ap.add_argument("--nice", type=int, default=0,
                    help="run every process of ours but the scanner(s) at this nice value (Linux's CPU weight), to "
                         "see what the spike gets from a scanner with a larger share of a saturated host; "
                         "PostgreSQL's processes keep theirs")
    ap.add_argument("--readers", type=_at_least(0), default=None, help="portal reader loops; default 4 (1 with --ci)")
    ap.add_argument("--workers", default="256x200", help="CONCURRENCYxBATCH of each of the two workers")
    ap.add_argument("--noisy-rate", type=_at_least(0), default=None,
                    help="runs due per second for the noisy tenant; default max(30, rate/7) (10 below 30 minutes)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--strict-spike", action=argparse.BooleanOptionalAction, default=None,
                    help="exit 1 when the spike's made_after_T is not 0 (default from 30 minutes: below, a loaded "
                         "CI host may not give the scanner the capacity to make it ahead, which is not a loss)")
    args = ap.parse_args()
    ci_form = {"minutes": 4.0, "schedules": 5_000, "rate": 5, "noisy_rate": 2, "spike": 500, "readers": 1}
    for name, value in ci_form.items():
        if args.ci and getattr(args, name) is None:
            setattr(args, name, value)
    args.minutes = 60.0 if args.minutes is None else args.minutes
    args.readers = 4 if args.readers is None else args.readers
    short = args.minutes < 30
    plan = Plan(
        minutes=args.minutes,
        schedules=args.schedules if args.schedules is not None else (20_000 if short else 10_000_000),
        rate=args.rate if args.rate is not None else (20 if short else 278),
        spike=args.spike if args.spike is not None else (2_000 if short else 100_000),
        quiet_spike=args.quiet_spike if args.quiet_spike is not None else not short,
        partition_seconds=args.partition_seconds or (30 if short else 60),
        keep_partitions=args.keep_partitions, lease=args.lease,
        sweep_every=15.0 if short else 30.0, sweep_margin=40.0,
    )
    plan.noisy_rate = args.noisy_rate if args.noisy_rate is not None else max(10 if short else 30, plan.rate // 7)
    plan.strict_spike = args.strict_spike if args.strict_spike is not None else not short
    if os.geteuid() != 0:
        raise SystemExit("soak needs root: network namespaces, and pg_autoctl run as the postgres user")
    # SIGTERM (a supervisor, `kill`) stops the run as Ctrl-C does: through run()'s teardown, which
    # stops the processes and removes the formation and the network namespaces; Python's default
    # would end the process at once and leave all of them behind.
    signal.signal(signal.SIGTERM, _interrupt)
    sys.exit(run(plan, args))


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def run(plan: Plan, args) -> int:
    started_wall = time.monotonic()
    logdir = ROOT / "bench" / "out" / "soak"
    logdir.mkdir(parents=True, exist_ok=True)
    for old in logdir.glob("*.log"):
        old.unlink()

    def log(msg):
        print(f"[{time.monotonic() - started_wall:6.0f}s] {msg}", flush=True)

    from tests.faults.netns import Host, Network
    from tests.faults.pgcluster import AutoFailoverCluster, free_port

    monitor = {
        # The failover suite's fast settings, a little slower to call a node unhealthy: this machine
        # is loaded on purpose, and an unplanned failover would be a fault the table does not name.
        "pgautofailover.health_check_period": 1000,
        "pgautofailover.health_check_timeout": 2000,
        "pgautofailover.health_check_max_retries": 2,
        "pgautofailover.health_check_retry_delay": 500,
        "pgautofailover.node_considered_unhealthy_timeout": 6000,
        "pgautofailover.primary_demote_timeout": 6000,
        "pgautofailover.startup_grace_period": 4000,
    }
    cluster = AutoFailoverCluster(monitor_settings=monitor)
    net = Network()
    target = procs = web = sampler = sweeper = None
    outcome = Outcome()
    sweep_stop = threading.Event()
    try:
        t = time.monotonic()
        cluster.start(timeout=180)
        net.start()
        w2host = net.add_host("w2")
        harness_peer = Host("harness", "", net.harness_addr)
        # The namespaced worker reaches the formation over the bridge.
        for node in cluster.nodes:
            import psycopg

            with psycopg.connect(cluster.node_url(node), autocommit=True) as c:
                hba = c.execute("SHOW hba_file").fetchone()[0]
                listen = c.execute("SHOW listen_addresses").fetchone()[0]
            with open(hba, "a") as f:
                f.write(f"host all all {net.prefix}.0/24 trust\n")
            with psycopg.connect(cluster.node_url(node), autocommit=True) as c:
                c.execute("SELECT pg_reload_conf()")
        log(f"formation up in {time.monotonic() - t:.0f}s ({cluster.url()}; listen_addresses {listen!r}); "
            f"worker host w2 at {w2host.addr}")

        url = cluster.url()
        retention = plan.keep_partitions * plan.partition_seconds
        env_extra = {
            "SCHEDULER_LEASE_SECONDS": plan.lease,
            "SCHEDULER_RECONCILE_SECONDS": 2,
            "SCHEDULER_PARTITION_SECONDS": plan.partition_seconds,
            # Beyond the scanner's look-ahead (SCHEDULER_LOOKAHEAD_SECONDS, 120 s by default, up to
            # 900 s tried), or the runs it makes early land in the catch-all partition until
            # `maintain` moves them.
            "SCHEDULER_PARTITION_AHEAD_SECONDS": max(1200, 3 * plan.partition_seconds),
            "SCHEDULER_RETENTION_DAYS": retention / 86400,
            "SCHEDULER_DEAD_RETENTION_DAYS": 1.5 * retention / 86400,
            "SCHEDULER_MAINTENANCE_SECONDS": 5,
            "SCHEDULER_OUTBOX_RETENTION_HOURS": 1,
            "SCHEDULER_MAX_SCHEDULES_PER_TENANT": 0,
            "SCHEDULER_TARGET_ALLOWED_NETWORKS": f"127.0.0.0/8,{net.prefix}.0/24",
            "SCHEDULER_ALLOW_DEV_SECRET": 1,
            "DJANGO_SETTINGS_MODULE": "scheduler_project.settings",
            "LOG_LEVEL": "WARNING",
            "PYTHONUNBUFFERED": 1,
        }
        os.environ.update({k: str(v) for k, v in env_extra.items()})
        os.environ["DATABASE_URL"] = url
        env = {**os.environ}
        subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
        import django

        django.setup()
        from django.conf import settings

        settings.DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
        import common as C

        from tests.faults.failover import attempt_starts, longest_gap, retry_db
        from tests.faults.harness import Proc, count_audit_violations

        print(C.machine_line(pg_version=_pg_version(cluster)), flush=True)
        print(f"plan: {plan.minutes:g} min, {plan.schedules:,} schedules, {plan.rate} runs/s steady, spike "
              f"{plan.spike:,}{' (and first on the quiet system)' if plan.quiet_spike else ''}, partitions of "
              f"{plan.partition_seconds}s kept {plan.keep_partitions} ({retention}s), lease {plan.lease}s, "
              f"{args.scanners} scanner(s)" + (f", every process of ours but the scanner at nice {args.nice}"
                                               if args.nice else ""), flush=True)

        target = SoakTarget(net.harness_addr, plan.slow, args.seed)
        info = load(C, plan, target, log)
        from schedules.models import Schedule
        from schedules.models import Tenant as TenantModel
        from schedules.tenants import create_api_key

        _, api_key = create_api_key(TenantModel.objects.get(id=info["api"]), label="soak")
        session = make_session()

        concurrency, batch = args.workers.split("x")
        url_w2 = url.replace("127.0.0.1", net.harness_addr)
        env_w2 = {**env, "DATABASE_URL": url_w2}
        web_port = free_port()
        procs = {
            **scanners(args.scanners, env, logdir),
            "work-w1": Proc("work", ["work", "--concurrency", concurrency, "--batch", batch, "--worker-id", "w1"], env,
                            log_path=logdir / "work-w1.log"),
            "work-w2": Proc("work", ["work", "--concurrency", concurrency, "--batch", batch, "--worker-id", "w2"],
                            env_w2, prefix=w2host.exec_prefix(), log_path=logdir / "work-w2.log"),
            "reconcile": Proc("reconcile", ["reconcile"], env, log_path=logdir / "reconcile.log"),
            "relay": Proc("relay", ["relay"], env, log_path=logdir / "relay.log"),
            "maintain": Proc("maintain", ["maintain"], {**env, "LOG_LEVEL": "INFO"}, log_path=logdir / "maintain.log"),
            "web": Proc("web", [], env, log_path=logdir / "web.log", argv=[
                sys.executable, "-m", "gunicorn", "scheduler_project.wsgi", "-b", f"127.0.0.1:{web_port}",
                "-w", "2", "--timeout", "60", "--graceful-timeout", "5"]),
        }
        if args.nice:
            for name, p in procs.items():
                if p.kind != "scan":
                    p.prefix = ["nice", "-n", str(args.nice), *p.prefix]
        for p in procs.values():
            p.start()
        from tests.faults.failover import _wait_answering

        _wait_answering(f"http://127.0.0.1:{web_port}/readyz", timeout=90)
        if not C.wait_until(lambda: len(retry_db(lambda: C.backend_pids("scheduler-work"))) >= 2, timeout=90):
            raise RuntimeError("the two workers did not connect within 90 s (see bench/out/soak/work-*.log)")
        log(f"processes up: scan{f' x{args.scanners} (one per shard)' if args.scanners > 1 else ''}, work x2 (w2 in its "
            "namespace), reconcile, relay, maintain, gunicorn x2")

        if plan.quiet_spike:
            # As far ahead as the scanner's look-ahead (SCHEDULER_LOOKAHEAD_SECONDS) reaches, so that it can
            # make the spike before its instant as it would a real midnight.
            at = _instant(C, lead=SPIKE_LEAD)
            arm_spike(C, "sq", at)
            log(f"quiet spike: {plan.spike:,} due at {at:%H:%M:%S} with nothing else due")
            outcome.quiet_spike = spike_figures(C, info["spikes"]["sq"], at, timeout=600, log=log)

        # The steady load starts in a few seconds (each schedule at its own second of the minute).
        t0 = _instant(C, lead=15)
        arm_steady(C, t0)
        firing = list(Schedule.objects.filter(name__regex=r"^(f|n)-").select_related("current"))
        ledger = Ledger(t0, info["noisy"], info["quiet"][0])
        ledger.skip_versions = list(info["spikes"].values())
        ledger.add(firing, steady=True)
        end = t0 + timedelta(seconds=plan.seconds)
        D = plan.seconds
        # The midnight lands 2 s after a partition boundary: `maintain` (every 5 s) drops the
        # partition that aged out at that boundary.
        w = plan.partition_seconds
        mid = t0 + timedelta(seconds=0.55 * D)
        mid = datetime.fromtimestamp((mid.timestamp() // w) * w + 2, timezone.utc)
        arm_spike(C, "sm", mid)
        # How long before its instant the scanner could have seen the midnight (a real one is there
        # for days; here it is armed when the steady load begins).
        outcome.spike_lead = (mid - C.db_now()).total_seconds()
        timeline = [
            (0.15, "kill -9 scanner"), (0.27, "switchover"), (0.40, "worker w2 partitioned"),
            ((mid - t0).total_seconds() / D, "spike"), (0.67, "kill -9 worker w1"), (0.80, "primary killed"),
        ]
        log(f"steady load from {t0:%H:%M:%S} to {end:%H:%M:%S}; midnight at {mid:%H:%M:%S}; faults at "
            + ", ".join(f"{n} +{f * D:.0f}s" for f, n in timeline))

        # Load threads.
        t_wall0 = t0.timestamp()
        sampler = Sampler(procs, every=15.0 if plan.minutes < 30 else 30.0, t0=t_wall0)
        web = WebLoad(f"http://127.0.0.1:{web_port}", api_key, session, target.prefixes, args.readers,
                      until=end.timestamp(), max_requests=int(plan.seconds * (args.readers + 3)), seed=args.seed)

        def sweep_loop():
            api_seen = set()
            while not sweep_stop.wait(plan.sweep_every):
                try:
                    # API schedules join the reconciliation from the first instant their create
                    # answered with.
                    with web.lock:
                        new = {k: v for k, v in web.created.items() if k not in api_seen}
                    if new:
                        rows = retry_db(lambda: list(Schedule.objects.filter(id__in=list(new)).select_related("current")))
                        starts = {s.id: _parse(new[str(s.id)][1]) for s in rows}
                        ledger.add(rows, steady=False, starts=starts)
                        api_seen |= {str(s.id) for s in rows}
                    now = retry_db(C.db_now)
                    # The oldest instant not made yet of a schedule the ledger reconciles: the
                    # spike's sets are not among them (spike_figures reads them), and a spike being
                    # made late held the bound at its instant until the last of it was made, while
                    # retention removed that window's finished runs (found in run I: 8,921
                    # instants counted lost, removed 4 s before the sweep reached them).
                    lowest = retry_db(lambda: C.sql("SELECT min(next_run_at) FROM schedules_schedule "
                                                    "WHERE enabled AND status = 'active' "
                                                    "AND name NOT LIKE 'sm-%' AND name NOT LIKE 'sq-%'")[0][0])
                    b = now - timedelta(seconds=plan.sweep_margin)
                    if lowest is not None and lowest < b:
                        ledger.peek(b.replace(microsecond=0))
                        b = lowest
                    ledger.check(b.replace(microsecond=0))
                except Exception as exc:
                    print(f"  sweep: {type(exc).__name__}: {exc}", flush=True)

        sweeper = threading.Thread(target=sweep_loop, daemon=True)
        wait_until(t0)
        sampler.start()
        web.start()
        sweeper.start()
        log("steady load on; web load on")

        pending_gaps = []

        def finish_gaps(force=False):
            for f in list(pending_gaps):
                if force or utcnow() >= f.at + timedelta(seconds=OBSERVE_SECONDS):
                    until = min(utcnow(), f.at + timedelta(seconds=OBSERVE_SECONDS))
                    starts = retry_db(lambda: attempt_starts(f.at - timedelta(seconds=30), until))
                    f.gap = longest_gap(starts, f.at, until)
                    pending_gaps.remove(f)
                    log(f"  dispatch gap after {f.name}: {f.gap:.1f}s")

        def wait_for(moment: datetime):
            while utcnow() < moment:
                finish_gaps()
                for name, p in procs.items():
                    if not p.alive():
                        outcome.details.append(f"{name} exited {p.popen.returncode} at {utcnow():%H:%M:%S}; restarted")
                        p.start()
                time.sleep(0.5)

        def watch_spike():
            # Its figures are read while the run goes on: retention drops its partition soon after.
            try:
                wait_until(mid + timedelta(seconds=2))
                out = spike_figures(C, info["spikes"]["sm"], mid, timeout=max(60.0, (end - utcnow()).total_seconds() + 300),
                                    log=log)
                wait_until(mid + timedelta(seconds=w))
                removals = retry_db(lambda: C.sql(
                    "SELECT at, what, lock_ms FROM runs_historyremoval WHERE at BETWEEN %s AND %s ORDER BY at",
                    [mid - timedelta(seconds=w), mid + timedelta(seconds=w)]))
                out["removals"] = [(float((at - mid).total_seconds()), what, lock) for at, what, lock in removals]
                outcome.spike = out
            except Exception as exc:
                outcome.details.append(f"spike watch: {type(exc).__name__}: {exc}")

        spike_thread = threading.Thread(target=watch_spike, daemon=True)
        spike_thread.start()
        try:
            for q in STATEMENTS_PLANNING_SQL:
                C.sql(q)
        except Exception as exc:
            outcome.details.append(f"statements' planning: {type(exc).__name__}: {exc}")
        wait_for(t0 + timedelta(seconds=STATEMENTS_FROM))
        try:
            C.sql(STATEMENTS_RESET_SQL)
        except Exception as exc:  # pg_stat_statements not loaded: the table is left out
            outcome.details.append(f"statements: {type(exc).__name__}: {exc}")
        for frac, name in timeline:
            wait_for(t0 + timedelta(seconds=frac * D))
            if name == "spike":
                f = Fault(name, mid)
                outcome.faults.append(f)
                pending_gaps.append(f)
                continue
            f = Fault(name, utcnow())
            outcome.faults.append(f)
            if name.startswith("kill -9"):
                p = procs["scan" if "scanner" in name else "work-w1"]  # with --scanners N, shard 0's
                f.at = utcnow()
                p.popen.send_signal(signal.SIGKILL)
                p.popen.wait()
                p.start()
                f.until = utcnow()
            elif name == "switchover":
                try:
                    outcome.statements = retry_db(lambda: C.sql(STATEMENTS_SQL), timeout=20)
                    outcome.statements_window = (STATEMENTS_FROM, (utcnow() - t0).total_seconds())
                except Exception as exc:
                    outcome.details.append(f"statements: {type(exc).__name__}: {exc}")
                waited = cluster.wait_synchronous(180, "synchronous replication before the switchover")
                old = cluster.primary()
                new = next(n for n in cluster.nodes if n is not old)
                f.at = utcnow()
                switch = cluster.switchover()
                promoted = cluster.wait(lambda: cluster.writable(new), 180, "the switchover")
                f.until = utcnow()
                switch.wait(timeout=180)
                settled = cluster.wait_settled(240, "the old primary back as standby")
                f.note = f"waited {waited:.1f}s for sync; promoted after {promoted:.1f}s; standby back {settled:.1f}s later"
            elif name == "primary killed":
                waited = cluster.wait_synchronous(180, "synchronous replication before the kill")
                old = cluster.primary()
                new = next(n for n in cluster.nodes if n is not old)
                f.at = utcnow()
                cluster.kill(old)
                promoted = cluster.wait(lambda: cluster.writable(new), 180, "the standby's promotion")
                f.until = utcnow()
                cluster.restart(old)
                settled = cluster.wait_settled(240, "the old primary to rejoin as standby")
                f.note = f"waited {waited:.1f}s for sync; promoted after {promoted:.1f}s; old primary back {settled:.1f}s later"
            elif name == "worker w2 partitioned":
                cut = 2 * plan.lease
                f.at = utcnow()
                net.cut(w2host, harness_peer)
                wait_for(f.at + timedelta(seconds=cut))
                net.heal(w2host, harness_peer)
                f.until = utcnow()
                f.note = f"cut from the database and the target for {cut}s (lease {plan.lease}s)"
            pending_gaps.append(f)
            log(f"fault: {name} at +{(f.at - t0).total_seconds():.0f}s {f.note}")

        wait_for(end)
        spike_thread.join(timeout=600)
        log("steady load over; quieting down")
        web.close()
        finish_gaps(force=True)
        sweep_stop.set()
        sweeper.join(timeout=120)
        sampler.close()

        # Retention stops with the steady load (its figures are taken): the drain below takes
        # minutes, in which the last windows' partitions age out, and `maintain` would remove
        # their runs before the final reconciliation reads them (counted lost: 1,062 in the first
        # short run once `maintain` kept up; it had been starved of its locks before).
        maint = procs["maintain"]
        if maint.alive():
            maint.popen.send_signal(signal.SIGTERM)
            try:
                maint.popen.wait(timeout=60)
            except subprocess.TimeoutExpired:
                maint.popen.kill()
        # Quiet down: the scanners catch up, the firing schedules stop, every run ends.
        with web.lock:
            api_ids = list(web.created)
        plist = [p for name, p in procs.items() if name != "maintain"]
        bounds = quiet_down(C, plist, api_ids, timeout=420 if plan.minutes < 30 else 1200, log=log)
        with web.lock:
            new = {k: v for k, v in web.created.items() if k not in {str(x) for x in ledger.rules}}
        if new:
            rows = list(Schedule.objects.filter(id__in=list(new)).select_related("current"))
            ledger.add(rows, steady=False, starts={s.id: _parse(new[str(s.id)][1]) for s in rows})
        last = max(bounds.values()) if bounds else C.db_now()
        ledger.check(last + timedelta(seconds=1), bounds=bounds)
        left = ledger.recheck_unstarted()
        from runs.models import Run

        outcome.unfinished = retry_db(lambda: Run.objects.exclude(state__in=["succeeded", "dead", "canceled", "skipped"]).count())
        for p in plist:
            if p.alive():
                p.popen.send_signal(signal.SIGTERM)
        for p in plist:
            try:
                p.popen.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.popen.kill()
        outcome.lost = ledger.lost + outcome.unfinished
        outcome.duplicates = ledger.duplicates
        outcome.stale = retry_db(lambda: C.sql(STALE_SQL)[0][0])
        outcome.audit = count_audit_violations(log=lambda m: outcome.details.append(m))
        outcome.details += ledger.examples
        if left:
            outcome.details.append(f"{left} quiet runs never started (counted as lost if not terminal)")
        monitor_events = cluster.state_changes(t0 - timedelta(seconds=60))
        counts = _counts(C, t0)
        code = report(plan, outcome, ledger, sampler, web, target, t0, mid, end, counts, monitor_events, logdir, log)
        log(f"done in {time.monotonic() - started_wall:.0f}s")
        return code
    finally:
        sweep_stop.set()
        if web:
            web.close()
        if sampler:
            sampler.close()
        for p in (procs or {}).values():
            if p.alive():
                p.popen.send_signal(signal.SIGTERM)
        for p in (procs or {}).values():
            if p.popen:
                try:
                    p.popen.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.popen.kill()
        if target:
            target.close()
        net.teardown()
        cluster.stop()


FIRING_SQL = "(name ~ '^(f|n)-' OR id = ANY(%s::uuid[]))"


def scanners(n: int, env: dict, logdir) -> dict:
    """The `scan` processes by name: "scan" alone, or shard I's as "scan" (I = 0) and "scan-I"."""
    from tests.faults.harness import Proc

    env = {**env, "LOG_LEVEL": "INFO"}
    if n == 1:
        return {"scan": Proc("scan", ["scan"], env, log_path=logdir / "scan.log")}
    return {("scan" if i == 0 else f"scan-{i}"): Proc("scan", ["scan", "--shards", str(n), "--shard", str(i)], env,
                                                      log_path=logdir / ("scan.log" if i == 0 else f"scan-{i}.log"))
            for i in range(n)}


def quiet_down(C, procs, api_ids, *, timeout: float, log) -> dict:
    """tests/faults/harness.quiet_down for a load where some schedule is due every second: wait
    until the scanner has made every instant up to now, then stop the firing schedules (the
    UPDATE waits for the scanner's row locks, so the bounds it returns are exact), then wait for
    every run to end. Returns each schedule's bound: every rule instant before it must have a run."""
    from tests.faults.failover import retry_db

    end = time.monotonic() + timeout

    def revive():
        for p in procs:
            if not p.alive():
                p.start()

    until = retry_db(C.db_now)
    # The operator lifts the noisy tenant's cap so that its backlog drains in seconds rather than
    # waiting out its misfire grace.
    retry_db(lambda: C.sql("UPDATE schedules_tenant SET max_in_flight = NULL WHERE slug = 'noisy'", fetch=False))
    while time.monotonic() < end:
        revive()
        behind = retry_db(lambda: C.sql(f"SELECT count(*) FROM schedules_schedule WHERE {FIRING_SQL} AND enabled "
                                        f"AND next_run_at <= %s", [api_ids, until])[0][0])
        if not behind:
            break
        time.sleep(0.5)
    rows = retry_db(lambda: C.sql(f"UPDATE schedules_schedule SET enabled = false WHERE {FIRING_SQL} "
                                  f"RETURNING id, next_run_at", [api_ids]))
    bounds = {sid: at for sid, at in rows if at is not None}
    log(f"  scanner caught up with {until:%H:%M:%S}; {len(rows)} firing schedules stopped")
    open_sql = ("SELECT (SELECT count(*) FROM runs_run WHERE state = 'ready') + "
                "(SELECT count(*) FROM runs_run WHERE state = 'leased')")
    left = None
    while time.monotonic() < end:
        revive()
        left = retry_db(lambda: C.sql(open_sql)[0][0])
        if not left:
            break
        time.sleep(1.0)
    log("  every run ended" if not left else f"  {left} runs still open after the drain")
    return bounds


STALE_SQL = """
SELECT count(*) FROM (
  SELECT e.kind, (e.payload ->> 'generation')::int AS g,
         max(CASE WHEN e.kind = 'run.leased' THEN (e.payload ->> 'generation')::int END)
           OVER (PARTITION BY e.run_id ORDER BY e.id ROWS UNBOUNDED PRECEDING) AS current
  FROM runs_outboxevent e
  WHERE e.run_id IN (SELECT run_id FROM runs_outboxevent WHERE kind = 'run.created')
) x
WHERE kind IN ('run.succeeded', 'run.dead', 'run.retry_scheduled', 'run.lease_expired')
  AND g IS NOT NULL AND g IS DISTINCT FROM current
"""


def _counts(C, t0) -> dict:
    row = C.sql("SELECT count(*), count(*) FILTER (WHERE state = 'succeeded'), count(*) FILTER (WHERE state = 'dead'), "
                "count(*) FILTER (WHERE state = 'skipped'), count(*) FILTER (WHERE state = 'canceled') "
                "FROM runs_run")[0]
    att = C.sql("SELECT count(*), count(*) FILTER (WHERE outcome = 'unknown'), count(*) FILTER (WHERE late_result IS NOT NULL) "
                "FROM runs_attempt")[0]
    removals = C.sql("SELECT count(*), max(lock_ms), percentile_cont(0.5) WITHIN GROUP (ORDER BY lock_ms) "
                     "FROM runs_historyremoval WHERE at >= %s", [t0])[0]
    return {"runs_kept": row[0], "succeeded": row[1], "dead": row[2], "skipped": row[3], "canceled": row[4],
            "attempts_kept": att[0], "unknown": att[1], "late_results": att[2], "removals": removals[0],
            "removal_lock_max": removals[1], "removal_lock_p50": removals[2]}


def _pg_version(cluster) -> str:
    import psycopg

    with psycopg.connect(cluster.node_url(cluster.primary()), autocommit=True) as c:
        v = c.execute("SHOW server_version").fetchone()[0]
        sb = c.execute("SHOW shared_buffers").fetchone()[0]
    return f"PostgreSQL {v.split()[0]} pg_auto_failover formation (primary + synchronous standby, shared_buffers {sb})"


def _instant(C, lead: float) -> datetime:
    return C.sql("SELECT date_trunc('second', statement_timestamp()) + make_interval(secs => %s)", [lead])[0][0]


def _parse(text):
    return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None


def wait_until(moment: datetime) -> None:
    while utcnow() < moment:
        time.sleep(min(0.5, max(0.0, (moment - utcnow()).total_seconds())))


# --------------------------------------------------------------------------------------------
# the table


def print_cpu(sampler: Sampler, windows: list) -> None:
    """CPU by process in each window (seconds from the start of the steady load), as cores."""
    cols = []
    for name, since, until in windows:
        span, by_label = sampler.cpu_by_label(since, until)
        if span > 0:
            cols.append((name, since, span, by_label, sampler.machine_cores(since, until)))
    if not cols:
        return
    print("\nCPU by process, in cores (PostgreSQL's by client application, then its own processes; a process's ended "
          "children with their whole life's CPU when they end, less what was counted while they lived); windows: "
          + "; ".join(f"{n} +{since:.0f}s for {span:.0f}s" for n, since, span, _, _ in cols))
    print("  " + " " * 44 + "".join(f"{n:>15s}" for n, *_ in cols))
    rows = [("the machine (/proc/stat): busy", [m[0] if m else None for *_, m in cols]),
            ("  of it not listed below", [(m[0] - sum(d.values()) / sp) if m else None for _, _, sp, d, m in cols]),
            ("  listed below in all", [sum(d.values()) / sp for _, _, sp, d, _ in cols])]
    last = cols[-1][3]
    labels = sorted({k for *_, d, _ in cols for k in d}, key=lambda k: -last.get(k, 0.0))
    for label in labels:
        vals = [d.get(label, 0.0) / sp for _, _, sp, d, _ in cols]
        if max(vals) >= 0.005:
            rows.append((label, vals))
    for label, vals in rows[:30]:
        print(f"  {label[:44]:44s}" + "".join(f"{v:15.2f}" if v is not None else f"{'n/a':>15s}" for v in vals))


def print_statements(o: Outcome) -> None:
    if not o.statements:
        return
    since, until = o.statements_window
    span = max(until - since, 1e-9)
    total = sum(r[2] for r in o.statements)
    print(f"\nstatements on the primary in the steady window (+{since:.0f}s to +{until:.0f}s, pg_stat_statements, "
          f"by the name in the statement's first line): {total / 1000 / span:.2f} s of execution a second in all")
    print(f"  {'statement':56s} {'calls/s':>9s} {'ms/call':>9s} {'exec s/s':>9s} {'plan s/s':>9s} {'rows/call':>10s} "
          f"{'WAL B/call':>11s}")
    for name, calls, ms, rows, wal, plan in o.statements[:20]:
        print(f"  {name[:56]:56s} {calls / span:9.1f} {ms / max(calls, 1):9.3f} {ms / 1000 / span:9.3f} "
              f"{(plan or 0) / 1000 / span:9.3f} {rows / max(calls, 1):10.1f} {wal / max(calls, 1):11.0f}")
    print(f"  planning in all: {sum(r[5] or 0 for r in o.statements) / 1000 / span:.3f} s a second (these statements)")


def report(plan, o: Outcome, ledger: Ledger, sampler: Sampler, web: WebLoad, target: SoakTarget, t0, mid, end,
           counts, monitor_events, logdir: Path, log) -> int:
    import common as C

    f = lambda x, nd=3: C.fmt(x, "s", nd)  # noqa: E731
    T0 = t0.timestamp()
    spike_end = mid.timestamp() + (o.spike.get("all_started") or 0.0) + 1.0
    spike_window = [(mid.timestamp(), spike_end)]
    whole = ledger.figures(T0, end.timestamp(), exclude=spike_window)
    print("\n" + "=" * 100)
    print(f"SOAK: {plan.minutes:g} min, {plan.schedules:,} schedules, {plan.rate} runs/s steady + noisy tenant "
          f"{plan.noisy_rate}/s (max_in_flight 2), spike {plan.spike:,}; load average now "
          + "/".join(f"{x:.2f}" for x in os.getloadavg()))
    loads = [x for _, x in sampler.load]
    if loads:
        print(f"load average (1 min) during the run: min {min(loads):.2f}, median {C.median(loads):.2f}, max {max(loads):.2f}"
              " (the soak's own processes and anything else on the machine)")
    print("\nstart lag of the quiet tenants' every-minute runs, outside the spike (per minute from the start):")
    print(f"  {'minute':>6s} {'runs':>7s} {'p50':>8s} {'p99':>8s} {'max':>8s}  events")
    minutes = int(plan.seconds // 60)
    for m in range(minutes):
        lo, hi = T0 + 60 * m, T0 + 60 * (m + 1)
        s = ledger.figures(lo, hi, exclude=spike_window)
        events = [x.name for x in o.faults if lo <= x.at.timestamp() < hi]
        print(f"  {m:6d} {s['n']:7d} {f(s['p50']):>8s} {f(s['p99']):>8s} {f(s['max']):>8s}  {', '.join(events)}")
    print(f"  {'whole':>6s} {whole['n']:7d} {f(whole['p50']):>8s} {f(whole['p99']):>8s} {f(whole['max']):>8s}"
          f"   (goal p99 <= 1 s)")
    if ledger.not_started:
        print(f"  not started, by state (excluded): {dict(ledger.not_started)}")

    s = o.spike
    quiet_first = ledger.figures(mid.timestamp(), spike_end, first_only=True)
    print(f"\nspike ({plan.spike:,} due at {mid:%H:%M:%S}, +{(mid - t0).total_seconds():.0f}s):")
    print(f"  seen ahead         {o.spike_lead:.0f}s (armed as the steady load began: how long before its instant the "
          f"scanner could have started on it)")
    print(f"  all started        {f(s.get('all_started'), 2)} after the instant ({s.get('started')}/{s.get('runs')} started)")
    if o.quiet_spike:
        q = o.quiet_spike
        ratio = (s["all_started"] / q["all_started"]) if s.get("all_started") and q.get("all_started") else None
        print(f"  on the quiet system {f(q.get('all_started'), 2)} (made_after_T {q.get('made_after_T')}); "
              f"ratio {C.fmt(ratio, '', 2)}")
    print(f"  made_after_T       {s.get('made_after_T')}  (goal 0; the last run made {f(s.get('last_made'), 1)} from the instant)")
    print(f"  quiet tenant p99   {f(quiet_first['p99'])} (p50 {f(quiet_first['p50'])}, max {f(quiet_first['max'])}, "
          f"{quiet_first['n']} runs due while the spike was being started)")
    rm = s.get("removals") or []
    print("  partition removals near it: " + (", ".join(f"{what} at {at:+.1f}s locked {C.fmt(lock, ' ms', 0)}"
                                                        for at, what, lock in rm) or "none within a partition's width"))

    print("\nfaults (time from the start of the steady load; dispatch gap = longest time with no attempt started, "
          f"fault to +{OBSERVE_SECONDS:.0f}s, goal <= 30 s):")
    for x in o.faults:
        print(f"  +{(x.at - t0).total_seconds():5.0f}s {x.name:24s} gap {f(x.gap, 1):>7s}  {x.note}")
    print(f"  pg_auto_failover events during the run: {len(monitor_events)} state changes "
          f"({sum(1 for e in monitor_events if 'wait_primary' in (e[2], e[3]))} touching wait_primary)")

    print("\nzeros:")
    zeros = {
        "runs lost": o.lost, "duplicate runs": o.duplicates, "stale results applied": o.stale,
        "audit violations": o.audit, "spike made_after_T": s.get("made_after_T", 1) if s else 1,
    }
    bad_web, web_counts, fault_503 = classify_web(web, o.faults)
    zeros["5xx outside faults or not 503"] = bad_web
    checked = [k for k in zeros if plan.strict_spike or k != "spike made_after_T"]
    for k, v in zeros.items():
        print(f"  {k:32s} {v}" + ("" if k in checked else "  (printed, not checked in this form: see --strict-spike)"))
    print(f"  (reconciled {ledger.expected:,} due instants against {ledger.runs:,} runs in "
          f"{'windows before their partitions were dropped'}, of them {ledger.superseded:,} canceled by an edit before "
          f"they started, whose instant the new version made again; {ledger.removed_before_check:,} of the runs read "
          f"ahead, finished, while a late instant held their window back, and removed by retention before it was "
          f"checked; unfinished after the drain {o.unfinished})")
    print(f"  runs kept at the end {counts['runs_kept']:,}: succeeded {counts['succeeded']:,}, dead {counts['dead']:,}, "
          f"skipped {counts['skipped']:,} (the noisy tenant's misfires), canceled {counts['canceled']:,} (superseded by edits); "
          f"attempts kept {counts['attempts_kept']:,}, unknown outcomes {counts['unknown']}, late results kept "
          f"{counts['late_results']}; target answered {target.counts()}")

    print("\nweb answers (gunicorn, 2 workers):")
    print(f"  {dict(web_counts)}; 503s during faults: {fault_503}")
    by_path = defaultdict(list)
    for _, kind, path, status, took in web.answers:
        if status in (200, 201):
            by_path[(kind, re.sub(r"[0-9a-f-]{36}", "{id}", path))].append(took)
    for (kind, path), xs in sorted(by_path.items()):
        print(f"  {kind:4s} {path:34s} n={len(xs):5d} p50 {C.percentile(xs, 50) * 1000:7.0f} ms  "
              f"p99 {C.percentile(xs, 99) * 1000:7.0f} ms  max {max(xs) * 1000:7.0f} ms")

    print("\ndisk (MiB) over time: database, runs tables, outbox, WAL; partitions of runs; removals so far")
    warm = min(600.0, plan.seconds / 5)
    for row in sampler.disk[:: max(1, len(sampler.disk) // 12)] + sampler.disk[-1:]:
        tt, db, runs, outbox, wal, parts, rem = row
        print(f"  +{tt:5.0f}s {db / 2**20:9.0f} {runs / 2**20:9.0f} {outbox / 2**20:9.0f} {wal / 2**20:7.0f} {parts:5d} {rem:6d}")
    first_window = plan.keep_partitions * plan.partition_seconds + 2 * plan.partition_seconds
    after = [r for r in sampler.disk if r[0] >= first_window]
    if after:
        base = after[0][2]
        top = max(r[2] for r in after)
        print(f"  runs tables after the first retention window (+{first_window}s): {base / 2**20:.0f} MiB, "
              f"largest after {top / 2**20:.0f} MiB ({(top / base - 1) * 100 if base else 0:+.0f}%; goal within 10%)")
        # The spike's runs stay while unfinished and for the retention after: a hump by design.
        # Before its look-ahead began, the tables held the steady load alone.
        calm = [r for r in after if r[0] < (mid - t0).total_seconds() - SPIKE_LEAD]
        if calm:
            high = max(r[2] for r in calm)
            print(f"  before the spike's look-ahead (to +{calm[-1][0]:.0f}s): largest {high / 2**20:.0f} MiB "
                  f"({(high / base - 1) * 100 if base else 0:+.0f}%); at the end {after[-1][2] / 2**20:.0f} MiB")

    print(f"\nRSS (MiB) per process: after warm-up (+{warm:.0f}s), largest, last; growth after warm-up (goal <= 10%); "
          "growth over the last third of the run (a rise that stopped, or one still going)")
    names = sorted({k for _, d in sampler.rss for k in d})
    # The series whole, for reading a rise against the run's events (bench/out/soak/rss.json).
    (ROOT / "bench" / "out" / "soak" / "rss.json").write_text(json.dumps(sampler.rss))
    third = (sampler.rss[-1][0] * 2 / 3) if sampler.rss else 0.0
    for name in names:
        series = [(tt, d[name]) for tt, d in sampler.rss if name in d]
        # From the process's own start: a restarted one warms up again.
        warm_v = next((v for tt, v in series if tt >= max(warm, series[0][0] + warm)), None)
        third_v = next((v for tt, v in series if tt >= max(third, series[0][0] + warm)), None)
        top = max(v for _, v in series)
        lastv = series[-1][1]
        growth = (lastv / warm_v - 1) * 100 if warm_v else None
        late = (lastv / third_v - 1) * 100 if third_v else None
        print(f"  {name:28s} {C.fmt(warm_v, '', 0):>6s} {top:6.0f} {lastv:6.0f}  {C.fmt(growth, '%', 1):>7s}"
              f"  {C.fmt(late, '%', 1):>7s}")

    switch = next((f.at for f in o.faults if f.name == "switchover"), None)
    windows = [("after warm-up", warm, float("inf"))]
    if switch is not None:
        windows.insert(0, ("steady", STATEMENTS_FROM, (switch - t0).total_seconds()))
    windows.insert(len(windows) - 1, ("the spike", mid.timestamp() - T0 - SPIKE_LEAD, spike_end - T0))
    print_cpu(sampler, windows)
    print_statements(o)

    errors = log_errors(logdir)
    print("\nprocess logs (bench/out/soak/): " + (", ".join(f"{k}: {v}" for k, v in errors.items()) or "no Traceback or ERROR line"))
    locks = lock_lines(logdir)
    print("  lock waits given up or broken, by log: " + (", ".join(f"{k}: {v}" for k, v in locks.items()) or "none")
          + f"; partition removals {counts.get('removals', 'n/a')}")
    for d in o.details[:30]:
        print("  " + d)
    ok = all(zeros[k] == 0 for k in checked)
    print(f"\nzeros {'all 0: OK' if ok else 'NOT all 0: FAILED'}")
    return 0 if ok else 1


def classify_web(web: WebLoad, faults: list) -> tuple[int, Counter, int]:
    """5xx answers: a 503 while a fault was on (until WEB_GRACE_SECONDS after it ended) is what the
    web tier promises; any other 5xx, or any 5xx outside the faults, counts."""
    counts = Counter()
    bad = fault_503 = 0
    windows = [(x.at.timestamp(), (x.until or x.at).timestamp() + WEB_GRACE_SECONDS) for x in faults if x.name != "spike"]
    for t, kind, path, status, took in web.answers:
        counts[f"{kind} {status}"] += 1
        if isinstance(status, int) and status >= 500:
            during = any(a <= t <= b for a, b in windows)
            if status == 503 and during:
                fault_503 += 1
            else:
                bad += 1
    return bad, counts, fault_503


def log_errors(logdir: Path) -> dict:
    out = {}
    for path in sorted(logdir.glob("*.log")):
        text = path.read_text(errors="replace")
        n = text.count("Traceback") + sum(1 for line in text.splitlines() if " ERROR " in line or line.startswith("ERROR"))
        if n:
            out[path.name] = n
    return out


LOCK_LINES = {"deadlock": "deadlock detected", "lock timeout": "lock timeout",
              "maintain gave way": "the tables were busy"}


def lock_lines(logdir: Path) -> dict:
    """Lines about locks per log: a deadlock (any process), a lock timeout, maintenance giving way
    (runs.partitions, "Lock order": it retries its step)."""
    out = {}
    for path in sorted(logdir.glob("*.log")):
        text = path.read_text(errors="replace")
        for label, needle in LOCK_LINES.items():
            n = text.count(needle)
            if n:
                out[f"{path.stem} {label}"] = n
    return out


if __name__ == "__main__":
    main()
