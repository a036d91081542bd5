"""PostgreSQL LISTEN/NOTIFY wake-ups. A notification only ends an idle wait early; polling stays
the guarantee (a notification sent while nobody listened, or lost with a dropped connection, costs
at most one poll interval)."""

import logging
import threading

import psycopg
from django.db import connection

from scheduler_project.foundation.notify import RUNS_CHANNEL, SCHEDULES_CHANNEL  # noqa: F401  (the channels)

log = logging.getLogger("scheduler.wakeup")


class Listener:
    """LISTEN on a channel from a daemon thread with its own connection; `on_notify` is called
    (from that thread) for each notification burst."""

    def __init__(self, channel: str, on_notify):
        self.channel = channel
        self.on_notify = on_notify
        self.stopped = threading.Event()
        self.thread = None

    def start(self) -> "Listener":
        if connection.vendor != "postgresql":
            return self
        self.thread = threading.Thread(target=self._run, name=f"listen-{self.channel}", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()

    def _run(self) -> None:
        params = connection.get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        params.pop("server_side_binding", None)
        params.pop("prepare_threshold", None)
        while not self.stopped.is_set():
            try:
                with psycopg.connect(**params, autocommit=True) as conn:
                    conn.execute(f"LISTEN {self.channel}")
                    while not self.stopped.is_set():
                        # Wake at each notification as it arrives (the generator itself only
                        # ends after its timeout, which would delay every wake-up by it).
                        for _ in conn.notifies(timeout=1.0):
                            self.on_notify()
                            if self.stopped.is_set():
                                break
            except Exception as exc:  # the database went away: polling covers it; try again soon
                log.warning("listener on %s lost its connection (%s); reconnecting", self.channel, exc)
                self.stopped.wait(2.0)
