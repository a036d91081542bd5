from dispatch.activity import ActivityAggregator
from dispatch.activity import drain as drain_activity
from dispatch.incidents import IncidentEvaluator
from dispatch.incidents import drain as drain_incidents
from dispatch.loops import LoopCommand, Reconciler, drain, run_loop


class Command(LoopCommand):
    help = ("Recover expired leases (attempt outcome unknown) and apply misfire policy to unclaimed occurrences; "
            "on other threads, fold finished attempts into the portal's activity figures and evaluate incident rules.")
    loop_name = "reconcile"

    def add_arguments(self, parser):
        super().add_arguments(parser)
        parser.add_argument("--no-activity", action="store_true",
                            help="do not run the activity loop here (run `manage.py aggregate` instead)")
        parser.add_argument("--no-incidents", action="store_true",
                            help="do not run the incidents loop here (another reconcile or scheduler runs it)")

    def run(self, options):
        reconciler = Reconciler()
        if options["once"]:
            drain(reconciler.step)
            if not options["no_activity"]:
                drain_activity()
            if not options["no_incidents"]:
                drain_incidents()
            return
        if not options["no_activity"]:
            # Its own thread and connection: a long reconcile pass must not hold the figures back.
            self.loops.start(ActivityAggregator())
        if not options["no_incidents"]:
            # Its own thread too: incident evaluation never holds up the reconciler.
            self.loops.start(IncidentEvaluator())
        try:
            run_loop(reconciler, stop=self.stop)
        finally:
            self.stop.set()
            self.loops.join(timeout=10)
