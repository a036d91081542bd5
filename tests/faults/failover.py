"""The database fails over under load: a pg_auto_failover formation (tests/faults/pgcluster.py),
the scheduler's processes on its multi-host URL, and the primary SIGKILLed or switched over while
runs flow at a steady rate and a burst is in flight.

Nothing is restarted for the scheduler: every loop and gunicorn must find the new primary by
themselves (libpq's target_session_attrs=read-write, Django's connection health checks and the
loops' own recovery). A process that exits is counted (`exits`) and not brought back, and each
worker must start attempts again after every fault, so a loop that dies or wedges fails the suite.

Prints one line:

  failovers=… kills=… runs=… lost=0 duplicate_runs=0 stale_results_applied=0 audit_violations=0
  dispatch_gap_s=… committed_missing=0 exits=0 …

- failovers: primary changes (SIGKILLs and planned switchovers); kills: the SIGKILLed ones.
- dispatch_gap_s: the longest time with no attempt started, from a fault to the end of its
  observation window (the steady schedules make a run due every half second, so any longer gap is
  the outage). Measured on the database clock.
- committed_missing: rows committed on the old primary before a fault (runs, finished attempts,
  events) missing or changed on the new one. Synchronous replication promises none.
- web_errors: answers other than 200 from gunicorn (/readyz, /metrics) once the new primary has
  taken writes for WEB_GRACE_SECONDS.
The other figures are harness.py's.
"""

import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from scheduler_project.foundation.dbreplication import replication_status
from tests.faults.harness import ROOT, ChaosTarget, Proc, Report, count_outcome, make_schedules, quiet_down
from tests.faults.pgcluster import AutoFailoverCluster, free_port

LEASE_SECONDS = 3
STEADY_SCHEDULES = 120  # two due every second: anchors spread over the minute
WEB_GRACE_SECONDS = 5.0


@dataclass
class FailoverReport(Report):
    failovers: int = 0
    node_kills: int = 0
    switchovers: int = 0
    dispatch_gap_s: float = 0.0
    committed_missing: int = 0
    committed_checked: int = 0
    async_at_fault: int = 0  # faults that found the primary in wait_primary (not synchronous)
    # Promotions the monitor made that no fault asked for (a busy host can make a healthy primary
    # look dead): each is a failover the suite did not check for lost commits.
    unplanned_failovers: int = 0
    replication_before_fault: list = field(default_factory=list)  # dbreplication.ReplicationStatus
    replication_after_kill: list = field(default_factory=list)
    exits: int = 0
    web_errors: int = 0
    web_requests: int = 0
    promote_s: list = field(default_factory=list)
    gaps: list = field(default_factory=list)
    in_flight_at_fault: list = field(default_factory=list)
    stalled_loops: list = field(default_factory=list)
    windows: list = field(default_factory=list)  # (fault, new primary writable) per fault
    web_during_faults: Counter = field(default_factory=Counter)  # what gunicorn answered meanwhile
    metrics: dict = field(default_factory=dict)  # name -> (min, max, last) over the run, from /metrics

    def line(self) -> str:
        return (
            f"failovers={self.failovers} kills={self.node_kills} runs={self.runs} lost={self.lost} "
            f"duplicate_runs={self.duplicate_runs} stale_results_applied={self.stale_results_applied} "
            f"audit_violations={self.audit_violations} dispatch_gap_s={self.dispatch_gap_s:.1f} "
            f"committed_missing={self.committed_missing} exits={self.exits} web_errors={self.web_errors} "
            f"deliveries={self.deliveries} duplicate_deliveries={self.duplicate_deliveries} "
            f"unknown_attempts={self.unknown_attempts} async_at_fault={self.async_at_fault} "
            f"unplanned_failovers={self.unplanned_failovers}"
        )

    def ok(self, max_gap: float = 30.0) -> bool:
        return (
            super().ok()
            and self.committed_missing == 0
            and self.exits == 0
            and self.web_errors == 0
            and not self.stalled_loops
            and self.dispatch_gap_s <= max_gap
        )


