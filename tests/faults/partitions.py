"""Hosts on a network (tests/faults/netns.py): the database, the scanner, the reconciler, three
workers (one with its clock 5 minutes slow, libfaketime), the web server and the target, each in a
network namespace of its own, while links between them fail:

- db_cut: a worker's link to the database cut while it has calls in flight, for twice the lease,
  then healed. Its leases expire meanwhile: the reconciler marks those attempts `unknown` and
  another worker calls again with the same Idempotency-Key; when the link heals, the cut worker's
  results arrive fenced and are kept as late evidence.
- target_cut: a worker cut off from the target for longer than a call's time limit: its calls
  time out (failed if nothing was sent, unknown if the request went out) and are retried.
- degrade: latency and loss on a worker's database link (80 ± 20 ms one way, 5 % loss each way).
- the skewed worker runs throughout: its leases and attempt times must still be the database's.

Nothing is restarted: the processes must ride every fault out. Afterwards it counts like
harness.py and checks the evidence in the database and in the target's own log. Prints:

  partitions=… kills=… runs=… lost=0 duplicate_runs=0 stale_results_applied=0 audit_violations=0
  dispatch_gap_s=… unknown_retried_same_key=… late_results_kept=… …
"""

import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from tests.faults.failover import _tail, longest_gap, make_steady_schedules, retry_db, scheduler_env, use_database
from tests.faults.harness import FAKETIME_LIB, ROOT, Proc, Report, count_outcome, make_schedules, quiet_down
from tests.faults.netns import Network
from tests.faults.pgcluster import pg_bindir
from tests.faults.target_host import read_log

LEASE_SECONDS = 3
CALL_TIMEOUT_SECONDS = 4  # above the target's normal answers (<= 0.5 s), below a long cut
SKEW_SECONDS = -300


@dataclass
class PartitionReport(Report):
    partitions: int = 0
    db_cuts: int = 0
    target_cuts: int = 0
    degradations: int = 0
    dispatch_gap_s: float = 0.0
    exits: int = 0
    web_errors: int = 0
    web_requests: int = 0
    unknown_retried_same_key: int = 0
    late_results_kept: int = 0
    cut_worker_unknown: int = 0
    target_cut_failures: int = 0
    degraded_attempts: int = 0
    skewed_attempts: int = 0
    skew_max_s: float = 0.0
    problems: list = field(default_factory=list)
    timeline: list = field(default_factory=list)

    def line(self) -> str:
        return (
            f"partitions={self.partitions} kills={self.kills} runs={self.runs} lost={self.lost} "
            f"duplicate_runs={self.duplicate_runs} stale_results_applied={self.stale_results_applied} "
            f"audit_violations={self.audit_violations} dispatch_gap_s={self.dispatch_gap_s:.1f} "
            f"unknown_retried_same_key={self.unknown_retried_same_key} late_results_kept={self.late_results_kept} "
            f"exits={self.exits} web_errors={self.web_errors} deliveries={self.deliveries} "
            f"duplicate_deliveries={self.duplicate_deliveries} unknown_attempts={self.unknown_attempts}"
        )


    def ok(self) -> bool:
        evidence = (
            (not self.db_cuts or (self.cut_worker_unknown > 0 and self.late_results_kept > 0
                                  and self.unknown_retried_same_key > 0))
            and (not self.target_cuts or self.target_cut_failures > 0)
            and (not self.degradations or self.degraded_attempts > 0)
            and self.skewed_attempts > 0 and self.skew_max_s < LEASE_SECONDS + 2
        )
        return (super().ok() and evidence and not self.problems and self.exits == 0 and self.web_errors == 0
                and self.dispatch_gap_s <= 30.0)


