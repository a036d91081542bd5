from django.conf import settings

from dispatch.loops import LoopCommand, LoopThreads, Reconciler, Scanner, drain, reconcile_step, scan_step
from dispatch.management.commands.work import default_worker_id
from dispatch.relay import Relay
from dispatch.worker import run_worker


def start_loops(loops: LoopThreads) -> None:
    """The scanner, reconciler and relay, each on its own thread (and so its own connection)."""
    loops.start(Scanner())
    loops.start(Reconciler())
    loops.start(Relay())


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
        start_loops(self.loops)
        try:
            run_worker(worker_id, stop=self.stop, concurrency=options["concurrency"])
        finally:
            self.stop.set()
            self.loops.join(timeout=settings.SCHEDULER_SHUTDOWN_GRACE_SECONDS + 5)
