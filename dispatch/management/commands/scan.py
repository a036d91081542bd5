from dispatch.loops import LoopCommand, drain, run_loop, scan_step
from django.conf import settings


class Command(LoopCommand):
    help = "Materialise due occurrences into runs (for its shard of schedules, with --shards)."
    loop_name = "scan"

    def add_arguments(self, parser):
        super().add_arguments(parser)
        parser.add_argument("--shard", type=int, default=None, help="the shard this copy scans (0-based)")
        parser.add_argument("--shards", type=int, default=None, help="how many shards schedules are split into")
        parser.add_argument("--batch", type=int, default=None)

    def run(self, options):
        shards, shard = options["shards"], options["shard"]
        if (shards is None) != (shard is None) or (shards is not None and not 0 <= shard < shards):
            from django.core.management.base import CommandError

            raise CommandError("--shard I and --shards N go together, with 0 <= I < N")
        kwargs = {"shards": shards, "shard": shard, "batch": options["batch"]}
        if options["once"]:
            drain(scan_step, **kwargs)
        else:
            run_loop(lambda: scan_step(**kwargs), stop=self.stop, idle_seconds=settings.SCHEDULER_POLL_SECONDS, name="scan")
