from dispatch.loops import LoopCommand, drain, run_loop
from dispatch.notifications import NotificationRelay
from dispatch.relay import Relay


class Command(LoopCommand):
    help = ("Publish outbox events to tenants' notification webhooks (at least once) and, on SQLite, prune old ones "
            "(PostgreSQL's go with their partition: `maintain`); on a second "
            "thread, deliver incident notifications to owners' webhooks and e-mail.")
    loop_name = "relay"

    def run(self, options):
        relay = Relay()
        notify = NotificationRelay()
        try:
            if options["once"]:
                # One full pass: everything due now is tried once, and pruning runs.
                relay.step(prune=True)
                drain(lambda: relay.step(prune=False))
                drain(lambda: notify.step())
            else:
                # The notification relay on its own thread: its own event loop and connection.
                self.loops.start(notify)
                run_loop(relay, stop=self.stop)
        finally:
            self.stop.set()
            self.loops.join(timeout=10)
            relay.close()
            notify.close()
        self.stdout.write(f"relay: {relay.stats}")
