import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings
from django.db import connection

from dispatch.activity import ActivityAggregator
from dispatch.incidents import IncidentEvaluator
from dispatch.loops import LoopCommand, LoopThreads, Reconciler, Scanner, drain, reconcile_step, scan_step
from dispatch.maintenance import Maintenance
from dispatch.management.commands.work import default_worker_id
from dispatch.notifications import NotificationRelay
from dispatch.relay import Relay
from dispatch.worker import run_worker

log = logging.getLogger("scheduler.loops")


def start_loops(loops: LoopThreads) -> None:
    """The scanner, reconciler, relay, activity, maintenance, incidents and notification loops,
    each on its own thread (and so its own connection)."""
    loops.start(Scanner())
    loops.start(Reconciler())
    loops.start(Relay())
    loops.start(ActivityAggregator())
    loops.start(Maintenance())
    loops.start(IncidentEvaluator())
    loops.start(NotificationRelay())


def default_workers() -> int:
    """Worker processes for the machine: one per core on PostgreSQL, where a worker's calls and
    its database lanes keep a core busy and one process's interpreter lock is the limit; one on
    SQLite, which has one writer at a time."""
    if connection.vendor != "postgresql":
        return 1
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def stop_with_parent() -> None:
    """In the child, before it runs: SIGTERM when the parent process dies (Linux)."""
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class WorkerProcesses:
    """`manage.py work` child processes of the scheduler. A child that exits while the scheduler
    runs takes the scheduler down with it (non-zero), so that its supervisor restarts the whole."""

    def __init__(self, count: int, worker_id: str, concurrency: int | None):
        self.procs: list[subprocess.Popen] = []
        manage = Path(settings.BASE_DIR) / "manage.py"
        for i in range(count):
            args = [sys.executable, str(manage), "work", "--worker-id", f"{worker_id}-{i}"]
            if concurrency:
                args += ["--concurrency", str(concurrency)]
            # Their own session: a Ctrl-C in a terminal reaches the scheduler only, which stops them
            # in order; and each is told to stop if the scheduler dies without doing so.
            self.procs.append(subprocess.Popen(args, env=os.environ.copy(), start_new_session=True,
                                               preexec_fn=stop_with_parent))

    def exited(self) -> list[int]:
        return [p.returncode for p in self.procs if p.poll() is not None]

    def stop(self, grace: float) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        end = time.monotonic() + grace
        for p in self.procs:
            try:
                p.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


class Command(LoopCommand):
    help = ("All loops (scan, work, reconcile, relay) in one command, for small deployments and the quickstart: the "
            "scanner, reconciler and relay on threads, the worker in this process or in --workers child processes.")
    loop_name = "scheduler"

    def add_arguments(self, parser):
        super().add_arguments(parser)
        parser.add_argument("--concurrency", type=int, default=None, help="calls in flight per worker")
        parser.add_argument("--worker-id", default=None)
        parser.add_argument("--workers", type=int, default=None,
                            help="worker processes (default: one per core on PostgreSQL, 1 on SQLite; 1 runs the "
                                 "worker in this process)")

    def run(self, options):
        worker_id = options["worker_id"] or default_worker_id()
        if options["once"]:
            drain(scan_step)
            run_worker(worker_id, once=True, concurrency=options["concurrency"])
            drain(reconcile_step)
            return
        workers = options["workers"] or default_workers()
        start_loops(self.loops)
        try:
            if workers == 1:
                run_worker(worker_id, stop=self.stop, concurrency=options["concurrency"])
            else:
                self.supervise(WorkerProcesses(workers, worker_id, options["concurrency"]))
        finally:
            self.stop.set()
            self.loops.join(timeout=settings.SCHEDULER_SHUTDOWN_GRACE_SECONDS + 5)

    def supervise(self, children: WorkerProcesses) -> None:
        try:
            while not self.stop.wait(0.5):
                if children.exited():
                    log.critical("a worker process exited (%s); stopping the scheduler so that it is restarted",
                                 children.exited())
                    self.loops.died.append("work")
                    return
        finally:
            children.stop(settings.SCHEDULER_SHUTDOWN_GRACE_SECONDS + 5)