class StandalonePostgres:
    """One PostgreSQL inside the database host's namespace, listening on its address only."""

    def __init__(self, host, network: Network):
        self.host = host
        self.dir = Path(tempfile.mkdtemp(prefix="sched-netdb-"))
        self.data = self.dir / "data"
        self.bindir = pg_bindir() if _has_pgaf() else _any_bindir()
        self.popen = None
        self.network = network

    def start(self, dbname: str = "scheduler") -> str:
        import pwd

        import psycopg

        pw = pwd.getpwnam("postgres")
        os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        sh_user = ["runuser", "-u", "postgres", "--"]
        subprocess.run([*sh_user, str(self.bindir / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
                        "--no-sync", "-E", "UTF8"], check=True, capture_output=True)
        with open(self.data / "postgresql.conf", "a") as f:
            f.write(f"listen_addresses = '{self.host.addr}'\nport = 5432\nunix_socket_directories = '{self.dir}'\n"
                    "max_connections = 200\nshared_buffers = 128MB\n")
        with open(self.data / "pg_hba.conf", "a") as f:
            f.write(f"host all all {self.network.prefix}.0/24 trust\n")
        self.log = self.dir / "postgres.log"
        out = open(self.log, "ab")
        self.popen = subprocess.Popen([*self.host.exec_prefix(), *sh_user, str(self.bindir / "postgres"), "-D", str(self.data)],
                                      stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        end = time.monotonic() + 60
        while True:
            try:
                with psycopg.connect(host=self.host.addr, user="postgres", dbname="postgres", autocommit=True,
                                     connect_timeout=2) as c:
                    c.execute(f'CREATE DATABASE "{dbname}"')
                break
            except psycopg.OperationalError:
                if time.monotonic() > end:
                    raise
                time.sleep(0.2)
        return f"postgres://postgres@{self.host.addr}:5432/{dbname}"

    def stop(self) -> None:
        if self.popen and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGINT)  # fast shutdown
            try:
                self.popen.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()
        import shutil

        shutil.rmtree(self.dir, ignore_errors=True)


def _has_pgaf() -> bool:
    import glob

    return bool(glob.glob("/usr/lib/postgresql/*/lib/pgautofailover.so"))


def _any_bindir() -> Path:
    import glob

    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), reverse=True)
    if not found:
        raise RuntimeError("no PostgreSQL server binaries under /usr/lib/postgresql")
    return Path(found[0]).parent


