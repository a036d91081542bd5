from django.conf import settings

from dispatch.loops import LoopCommand, drain, reconcile_step, run_loop


class Command(LoopCommand):
    help = "Recover expired leases (attempt outcome unknown) and apply misfire policy to unclaimed occurrences."
    loop_name = "reconcile"

    def run(self, options):
        if options["once"]:
            drain(reconcile_step)
        else:
            run_loop(reconcile_step, stop=self.stop, idle_seconds=settings.SCHEDULER_RECONCILE_SECONDS, name="reconcile")
