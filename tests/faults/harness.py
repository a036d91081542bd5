"""Fault injection with real processes: `scan`, `work` and `reconcile` subprocesses against one
PostgreSQL database and a local target, while this harness kills them (SIGKILL), terminates their
database sessions, and runs one worker with its clock skewed by minutes (libfaketime).

Afterwards, with everything quiet, it counts what happened and prints one line:

  kills=… runs=… lost=0 duplicate_runs=0 deliveries=… duplicate_deliveries=… unknown_attempts=…
  stale_results_applied=0 audit_violations=0

Definitions (docs/failure-model.md explains why these are the right ones):
- lost: an instant of a schedule's rule, up to where the scanners got, with no run; or a run that
  did not reach a terminal state once everything was quiet.
- duplicate_runs: two runs for one (schedule, instant).
- deliveries: requests that reached the target; duplicate_deliveries: requests for a run the
  target had already acted on. Each must be explained by an attempt whose outcome was unknown
  (the only case where the scheduler may not know the target acted), so it may not exceed them.
- stale_results_applied: a result event whose generation is not the run's current lease at that
  point of the run's event history (a fenced-off worker's result applied anyway).
"""

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FAKETIME_LIB = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
LEASE_SECONDS = 3


class ChaosTarget:
    """Records every delivery; sometimes stalls past the lease, answers 500, or drops the
    connection after acting."""

    def __init__(self, seed: int, stall_rate=0.05, error_rate=0.08, drop_rate=0.05, latency=(0.0, 0.0),
                 host="127.0.0.1", port=0):
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.deliveries = []  # (run_id, generation, idempotency_key, acted, behaviour)
        harness = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                with harness.lock:
                    roll = harness.rng.random()
                    pause = harness.rng.uniform(*latency) if latency[1] else 0.0
                if pause:
                    # Calls that take a while are what is in flight when a fault strikes.
                    time.sleep(pause)
                if roll < error_rate:
                    behaviour, acted = "500", False
                elif roll < error_rate + drop_rate:
                    behaviour, acted = "drop", True
                elif roll < error_rate + drop_rate + stall_rate:
                    behaviour, acted = "stall", True
                else:
                    behaviour, acted = "200", True
                with harness.lock:
                    harness.deliveries.append(
                        (self.headers.get("X-Scheduler-Run-Id"), int(self.headers.get("X-Scheduler-Generation") or 0),
                         self.headers.get("Idempotency-Key"), acted, behaviour)
                    )
                if behaviour == "drop":
                    # Acted, then the connection dies before any answer: the worker cannot know.
                    self.close_connection = True
                    try:
                        self.connection.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    return
                if behaviour == "stall":
                    time.sleep(LEASE_SECONDS + 1.5)
                status = 500 if behaviour == "500" else 200
                body = b'{"ok": %s}' % (b"false" if status == 500 else b"true")
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass

            def log_message(self, *args):
                pass

        class QuietServer(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                # Killed workers and dropped connections reset sockets by design here.
                pass

        self.server = QuietServer((host, port), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Proc:
    kind: str
    args: list
    env: dict
    popen: subprocess.Popen | None = None
    # Put before the command, e.g. ["ip", "netns", "exec", "worker1"] to run it on another host.
    prefix: list = field(default_factory=list)
    # Where its output goes (appended across restarts): the evidence when a loop dies or wedges.
    log_path: Path | None = None
    # The whole command line when it is not a manage.py command (gunicorn).
    argv: list | None = None
    starts: int = 0

    def start(self):
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        try:
            self.popen = subprocess.Popen(
                [*self.prefix, *(self.argv or [sys.executable, "manage.py", *self.args])], cwd=ROOT, env=self.env,
                stdout=out, stderr=subprocess.STDOUT if self.log_path else subprocess.DEVNULL,
            )
        finally:
            if self.log_path:
                out.close()
        self.starts += 1

    def alive(self):
        return self.popen is not None and self.popen.poll() is None


@dataclass
class Report:
    kills: int = 0
    session_kills: int = 0
    runs: int = 0
    lost: int = 0
    duplicate_runs: int = 0
    deliveries: int = 0
    duplicate_deliveries: int = 0
    unknown_attempts: int = 0
    stale_results_applied: int = 0
    audit_violations: int = 0
    dead: int = 0
    late_results: int = 0
    details: list = field(default_factory=list)

    def line(self) -> str:
        return (
            f"kills={self.kills + self.session_kills} runs={self.runs} lost={self.lost} "
            f"duplicate_runs={self.duplicate_runs} deliveries={self.deliveries} "
            f"duplicate_deliveries={self.duplicate_deliveries} unknown_attempts={self.unknown_attempts} "
            f"stale_results_applied={self.stale_results_applied} audit_violations={self.audit_violations}"
        )

    def ok(self) -> bool:
        return (
            self.lost == 0
            and self.duplicate_runs == 0
            and self.stale_results_applied == 0
            and self.audit_violations == 0
            and self.duplicate_deliveries <= self.unknown_attempts
        )


def db_clock():
    from scheduler_project.foundation.dbclock import db_now

    return db_now()


def database_url() -> str:
    from django.db import connection

    s = connection.settings_dict
    return f"postgres://{s['USER'] or 'postgres'}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def make_schedules(tenant, target_url, count: int, backlog_minutes: int):
    """`count` every-minute schedules whose last `backlog_minutes` occurrences are all due, all to
    run (catch_up with room), so the scanners have real work while they are being killed."""
    from runs.models import Run  # noqa: F401  (apps loaded)
    from scheduler_project.foundation.dbclock import db_now
    from schedules.models import Schedule
    from tests.helpers import make_schedule

    now = db_now().replace(microsecond=0, second=0)
    ids = []
    for i in range(count):
        s = make_schedule(
            tenant, f"{target_url}/job/{i}", expression="rate(1 minute)", misfire_policy="catch_up",
            catchup_limit=10_000, misfire_grace_seconds=86_400, max_attempts=25,
            backoff_base_seconds=0.2, backoff_max_seconds=1.0, target_timeout_seconds=LEASE_SECONDS + 10,
        )
        ids.append(s.id)
    start = now - timedelta(minutes=backlog_minutes)
    Schedule.objects.filter(id__in=ids).update(next_run_at=start, anchor_at=start)
    return ids


def run_chaos(*, duration: float, seed: int, schedules: int, backlog_minutes: int, workers: int = 3,
              scanners: int = 2, drain_timeout: float = 120.0, log=print) -> Report:
    """Set up, run the processes under chaos for `duration` seconds, let them drain, count."""
    from django.db import connection

    from schedules.tenants import create_tenant

    if not FAKETIME_LIB.exists():
        raise RuntimeError(f"{FAKETIME_LIB} is missing: apt-get install faketime (the skewed-clock worker needs it)")
    rng = random.Random(seed)
    target = ChaosTarget(seed)
    tenant = create_tenant("chaos", allow_targets=[target.url + "/"])
    schedule_ids = make_schedules(tenant, target.url, schedules, backlog_minutes)

    base_env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "scheduler_project.settings",
        "SCHEDULER_ALLOW_DEV_SECRET": "1",
        "SCHEDULER_LEASE_SECONDS": str(LEASE_SECONDS),
        "SCHEDULER_RECONCILE_SECONDS": "0.5",
        "SCHEDULER_POLL_SECONDS": "0.2",
        "SCHEDULER_SHUTDOWN_GRACE_SECONDS": "1",
        "SCHEDULER_TARGET_ALLOWED_NETWORKS": "127.0.0.0/8",
        "SCHEDULER_CLAIM_BATCH": "20",
        "LOG_LEVEL": "WARNING",
    }
    skewed_env = {**base_env, "LD_PRELOAD": str(FAKETIME_LIB), "FAKETIME": "-300", "DONT_FAKE_MONOTONIC": "1"}
    procs = [Proc("scan", ["scan", "--batch", "2"], base_env) for _ in range(scanners)]
    procs += [Proc("work", ["work", "--concurrency", "16", "--worker-id", f"w{i}"], base_env) for i in range(workers)]
    procs.append(Proc("work", ["work", "--concurrency", "8", "--worker-id", "w-skewed"], skewed_env))
    procs.append(Proc("reconcile", ["reconcile"], base_env))
    for p in procs:
        p.start()

    report = Report()
    bounds = {}
    deadline = time.monotonic() + duration
    try:
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(0.3, 0.9))
            action = rng.random()
            if action < 0.45:
                victim = rng.choice([p for p in procs if p.kind == "work"])
            elif action < 0.7:
                victim = rng.choice([p for p in procs if p.kind == "scan"])
            else:
                victim = None
            if victim is not None:
                if victim.alive():
                    victim.popen.send_signal(signal.SIGKILL)
                    victim.popen.wait()
                    report.kills += 1
                victim.start()
            else:
                with connection.cursor() as cur:
                    cur.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE application_name LIKE 'scheduler-%%' AND datname = current_database() "
                        "AND pid <> pg_backend_pid() ORDER BY random() LIMIT 1"
                    )
                    if cur.fetchone():
                        report.session_kills += 1
            for p in procs:  # a process that died of a terminated session comes back, as under systemd
                if not p.alive():
                    p.start()
        log(f"chaos over after {duration:.0f}s: {report.kills} SIGKILLs, {report.session_kills} sessions terminated; draining")
        bounds = quiet_down(procs, schedule_ids, timeout=drain_timeout)
    finally:
        for p in procs:
            if p.alive():
                p.popen.send_signal(signal.SIGTERM)
        for p in procs:
            if p.popen:
                try:
                    p.popen.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.popen.kill()
        target.close()

    count_outcome(report, schedule_ids=schedule_ids, bounds=bounds, deliveries=target.deliveries, log=log)
    return report


