from dispatch.loops import LoopCommand, drain, run_loop
from dispatch.relay import Relay


class Command(LoopCommand):
    help = "Publish outbox events to tenants' notification webhooks (at least once) and prune old ones."
    loop_name = "relay"

    def run(self, options):
        relay = Relay()
        try:
            if options["once"]:
                # One full pass: everything due now is tried once, and pruning runs.
                relay.step(prune=True)
                drain(lambda: relay.step(prune=False))
            else:
                run_loop(relay, stop=self.stop)
        finally:
            relay.close()
        self.stdout.write(f"relay: {relay.stats}")
