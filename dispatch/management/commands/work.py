import os
import socket

from dispatch.loops import LoopCommand
from dispatch.worker import run_worker


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Command(LoopCommand):
    help = "Claim ready runs and call their targets."
    loop_name = "work"

    def add_arguments(self, parser):
        super().add_arguments(parser)
        parser.add_argument("--concurrency", type=int, default=None, help="calls in flight at once")
        parser.add_argument("--worker-id", default=None, help="name shown as the lease owner and on attempts")
        parser.add_argument("--batch", type=int, default=None, help="runs claimed per transaction")

    def run(self, options):
        worker_id = options["worker_id"] or default_worker_id()
        stats = run_worker(
            worker_id, once=options["once"], stop=self.stop, concurrency=options["concurrency"], batch=options["batch"]
        )
        self.stdout.write(f"worker {worker_id}: {stats}")
