"""Long-running commands as small step functions around a shutdown flag.

Each step does one unit of work and returns whether there may be more to do at once; the loop
sleeps in short slices otherwise, so SIGTERM/SIGINT (which only set the flag) stop it promptly.
Tests call the steps directly.
"""

import logging
import signal
import threading
import time
from datetime import timedelta

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import close_old_connections, connection

from runs import queue

log = logging.getLogger("scheduler.loops")


def set_application_name(name: str) -> None:
    """Name the PostgreSQL session after the loop, so pg_stat_activity shows who holds what."""
    if connection.vendor == "postgresql":
        connection.settings_dict.setdefault("OPTIONS", {})["application_name"] = f"scheduler-{name}"[:63]
        connection.close()


def install_signal_handlers(stop: threading.Event) -> None:
    def handler(signum, frame):
        log.info("signal %s: stopping after the current step", signum)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def run_loop(step, *, stop: threading.Event, idle_seconds: float, name: str) -> None:
    """Call `step()` until stopped; sleep `idle_seconds` (in short slices) when it reports idle.
    An exception in a step is logged and the loop goes on: a dropped connection or one bad row
    must not end the process."""
    while not stop.is_set():
        try:
            close_old_connections()
            busy = step()
        except Exception:
            log.exception("%s step failed; retrying after a pause", name)
            try:
                connection.close()
            except Exception:
                pass
            busy = False
            stop.wait(min(5.0, max(idle_seconds, 0.5)))
        if not busy:
            stop.wait(idle_seconds)


# --- the steps ------------------------------------------------------------------------------


def scan_step(*, shards=None, shard=None, batch=None, horizon_seconds=None) -> bool:
    """One scanner transaction. True when it filled its batch (more may be due)."""
    batch = batch or settings.SCHEDULER_SCAN_BATCH
    horizon = timedelta(seconds=settings.SCHEDULER_HORIZON_SECONDS if horizon_seconds is None else horizon_seconds)
    result = queue.materialise_due(batch=batch, shards=shards, shard=shard, horizon=horizon)
    for sid, err in result.errors:
        log.error("schedule %s could not be scanned: %s", sid, err)
    return result.schedules >= batch


def reconcile_step(*, batch: int = 500) -> bool:
    expired = queue.expire_leases(batch=batch)
    skipped = queue.skip_unclaimed_misfires(batch=batch)
    if expired or skipped:
        log.info("reconcile: %d expired leases recovered, %d unclaimed occurrences skipped (misfire)", expired, skipped)
    return expired >= batch


def drain(step, **kwargs) -> None:
    """Run a step until it reports no more immediate work (the `--once` mode)."""
    while step(**kwargs):
        pass


class LoopCommand(BaseCommand):
    """Base for the loop commands: --once, signal handling, application_name."""

    loop_name = "loop"

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="do one full pass and exit")

    def handle(self, *args, **options):
        set_application_name(self.loop_name)
        self.stop = threading.Event()
        install_signal_handlers(self.stop)
        started = time.monotonic()
        self.run(options)
        log.info("%s stopped after %.1fs", self.loop_name, time.monotonic() - started)

    def run(self, options):  # pragma: no cover - each command defines it
        raise NotImplementedError
