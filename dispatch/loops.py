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
from schedules import idempotency

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


def run_loop(step, *, stop: threading.Event, idle_seconds, name: str, wake: threading.Event | None = None) -> None:
    """Call `step()` until stopped; when it reports idle, wait `idle_seconds` (a number, or a
    function giving one) or until `wake` is set (a LISTEN/NOTIFY wake-up). An exception in a step
    is logged and the loop goes on: a dropped connection or one bad row must not end the process."""
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
            seconds = idle_seconds() if callable(idle_seconds) else idle_seconds
            if wake is None:
                stop.wait(seconds)
            else:
                _wait_either(stop, wake, seconds)
                wake.clear()


def _wait_either(stop: threading.Event, wake: threading.Event, seconds: float) -> None:
    end = time.monotonic() + seconds
    while not stop.is_set() and not wake.is_set():
        left = end - time.monotonic()
        if left <= 0:
            return
        wake.wait(min(0.1, left))


# --- the steps ------------------------------------------------------------------------------


def scan_step(*, shards=None, shard=None, batch=None, horizon_seconds=None) -> bool:
    """One scanner transaction. True when it filled its batch and made progress (more may be
    due; a batch of schedules that only wait inside the horizon is not progress)."""
    return _scan(shards=shards, shard=shard, batch=batch, horizon_seconds=horizon_seconds)[0]


def _scan(*, shards=None, shard=None, batch=None, horizon_seconds=None) -> tuple[bool, int]:
    """scan_step's answer and the number of runs the transaction made."""
    batch = batch or settings.SCHEDULER_SCAN_BATCH
    horizon = timedelta(seconds=settings.SCHEDULER_HORIZON_SECONDS if horizon_seconds is None else horizon_seconds)
    result = queue.materialise_due(batch=batch, shards=shards, shard=shard, horizon=horizon)
    for sid, err in result.errors:
        log.error("schedule %s could not be scanned: %s", sid, err)
    return result.locked >= batch and result.schedules > 0, result.runs + result.skipped


class Scanner:
    """The `scan` loop's step with database-leased shard ownership (see dispatch.sharding).
    Without `shards`, every copy scans every due schedule it can lock.

    Look-ahead: the base horizon (SCHEDULER_HORIZON_SECONDS) makes runs a few seconds early,
    which is enough for steady traffic but not for a burst: 100,000 schedules due at one
    midnight take this scanner tens of seconds to materialise. So when idle, at most once a
    second, it checks (queue.lookahead_seconds) whether what is due within
    SCHEDULER_LOOKAHEAD_SECONDS could still be made in time at half the rate it has measured
    itself making runs, and if not, materialises ahead up to the instant that needs it."""

    RECORD_EVERY = 5.0
    LOOKAHEAD_EVERY = 1.0
    # Runs per second assumed until the scanner has measured its own: below what one scanner
    # made on 2-core machines (1,500-3,100/s, bench/README.md), so a first guess starts early.
    DEFAULT_RATE = 1000.0

    def __init__(self, *, shards=None, prefer=None, holder="", batch=None, horizon_seconds=None,
                 lookahead_seconds=None):
        self.shards, self.prefer, self.holder = shards, prefer, holder
        self.batch, self.horizon_seconds = batch, horizon_seconds
        self.lookahead_seconds = lookahead_seconds
        self.held: list[int] = []
        self.renewed_at = self.recorded_at = -1e9
        self.rate = self.DEFAULT_RATE  # runs made per second of scanning, measured as it goes
        self.ahead_until = 0.0  # time.monotonic() up to which a look-ahead materialises; 0: none
        self.probed_at = -1e9

    @property
    def base_horizon(self) -> float:
        return float(settings.SCHEDULER_HORIZON_SECONDS if self.horizon_seconds is None else self.horizon_seconds)

    def idle_seconds(self) -> float:
        """Sleep the poll interval, or less when the next schedule is due sooner."""
        poll = settings.SCHEDULER_POLL_SECONDS
        try:
            soonest = queue.seconds_until_next_due(horizon=timedelta(seconds=self.base_horizon))
        except Exception:
            return poll
        if soonest is None:
            return poll
        # Already due but not taken (another shard's, or locked by another scanner): look again
        # shortly rather than spin on the database.
        return 0.05 if soonest <= 0 else min(poll, soonest)

    def _horizon(self) -> float:
        return max(self.base_horizon, self.ahead_until - time.monotonic())

    def _pass(self, **where) -> bool:
        started = time.monotonic()
        busy, made = _scan(batch=self.batch, horizon_seconds=self._horizon(), **where)
        if made >= 50:  # a full-enough batch to measure by
            self.rate = 0.7 * self.rate + 0.3 * made / max(1e-3, time.monotonic() - started)
        if busy:
            return True
        self.ahead_until = 0.0
        return self._look_ahead(**where)

    def _look_ahead(self, shards=None, shard=None) -> bool:
        limit = float(settings.SCHEDULER_LOOKAHEAD_SECONDS if self.lookahead_seconds is None
                      else self.lookahead_seconds)
        if limit <= self.base_horizon or time.monotonic() - self.probed_at < self.LOOKAHEAD_EVERY:
            return False
        self.probed_at = time.monotonic()
        # Half the measured rate: a burst's workers may be competing for the same CPU by then.
        ahead = queue.lookahead_seconds(base=self.base_horizon, limit=limit, rate=self.rate / 2,
                                        shards=shards, shard=shard)
        if not ahead:
            return False
        log.info("materialising ahead: %.0f s (a burst is due that would not be ready in time)", ahead)
        self.ahead_until = time.monotonic() + ahead
        return True

    def step(self) -> bool:
        if not self.shards:
            return self._pass()
        from dispatch.sharding import SHARD_LEASE_SECONDS, hold_shards, record_pass

        if time.monotonic() - self.renewed_at > SHARD_LEASE_SECONDS / 3:
            self.held = hold_shards(self.holder, self.shards, self.prefer)
            self.renewed_at = time.monotonic()
        if not self.held:
            return False
        busy = self._pass(shards=self.shards, shard=self.held)
        if not busy and time.monotonic() - self.recorded_at > self.RECORD_EVERY:
            record_pass(self.shards, self.held)
            self.recorded_at = time.monotonic()
        return busy


# Expired Idempotency-Key records are pruned at most this often (they only cost space).
IDEMPOTENCY_PRUNE_SECONDS = 60.0
_next_idempotency_prune = 0.0


def reconcile_step(*, batch: int = 500) -> bool:
    global _next_idempotency_prune
    expired = queue.expire_leases(batch=batch)
    skipped = queue.skip_unclaimed_misfires(batch=batch)
    if expired or skipped:
        log.info("reconcile: %d expired leases recovered, %d unclaimed occurrences skipped (misfire)", expired, skipped)
    if time.monotonic() >= _next_idempotency_prune:
        pruned = idempotency.prune_expired()
        # A full batch means more are waiting: come back on the next pass rather than in a minute.
        _next_idempotency_prune = time.monotonic() + (0 if pruned >= idempotency.PRUNE_BATCH else IDEMPOTENCY_PRUNE_SECONDS)
    # Either step may have stopped at its bound with more to do: come straight back.
    return expired >= batch or skipped >= batch * queue.MISFIRE_BATCHES_PER_PASS


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