@contextmanager
def use_database(url: str, application_name: str = "scheduler-faults-harness"):
    """Point this process's default connection at `url` (a multi-host URL) for the block."""
    from django.db import connections

    from scheduler_project.database_url import parse_database_url

    conn = connections["default"]
    saved = {**conn.settings_dict, "OPTIONS": dict(conn.settings_dict.get("OPTIONS", {}))}
    conn.close()
    entry = parse_database_url(url)
    conn.settings_dict.update(entry)
    conn.settings_dict["OPTIONS"] = {**entry["OPTIONS"], "application_name": application_name}
    conn.settings_dict["CONN_HEALTH_CHECKS"] = True
    try:
        yield
    finally:
        conn.close()
        conn.settings_dict.clear()
        conn.settings_dict.update(saved)


def retry_db(fn, *, timeout: float = 60.0):
    """Call `fn` until the database answers: this process's own connection breaks at every fault."""
    from django.db import close_old_connections, connection
    from django.db.utils import InterfaceError, OperationalError

    end = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except (OperationalError, InterfaceError):
            if time.monotonic() > end:
                raise
            connection.close()
            close_old_connections()
            time.sleep(0.3)


class WebProbe:
    """Asks gunicorn for /readyz and /metrics every quarter second and keeps every answer."""

    def __init__(self, base_url: str):
        self.base_url = base_url
        self.answers = []  # (wall time, path, status or exception name)
        self.metrics_max, self.metrics_min, self.metrics_last = {}, {}, {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self.thread.start()
        return self

    def _run(self):
        paths = ["/readyz", "/metrics"]
        i = 0
        while not self.stop.wait(0.25):
            path = paths[i % 2]
            i += 1
            try:
                with urllib.request.urlopen(self.base_url + path, timeout=10) as r:
                    status = r.status
                    if path == "/metrics":
                        self._read_metrics(r.read().decode())
            except urllib.error.HTTPError as e:
                status = e.code
            except Exception as e:
                status = type(e).__name__
            self.answers.append((time.time(), path, status))

    # What an operator would watch: the largest value each reached, and the last one.
    WATCHED = ("scheduler_oldest_overdue_seconds", "scheduler_start_lag_p99_seconds",
               "scheduler_lease_expirations_last_hour", "scheduler_unknown_attempts_last_day",
               "scheduler_fenced_results_total", "scheduler_workers", "scheduler_database_synchronous_standbys")

    def _read_metrics(self, text: str) -> None:
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name in self.WATCHED:
                v = float(value)
                self.metrics_max[name] = max(v, self.metrics_max.get(name, v))
                self.metrics_min[name] = min(v, self.metrics_min.get(name, v))
                self.metrics_last[name] = v

    def close(self):
        self.stop.set()
        self.thread.join(timeout=15)


def scheduler_env(url: str, **extra) -> dict:
    return {
        **os.environ,
        "DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": "scheduler_project.settings",
        "SCHEDULER_ALLOW_DEV_SECRET": "1",
        "SCHEDULER_LEASE_SECONDS": str(LEASE_SECONDS),
        "SCHEDULER_RECONCILE_SECONDS": "0.5",
        "SCHEDULER_POLL_SECONDS": "0.2",
        "SCHEDULER_SHUTDOWN_GRACE_SECONDS": "1",
        "SCHEDULER_TARGET_ALLOWED_NETWORKS": "127.0.0.0/8",
        "SCHEDULER_CLAIM_BATCH": "20",
        "LOG_LEVEL": "WARNING",
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


def make_steady_schedules(tenant, target_url: str, count: int) -> list:
    """`count` every-minute schedules whose instants are spread evenly over the minute, so runs
    come due all the time and a stall shows as a gap."""
    from scheduler_project.foundation.dbclock import db_now
    from schedules.models import Schedule
    from tests.helpers import make_schedule

    base = db_now().replace(microsecond=0) + timedelta(seconds=2)
    ids = []
    for i in range(count):
        s = make_schedule(
            tenant, f"{target_url}/steady/{i}", expression="rate(1 minute)", misfire_policy="catch_up",
            catchup_limit=10_000, misfire_grace_seconds=86_400, max_attempts=25,
            backoff_base_seconds=0.2, backoff_max_seconds=1.0, target_timeout_seconds=LEASE_SECONDS + 10,
        )
        at = base + timedelta(seconds=(i * 60 // count))
        Schedule.objects.filter(id=s.id).update(next_run_at=at, anchor_at=at)
        ids.append(s.id)
    return ids


def snapshot(dsn: str) -> dict:
    """What the primary has committed: runs and their states, finished attempts and their
    outcomes, and the outbox up to its newest event."""
    import psycopg

    from runs.models import Attempt, OutboxEvent, Run

    with psycopg.connect(dsn, autocommit=True, connect_timeout=3) as c:
        # One snapshot for the three reads (REPEATABLE READ): what they show was committed
        # together before this instant.
        c.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        runs = dict(c.execute(f"SELECT id, state FROM {Run._meta.db_table}").fetchall())
        attempts = dict(c.execute(
            f"SELECT id, outcome FROM {Attempt._meta.db_table} WHERE outcome IS NOT NULL").fetchall())
        last_event, events = c.execute(f"SELECT coalesce(max(id), 0), count(*) FROM {OutboxEvent._meta.db_table}").fetchone()
        c.execute("COMMIT")
    return {"runs": runs, "attempts": attempts, "last_event": last_event, "events": events}


TERMINAL = {"succeeded", "dead", "canceled", "skipped"}


def missing_after(before: dict, dsn: str) -> tuple[int, list]:
    """Rows of `before` that the new primary lacks or has gone back on."""
    import psycopg

    from runs.models import Attempt, OutboxEvent, Run

    with psycopg.connect(dsn, autocommit=True, connect_timeout=3) as c:
        runs = dict(c.execute(f"SELECT id, state FROM {Run._meta.db_table} WHERE id = ANY(%s)",
                              [list(before["runs"])]).fetchall())
        attempts = dict(c.execute(f"SELECT id, outcome FROM {Attempt._meta.db_table} WHERE id = ANY(%s)",
                                  [list(before["attempts"])]).fetchall())
        events = c.execute(f"SELECT count(*) FROM {OutboxEvent._meta.db_table} WHERE id <= %s",
                           [before["last_event"]]).fetchone()[0]
    problems = []
    gone = [r for r in before["runs"] if r not in runs]
    if gone:
        problems.append(f"{len(gone)} runs committed before the fault are missing, e.g. {gone[:3]}")
    # Without manual retries in this suite, a terminal run stays exactly as it was.
    reverted = [r for r, st in before["runs"].items() if st in TERMINAL and runs.get(r, st) != st]
    if reverted:
        problems.append(f"{len(reverted)} terminal runs changed state, e.g. {reverted[:3]}")
    changed = [a for a, o in before["attempts"].items() if attempts.get(a) != o]
    if changed:
        problems.append(f"{len(changed)} finished attempts missing or changed, e.g. {changed[:3]}")
    # Events are never deleted inside the retention window, so every one must still be there.
    if events < before["events"]:
        problems.append(f"{before['events'] - events} outbox events missing")
    return len(gone) + len(reverted) + len(changed) + max(0, before["events"] - events), problems


def attempt_starts(since: datetime, until: datetime) -> list[datetime]:
    from runs.models import Attempt

    return list(Attempt.objects.filter(started_at__gte=since, started_at__lte=until)
                .order_by("started_at").values_list("started_at", flat=True))


def longest_gap(starts: list[datetime], fault_at: datetime, until: datetime) -> float:
    """The longest stretch with no attempt started, counted from the fault to `until`."""
    points = [fault_at, *[s for s in starts if s > fault_at], until]
    before = [s for s in starts if s <= fault_at]
    if before:
        points[0] = before[-1]  # the stretch that the fault interrupted counts whole
    return max((b - a).total_seconds() for a, b in zip(points, points[1:]))


def _tail(path: Path, lines: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def run_failover(*, faults: list[str], seed: int = 7, observe: float = 12.0, burst_schedules: int = 40,
                 burst_minutes: int = 20, workers: int = 2, log=print, cluster: AutoFailoverCluster | None = None,
                 logdir: Path | None = None) -> FailoverReport:
    """Bring up a formation (unless given one), the scheduler on it, then for each fault in
    `faults` ("kill" or "switchover"): a burst, the fault, the promotion, the old primary back as
    a standby, and `observe` seconds of the scheduler going on. Then drain and count."""
    from schedules.tenants import create_tenant

    rng = random.Random(seed)
    own_cluster = cluster is None
    cluster = cluster or AutoFailoverCluster()
    report = FailoverReport()
    target = procs = probe = None
    keep = bool(os.environ.get("FAULTS_KEEP_LOGS"))
    logdir = logdir or (Path(tempfile.mkdtemp(prefix="sched-failover-")) if keep else cluster.root / "logs")
    logdir.mkdir(parents=True, exist_ok=True)
    try:
        if own_cluster:
            t0 = time.monotonic()
            cluster.start()
            log(f"pg_auto_failover formation up in {time.monotonic() - t0:.1f}s: {cluster.url()}")
        url = cluster.url()
        formed_at = datetime.now(timezone.utc)  # promotions from here on are the faults'
        env = scheduler_env(url)
        subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)

        # Calls take up to half a second, so a fault always finds some in flight.
        target = ChaosTarget(seed, stall_rate=0.02, error_rate=0.05, drop_rate=0.02, latency=(0.05, 0.5))
        with use_database(url):
            tenant = retry_db(lambda: create_tenant("failover", allow_targets=[target.url + "/"]))
            schedule_ids = make_steady_schedules(tenant, target.url, STEADY_SCHEDULES)

            web_port = free_port()
            procs = [Proc("scan", ["scan"], env, log_path=logdir / "scan.log")]
            procs += [Proc("work", ["work", "--concurrency", "16", "--worker-id", f"w{i}"], env,
                           log_path=logdir / f"work-w{i}.log") for i in range(workers)]
            procs.append(Proc("reconcile", ["reconcile"], env, log_path=logdir / "reconcile.log"))
            procs.append(Proc("web", [], env, log_path=logdir / "web.log", argv=[
                sys.executable, "-m", "gunicorn", "scheduler_project.wsgi", "-b", f"127.0.0.1:{web_port}",
                "-w", "2", "--timeout", "60", "--graceful-timeout", "2"]))
            for p in procs:
                p.start()
            _wait_flowing(workers, timeout=60)
            _wait_answering(f"http://127.0.0.1:{web_port}/readyz", timeout=60)
            probe = WebProbe(f"http://127.0.0.1:{web_port}").start()

            for n, fault in enumerate(faults):
                schedule_ids += retry_db(lambda: make_schedules(tenant, target.url, burst_schedules, burst_minutes))
                # Let the scanner make the burst and the workers start on it; a burst that
                # nothing picks up within 20 s is itself a stall, and shows as 0 in flight.
                waited = _wait_in_flight(20.0)
                time.sleep(rng.uniform(0.0, 1.0))
                if waited > 5:
                    log(f"fault {n}: the burst took {waited:.1f}s to be in flight")
                _fault(cluster, fault, report, log, n, observe)
                report.failovers += 1

            probe.close()
            _count_promotions(cluster, report, since=formed_at)
            # A process that exited has failed the suite already; it is started again only so
            # that the drain can finish and the rest can still be counted.
            report.exits = sum(1 for p in procs if not p.alive())
            for p in procs:
                if not p.alive():
                    report.details.append(f"{p.kind} {p.args} exited {p.popen.returncode}:\n{_tail(p.log_path)}")
            log("faults over; draining")
            bounds = retry_db(lambda: quiet_down(procs, schedule_ids, timeout=120, restart=True))
            _count_web(report, probe)
            report.dispatch_gap_s = max(report.gaps, default=0.0)
            count_outcome(report, schedule_ids=schedule_ids, bounds=bounds, deliveries=target.deliveries, log=log)
    finally:
        if probe:
            probe.close()
        for p in procs or []:
            if p.alive():
                p.popen.send_signal(signal.SIGTERM)
        for p in procs or []:
            if p.popen:
                try:
                    p.popen.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.popen.kill()
        if target:
            target.close()
        if own_cluster:
            cluster.stop()
        if keep:
            log(f"logs kept in {logdir}")
    return report


def _wait_in_flight(timeout: float, at_least: int = 5) -> float:
    from runs.models import Run

    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if retry_db(lambda: Run.objects.filter(state="leased").count()) >= at_least:
            break
        time.sleep(0.05)
    return time.monotonic() - started


def _wait_answering(url: str, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} never answered 200")


def _wait_flowing(workers: int, timeout: float) -> None:
    """Until every worker has started attempts: the steady flow is on."""
    from runs.models import Attempt

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if Attempt.objects.values("worker_id").distinct().count() >= workers:
            return
        time.sleep(0.2)
    raise TimeoutError("the scheduler never started: no attempts from every worker")


def _fault(cluster: AutoFailoverCluster, fault: str, report: FailoverReport, log, n: int, observe: float) -> None:
    # The promise holds with synchronous replication: inject the fault only once commits wait
    # for the standby again (a busy host makes pg_auto_failover turn it off for a while).
    waited = cluster.wait_synchronous(120, "synchronous replication before the fault")
    if waited > 1:
        log(f"fault {n}: waited {waited:.1f}s for synchronous replication")
    # Runs in flight when the fault comes (CI once found none at the first fault): at once when
    # there are, else up to 20 s.
    _wait_in_flight(20.0)
    checked_at = datetime.now(timezone.utc)
    report.replication_before_fault.append(retry_db(replication_status))
    old = cluster.primary()
    new = next(node for node in cluster.nodes if node is not old)
    before = snapshot(cluster.node_url(old))
    in_flight = len([s for s in before["runs"].values() if s == "leased"])
    report.in_flight_at_fault.append(in_flight)
    fault_at = datetime.now(timezone.utc)
    t0 = time.monotonic()
    if fault == "kill":
        cluster.kill(old)
        report.node_kills += 1
        promoted = cluster.wait(lambda: cluster.writable(new), 120, "the standby's promotion")
        # The old primary is dead: the new one takes writes with no standby, which an operator
        # must be able to see (/metrics, the dashboard) until the old one rejoins.
        report.replication_after_kill.append(retry_db(replication_status))
        cluster.restart(old)
    elif fault == "switchover":
        switch = cluster.switchover()
        report.switchovers += 1
        promoted = cluster.wait(lambda: cluster.writable(new), 120, "the switchover")
        switch.wait(timeout=120)
    else:
        raise ValueError(fault)
    report.promote_s.append(promoted)
    # Did the old primary leave synchronous replication between the check and the promotion (a
    # switchover takes seconds, and its writes go on until it drains)? Then the promise's
    # precondition did not hold for this fault, and the report says so.
    promoted_at = fault_at + timedelta(seconds=promoted)
    async_changes = [c for c in cluster.state_changes(checked_at - timedelta(seconds=1))
                     if c[0] <= promoted_at and c[1] == old.name and "wait_primary" in (c[2], c[3])]
    if async_changes:
        report.async_at_fault += 1
        report.details.append(f"fault {n} ({fault}): the primary left synchronous replication just before "
                              f"the fault: {async_changes}")
    report.committed_checked += len(before["runs"])
    missing, problems = missing_after(before, cluster.node_url(new))
    report.committed_missing += missing
    report.details += [f"fault {n} ({fault}): {p}" for p in problems]
    # Synchronous replication again before the next fault (or the drain).
    settled = cluster.wait_settled(120, "the old primary to rejoin as standby")
    writable_at = fault_at + timedelta(seconds=promoted)
    report.windows.append((fault_at, writable_at))
    time.sleep(max(0.0, observe - (time.monotonic() - t0 - promoted)))
    until = datetime.now(timezone.utc)
    starts = retry_db(lambda: attempt_starts(fault_at - timedelta(seconds=10), until))
    gap = longest_gap(starts, fault_at, until)
    report.gaps.append(gap)
    stalled = _stalled_loops(writable_at, until)
    report.stalled_loops += [f"fault {n}: {s}" for s in stalled]
    log(f"fault {n} ({fault}): {in_flight} runs in flight, promoted after {promoted:.1f}s, "
        f"standby back after {settled:.1f}s more, longest gap {gap:.1f}s"
        + (f", stalled: {stalled}" if stalled else ""))


def _count_promotions(cluster: AutoFailoverCluster, report: FailoverReport, *, since: datetime) -> None:
    """The monitor's promotions (a node's goal set to prepare_promotion; the node then reports it
    reached it, the same goal again) against the faults injected."""
    promotions = retry_db(lambda: [c for c in cluster.state_changes(since)
                                   if c[3] == "prepare_promotion" and c[2] != "prepare_promotion"])
    report.unplanned_failovers = max(0, len(promotions) - report.failovers)
    if report.unplanned_failovers:
        report.details += [f"the monitor promoted {c[1]} at {c[0]:%H:%M:%S.%f}" for c in promotions]
        report.details += [f"monitor: {c[0]:%H:%M:%S.%f} {c[1]} {c[2]} -> {c[3]}: {c[4][:120]}"
                           for c in retry_db(lambda: cluster.state_changes(since))
                           if "unhealthy" in c[4] or c[3] in ("wait_primary", "prepare_promotion")]


def _stalled_loops(since: datetime, until: datetime) -> list[str]:
    """Each loop has done its job since the new primary took writes: every worker started
    attempts, the scanner made runs (it makes them up to its horizon ahead, so the workers alone
    would hide a dead scanner for that long), the reconciler left no lease long expired."""
    from runs.models import Attempt, Run
    from scheduler_project.foundation.dbclock import db_now

    seen = set(retry_db(lambda: list(Attempt.objects.filter(started_at__gt=since, started_at__lte=until)
                                     .values_list("worker_id", flat=True).distinct())))
    expected = set(retry_db(lambda: list(Attempt.objects.values_list("worker_id", flat=True).distinct())))
    out = [f"worker {w} started nothing after the new primary took writes" for w in sorted(expected - seen)]
    if not retry_db(lambda: Run.objects.filter(created_at__gt=since + timedelta(seconds=1)).exists()):
        out.append("the scanner made no run after the new primary took writes")
    now = retry_db(db_now)
    expired = retry_db(lambda: Run.objects.filter(state="leased", lease_until__lt=now - timedelta(seconds=5)).count())
    if expired:
        out.append(f"the reconciler left {expired} leases expired for over 5 s")
    return out


def _count_web(report: FailoverReport, probe: WebProbe) -> None:
    report.web_requests = len(probe.answers)
    report.metrics = {name: (probe.metrics_min.get(name), probe.metrics_max.get(name), probe.metrics_last.get(name))
                      for name in probe.WATCHED}
    for t, path, status in probe.answers:
        if status == 200:
            continue
        at = datetime.fromtimestamp(t, timezone.utc)
        # During a fault's outage the web may answer 503 (readyz) or fail; after the grace it may not.
        if any(start <= at <= writable + timedelta(seconds=WEB_GRACE_SECONDS) for start, writable in report.windows):
            report.web_during_faults[f"{path} {status}"] += 1
            continue
        report.web_errors += 1
        if report.web_errors <= 5:
            report.details.append(f"web: {path} answered {status} at {at:%H:%M:%S.%f}")
