import threading

from django.conf import settings
from django.db import connection

from dispatch.loops import LoopCommand, Scanner, drain, reconcile_step, run_loop, scan_step
from dispatch.management.commands.work import default_worker_id
from dispatch.relay import relay_step
from dispatch.worker import run_worker


def loop_threads(stop: threading.Event) -> list[threading.Thread]:
    """The scanner and reconciler loops, each on its own thread (and so its own connection)."""

    def loop(step, idle, name):
        def target():
            try:
                run_loop(step, stop=stop, idle_seconds=idle, name=name)
            finally:
                connection.close()

        return threading.Thread(target=target, name=name, daemon=True)

    scanner = Scanner()
    threads = [
        loop(scanner.step, scanner.idle_seconds, "scan"),
        loop(reconcile_step, settings.SCHEDULER_RECONCILE_SECONDS, "reconcile"),
        loop(relay_step, settings.SCHEDULER_POLL_SECONDS, "relay"),
    ]
    return threads


class Command(LoopCommand):
    help = "All loops (scan, work, reconcile, relay) in one process: for small deployments and the quickstart."
    loop_name = "scheduler"

    def add_arguments(self, parser):
        super().add_arguments(parser)
        parser.add_argument("--concurrency", type=int, default=None)
        parser.add_argument("--worker-id", default=None)

    def run(self, options):
        worker_id = options["worker_id"] or default_worker_id()
        if options["once"]:
            drain(scan_step)
            run_worker(worker_id, once=True, concurrency=options["concurrency"])
            drain(reconcile_step)
            return
        threads = loop_threads(self.stop)
        for t in threads:
            t.start()
        run_worker(worker_id, stop=self.stop, concurrency=options["concurrency"])
        self.stop.set()
        for t in threads:
            t.join(timeout=settings.SCHEDULER_SHUTDOWN_GRACE_SECONDS + 5)
