from dispatch.activity import ActivityAggregator, drain
from dispatch.loops import LoopCommand, run_loop


class Command(LoopCommand):
    help = ("Fold finished attempts into the portal's per-minute and per-schedule activity figures "
            "(dispatch.activity). `reconcile` runs this loop too, unless given --no-activity.")
    loop_name = "aggregate"

    def run(self, options):
        aggregator = ActivityAggregator()
        if options["once"]:
            drain(aggregator)
        else:
            run_loop(aggregator, stop=self.stop)
