import os
import socket
import threading

from django.core.management.base import CommandError

from dispatch.loops import LoopCommand, Scanner, drain, run_loop
from dispatch.wakeup import SCHEDULES_CHANNEL, Listener


class Command(LoopCommand):
    help = "Materialise due occurrences into runs (with --shards N: for the shards this copy holds)."
    loop_name = "scan"

    def add_arguments(self, parser):
        super().add_arguments(parser)
        parser.add_argument("--shard", type=int, default=None, help="the shard this copy prefers (0-based)")
        parser.add_argument("--shards", type=int, default=None, help="how many shards schedules are split into")
        parser.add_argument("--batch", type=int, default=None, help="schedules locked per transaction")

    def run(self, options):
        shards, shard = options["shards"], options["shard"]
        if shard is not None and (shards is None or not 0 <= shard < shards):
            raise CommandError("--shard I needs --shards N, with 0 <= I < N")
        if shards is not None and shards < 1:
            raise CommandError("--shards must be at least 1")
        scanner = Scanner(shards=shards, prefer=shard, holder=f"{socket.gethostname()}-{os.getpid()}",
                          batch=options["batch"])
        if options["once"]:
            drain(scanner.step)
            return
        wake = threading.Event()
        listener = Listener(SCHEDULES_CHANNEL, wake.set).start()
        try:
            run_loop(scanner, stop=self.stop, wake=wake)
        finally:
            listener.stop()