def quiet_down(procs, schedule_ids, *, timeout: float, restart: bool = True) -> dict:
    """Quiet down in two steps. First let the scanners catch up with the clock, then stop new
    occurrences (remembering how far each schedule got), then wait for every run to end.
    Returns each schedule's bound: every rule instant before it must have a run. With
    `restart`, a process that exited is started again, as a supervisor would."""
    from runs.models import Run
    from schedules.models import Schedule

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if restart:
            for p in procs:
                if not p.alive():
                    p.start()
        now = db_clock()
        if not Schedule.objects.filter(id__in=schedule_ids, next_run_at__lte=now).exists():
            break
        time.sleep(0.5)
    bounds = dict(Schedule.objects.filter(id__in=schedule_ids).values_list("id", "next_run_at"))
    Schedule.objects.filter(id__in=schedule_ids).update(enabled=False)
    while time.monotonic() < end:
        if restart:
            for p in procs:
                if not p.alive():
                    p.start()
        if not Run.objects.exclude(state__in=["succeeded", "dead", "canceled", "skipped"]).exists():
            break
        time.sleep(0.5)
    return bounds


def count_outcome(report: Report, *, schedule_ids, bounds: dict, deliveries, log=print) -> Report:
    """Count what happened once everything is quiet (the module docstring defines each figure).
    `deliveries` are the target's records: (run_id, generation, idempotency_key, acted, behaviour)."""
    from runs.models import Attempt, OutboxEvent, Run
    from schedules.models import Schedule
    from schedules.services import rule_for

    report.runs = Run.objects.count()
    unfinished = Run.objects.exclude(state__in=["succeeded", "dead", "canceled", "skipped"]).count()
    expected_missing = 0
    have = defaultdict(set)
    for sid, t in Run.objects.values_list("schedule_id", "scheduled_time"):
        have[sid].add(t)
    for s in Schedule.objects.filter(id__in=schedule_ids).select_related("current"):
        # Every instant from the first up to where the scanners had got must have a run.
        bound = bounds.get(s.id) or s.anchor_at
        rule = rule_for(s.current, s.anchor_at)
        for occ in rule.between(s.anchor_at, bound, 100_000):
            if occ.at not in have[s.id]:
                expected_missing += 1
    report.lost = expected_missing + unfinished
    if unfinished:
        report.details.append(f"{unfinished} runs not terminal after the drain")
    if expected_missing:
        report.details.append(f"{expected_missing} rule instants without a run")
    counts = Counter(Run.objects.values_list("schedule_id", "scheduled_time"))
    report.duplicate_runs = sum(n - 1 for n in counts.values() if n > 1)

    report.deliveries = len(deliveries)
    acted = Counter(d[0] for d in deliveries if d[3])
    report.duplicate_deliveries = sum(n - 1 for n in acted.values() if n > 1)
    keys_ok = all(d[0] == d[2] for d in deliveries)
    if not keys_ok:
        report.details.append("a delivery's Idempotency-Key differed from its run id")
        report.audit_violations += 1
    report.unknown_attempts = Attempt.objects.filter(outcome="unknown").count()
    _explain_unexplained_duplicates(report, acted, deliveries)
    report.late_results = Attempt.objects.filter(late_result__isnull=False).count()
    report.dead = Run.objects.filter(state="dead").count()

    # Result events must carry the generation currently leased at that point of the run's history.
    current = {}
    result_kinds = {"run.succeeded", "run.dead", "run.retry_scheduled", "run.lease_expired"}
    for run_id, kind, payload in OutboxEvent.objects.order_by("id").values_list("run_id", "kind", "payload").iterator():
        if kind == "run.leased":
            current[run_id] = payload.get("generation")
        elif kind in result_kinds and payload.get("generation") is not None:
            if payload["generation"] != current.get(run_id):
                report.stale_results_applied += 1

    report.audit_violations += count_audit_violations(log)
    return report



