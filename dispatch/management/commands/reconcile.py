from dispatch.loops import LoopCommand, Reconciler, drain, run_loop


class Command(LoopCommand):
    help = "Recover expired leases (attempt outcome unknown) and apply misfire policy to unclaimed occurrences."
    loop_name = "reconcile"

    def run(self, options):
        reconciler = Reconciler()
        if options["once"]:
            drain(reconciler.step)
        else:
            run_loop(reconciler, stop=self.stop)