def run_partitions(*, faults: list[str], seed: int = 7, backlog_schedules: int = 30, backlog_minutes: int = 15,
                   burst_schedules: int = 20, recover: float = 4.0, log=print) -> PartitionReport:
    from django.test import override_settings

    from runs.models import Attempt, Run
    from schedules.models import ScheduleVersion
    from schedules.tenants import create_tenant

    if not FAKETIME_LIB.exists():
        raise RuntimeError(f"{FAKETIME_LIB} is missing: apt-get install faketime")
    rng = random.Random(seed)
    report = PartitionReport()
    net = Network()
    db = procs = target_proc = None
    logdir = Path(tempfile.mkdtemp(prefix="sched-partitions-"))
    windows = []  # (kind, host name, start, end)
    try:
        net.start()
        hosts = {name: net.add_host(name) for name in
                 ("db", "scan", "reconcile", "w1", "w2", "wskew", "web", "target")}
        db = StandalonePostgres(hosts["db"], net)
        url = db.start()
        networks = f"{net.prefix}.0/24"
        env = scheduler_env(url, SCHEDULER_TARGET_ALLOWED_NETWORKS=networks,
                            ALLOWED_HOSTS=f"{hosts['web'].addr},127.0.0.1,localhost")
        subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)

        target_url = f"http://{hosts['target'].addr}:8080"
        target_log = logdir / "target.jsonl"
        out = open(logdir / "target.out", "ab")
        target_proc = subprocess.Popen(
            [*hosts["target"].exec_prefix(), sys.executable, "-m", "tests.faults.target_host",
             "--host", hosts["target"].addr, "--port", "8080", "--log", str(target_log), "--seed", str(seed)],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        out.close()

        with use_database(url), override_settings(SCHEDULER_TARGET_ALLOWED_NETWORKS=[networks]):
            tenant = create_tenant("partitions", allow_targets=[target_url + "/"])
            schedule_ids = make_steady_schedules(tenant, target_url, 120)
            schedule_ids += make_schedules(tenant, target_url, backlog_schedules, backlog_minutes)
            # A call time limit that a target cut outlasts (the versions are written once, here).
            ScheduleVersion.objects.filter(schedule_id__in=schedule_ids).update(
                target_timeout_seconds=CALL_TIMEOUT_SECONDS)

            skewed = {**env, "LD_PRELOAD": str(FAKETIME_LIB), "FAKETIME": str(SKEW_SECONDS), "DONT_FAKE_MONOTONIC": "1"}

            def proc(host, kind, args, penv=env, argv=None):
                return Proc(kind, args, penv, prefix=hosts[host].exec_prefix(), log_path=logdir / f"{host}.log",
                            argv=argv)

            procs = [
                proc("scan", "scan", ["scan"]),
                proc("reconcile", "reconcile", ["reconcile"]),
                proc("w1", "work", ["work", "--concurrency", "16", "--worker-id", "w1"]),
                proc("w2", "work", ["work", "--concurrency", "16", "--worker-id", "w2"]),
                proc("wskew", "work", ["work", "--concurrency", "8", "--worker-id", "wskew"], skewed),
                proc("web", "web", [], argv=[sys.executable, "-m", "gunicorn", "scheduler_project.wsgi",
                                             "-b", f"{hosts['web'].addr}:8000", "-w", "2", "--timeout", "60"]),
            ]
            for p in procs:
                p.start()
            web_url = f"http://{hosts['web'].addr}:8000/readyz"
            _wait_attempts({"w1", "w2", "wskew"}, timeout=60)
            chaos_started = datetime.now(timezone.utc)

            for n, fault in enumerate(faults):
                # A small burst before each fault, so the victim has calls in flight when it
                # strikes (the steady flow alone keeps well under one call per worker in flight).
                burst = make_schedules(tenant, target_url, burst_schedules, 5)
                ScheduleVersion.objects.filter(schedule_id__in=burst).update(target_timeout_seconds=CALL_TIMEOUT_SECONDS)
                schedule_ids += burst
                worker = rng.choice(["w1", "w2"])
                _wait_leases(worker, timeout=15)
                host = hosts[worker]
                start = datetime.now(timezone.utc)
                if fault == "db_cut":
                    leased = retry_db(lambda: set(Run.objects.filter(state="leased", lease_owner=worker)
                                                  .values_list("id", flat=True)))
                    net.cut(host, hosts["db"])
                    hold = rng.uniform(2.0, 3.0) * LEASE_SECONDS
                    time.sleep(hold)
                    net.heal(host, hosts["db"])
                    report.db_cuts += 1
                    log(f"partition {n}: {worker} cut from the database for {hold:.1f}s with {len(leased)} runs leased")
                elif fault == "target_cut":
                    net.cut(host, hosts["target"])
                    hold = CALL_TIMEOUT_SECONDS + rng.uniform(2.0, 4.0)
                    time.sleep(hold)
                    net.heal(host, hosts["target"])
                    report.target_cuts += 1
                    log(f"partition {n}: {worker} cut from the target for {hold:.1f}s")
                elif fault == "degrade":
                    net.degrade(host, hosts["db"], delay_ms=80, jitter_ms=20, loss=0.05,
                                log=logdir / f"nfdelay-{worker}.log")
                    hold = rng.uniform(6.0, 9.0)
                    time.sleep(hold)
                    net.restore(host, hosts["db"])
                    report.degradations += 1
                    log(f"partition {n}: {worker}'s database link at +80±20 ms and 5% loss for {hold:.1f}s")
                else:
                    raise ValueError(fault)
                report.partitions += 1
                windows.append((fault, worker, start, datetime.now(timezone.utc)))
                report.web_requests += 1
                if not _web_ok(web_url):
                    report.web_errors += 1
                    report.details.append(f"web did not answer 200 after partition {n}")
                time.sleep(recover)
            chaos_ended = datetime.now(timezone.utc)

            report.exits = sum(1 for p in procs if not p.alive())
            for p in procs:
                if not p.alive():
                    report.details.append(f"{p.kind} {p.args} exited {p.popen.returncode}:\n{_tail(p.log_path)}")
            log("partitions over; draining")
            bounds = quiet_down(procs, schedule_ids, timeout=120, restart=True)
            target_proc.send_signal(signal.SIGTERM)
            target_proc.wait(timeout=15)
            deliveries = read_log(target_log)
            count_outcome(report, schedule_ids=schedule_ids, bounds=bounds,
                          deliveries=[(d["run"], d["generation"], d["key"], d["acted"], d["behaviour"]) for d in deliveries],
                          log=log)
            starts = list(Attempt.objects.filter(started_at__gte=chaos_started, started_at__lte=chaos_ended)
                          .order_by("started_at").values_list("started_at", flat=True))
            report.dispatch_gap_s = longest_gap(starts, chaos_started, chaos_ended)
            _evidence(report, windows, deliveries)
    finally:
        for p in procs or []:
            if p.alive():
                p.popen.send_signal(signal.SIGTERM)
        for p in procs or []:
            if p.popen:
                try:
                    p.popen.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.popen.kill()
        if target_proc and target_proc.poll() is None:
            target_proc.kill()
        if db:
            db.stop()
        net.teardown()
        if os.environ.get("FAULTS_KEEP_LOGS"):
            log(f"logs kept in {logdir}")
        else:
            import shutil

            shutil.rmtree(logdir, ignore_errors=True)
    return report


def _wait_attempts(workers: set, timeout: float) -> None:
    from runs.models import Attempt

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if workers <= set(Attempt.objects.values_list("worker_id", flat=True).distinct()):
            return
        time.sleep(0.2)
    raise TimeoutError(f"not every worker of {workers} started attempts")


def _wait_leases(worker: str, timeout: float) -> None:
    from runs.models import Run

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if Run.objects.filter(state="leased", lease_owner=worker).exists():
            return
        time.sleep(0.05)


def _web_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status == 200
    except Exception:
        return False


def _evidence(report: PartitionReport, windows: list, deliveries: list) -> None:
    """What each fault must have left in the database and in the target's log."""
    from django.db.models import Count

    from runs.models import Attempt

    by_run = defaultdict(list)
    for d in deliveries:
        by_run[d["run"]].append(d)

    # Unknown outcomes retried with the same key: an unknown attempt, a later generation of the
    # same run, and the target saw both generations carry the run id as Idempotency-Key.
    unknown = Attempt.objects.filter(outcome="unknown").values_list("run_id", "generation", "worker_id")
    for run_id, generation, worker in unknown:
        seen = by_run.get(str(run_id), [])
        later = [d for d in seen if d["generation"] > generation]
        if later and all(d["key"] == str(run_id) for d in seen):
            report.unknown_retried_same_key += 1

    for kind, worker, start, end in windows:
        attempts = Attempt.objects.filter(worker_id=worker, started_at__lte=end,
                                          started_at__gte=start - timedelta(seconds=LEASE_SECONDS + 5))
        if kind == "db_cut":
            # Leases that ran out while the worker could not reach the database.
            lost_leases = attempts.filter(outcome="unknown", started_at__lte=end)
            report.cut_worker_unknown += lost_leases.count()
            report.late_results_kept += attempts.filter(late_result__isnull=False).count()
            if not lost_leases.exists():
                report.problems.append(f"db_cut of {worker} at {start:%H:%M:%S}: no lease of it expired")
        elif kind == "target_cut":
            # The calls the cut broke: those in flight when it struck (the burst before each fault
            # is there to make some) and those started during it; not the leases an earlier
            # database cut let expire (LeaseExpired), which may be recorded in this window too.
            failed = (attempts.filter(outcome__in=["failed", "unknown"], finished_at__gte=start,
                                      finished_at__lte=end + timedelta(seconds=CALL_TIMEOUT_SECONDS + 5))
                      .exclude(error_class="LeaseExpired").count())
            report.target_cut_failures += failed
            if not failed:
                report.problems.append(f"target_cut of {worker} at {start:%H:%M:%S}: no call of it failed")
        elif kind == "degrade":
            n = Attempt.objects.filter(worker_id=worker, started_at__gte=start, started_at__lte=end).count()
            report.degraded_attempts += n
            if not n:
                report.problems.append(f"degraded link of {worker} at {start:%H:%M:%S}: it started nothing")
    # Who worked when: the first thing to read when a fault left no evidence.
    for kind, worker, start, end in windows:
        counts = dict(Attempt.objects.filter(started_at__gte=start, started_at__lte=end + timedelta(seconds=4))
                      .values_list("worker_id").annotate(n=Count("id")).values_list("worker_id", "n"))
        report.timeline.append(f"{kind} of {worker} {start:%H:%M:%S}-{end:%H:%M:%S}: attempts started {counts}")
    if report.db_cuts and not report.late_results_kept:
        report.problems.append("no cut worker's late result was kept as evidence")

    # The skewed worker's attempts carry the database's time: the target saw each call within
    # moments of its recorded start, though the worker's own clock is minutes behind.
    skewed = Attempt.objects.filter(worker_id="wskew").values_list("run_id", "generation", "started_at")
    for run_id, generation, started in skewed:
        for d in by_run.get(str(run_id), []):
            if d["generation"] == generation:
                report.skew_max_s = max(report.skew_max_s, abs(d["at"] - started.timestamp()))
                report.skewed_attempts += 1
    if not report.skewed_attempts:
        report.problems.append("the skewed worker made no call")
