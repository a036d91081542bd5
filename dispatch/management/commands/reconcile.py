from dispatch.activity import ActivityAggregator
from dispatch.activity import drain as drain_activity
from dispatch.loops import LoopCommand, Reconciler, drain, run_loop


class Command(LoopCommand):
    help = ("Recover expired leases (attempt outcome unknown) and apply misfire policy to unclaimed occurrences; "
            "on a second thread, fold finished attempts into the portal's activity figures.")
    loop_name = "reconcile"

    def add_arguments(self, parser):
        super().add_arguments(parser)
        parser.add_argument("--no-activity", action="store_true",
                            help="do not run the activity loop here (run `manage.py aggregate` instead)")

    def run(self, options):
        reconciler = Reconciler()
        if options["once"]:
            drain(reconciler.step)
            if not options["no_activity"]:
                drain_activity()
            return
        if not options["no_activity"]:
            # Its own thread and connection: a long reconcile pass must not hold the figures back.
            self.loops.start(ActivityAggregator())
        try:
            run_loop(reconciler, stop=self.stop)
        finally:
            self.stop.set()
            self.loops.join(timeout=10)