def _explain_unexplained_duplicates(report: Report, acted: Counter, deliveries, shown: int = 5) -> None:
    """A run delivered more often than its unknown attempts explain is a bug of the scheduler or of
    the harness: say which runs, with their attempts and deliveries, so a failure can be read."""
    from runs.models import Attempt

    repeated = {run_id: n - 1 for run_id, n in acted.items() if n > 1}
    if not repeated:
        return
    unknown = Counter(str(r) for r in Attempt.objects.filter(outcome="unknown", run_id__in=list(repeated))
                      .values_list("run_id", flat=True))
    unexplained = sorted(r for r, extra in repeated.items() if extra > unknown.get(r, 0))
    if not unexplained:
        return
    report.details.append(f"{len(unexplained)} runs delivered more often than their unknown attempts explain")
    for run_id in unexplained[:shown]:
        attempts = list(Attempt.objects.filter(run_id=run_id).order_by("id").values_list(
            "generation", "worker_id", "outcome", "error_class", "http_status", "late_result", "started_at",
            "finished_at"))
        calls = [(d[1], d[4]) for d in deliveries if d[0] == run_id]
        report.details.append(f"  run {run_id}: deliveries (generation, behaviour) {calls}; attempts {attempts}")


def count_audit_violations(log=print) -> int:
    """Every invariant of runs.md, checked by the same code as `manage.py audit`."""
    from dispatch.invariants import run_all

    errors = [v for v in run_all() if v.severity == "error"]
    for v in errors:
        log(f"audit: invariant {v.invariant} {v.check}: {v.message} ({v.count}) e.g. {v.ids[:5]}")
    return sum(max(1, v.count) for v in errors)
