"""Long-running commands: every loop is an object with `step() -> bool` (one unit of work; True
when there may be more at once), `idle_seconds()` (how long to wait when there is not) and a
`name`, and one runner drives them all (`run_loop`).

The runner's promises:
- A failing step never ends the loop: the error is logged, the step's database connection is
  thrown away (a dropped or terminated session must not be reused), and the step is tried again
  after a backoff that grows with consecutive failures (`failure_backoff`), so a database that
  is down is not hammered and one that comes back is used again within seconds.
- Waits are short slices around the shutdown flag, so SIGTERM/SIGINT (which only set the flag)
  stop a loop promptly; a LISTEN/NOTIFY wake-up ends an idle wait early, polling stays the
  guarantee.
- If a loop dies anyway (a bug in the runner itself, a BaseException), the process does not run
  on half-dead: `LoopThreads` stops every loop and the command exits non-zero, so that its
  supervisor (systemd, Kubernetes) restarts it.

Tests call the steps directly.
"""

import logging
import os
import random
import signal
import sys
import threading
import time
from datetime import timedelta

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import close_old_connections, connection

from dispatch import tracing
from dispatch.sharding import SHARD_LEASE_SECONDS, hold_shards, record_pass
from runs import queue
from scheduler_project.foundation import expiry

log = logging.getLogger("scheduler.loops")

# A failing step is retried after this long at first, doubling up to the cap. The cap is what a
# loop may still sleep once its database is back: with 30 s, the soak's scanner slept 15 s after
# a failover's new primary was ready (the dispatch gap 22 s instead of the promotion's 11 s). A
# step every few seconds per loop is no load on a database that is down.
FAILURE_BACKOFF_FIRST = 0.5
FAILURE_BACKOFF_CAP = 4.0


def failure_backoff(failures: int) -> float:
    """Seconds to wait after the n-th consecutive failure of a step: exponential up to a cap,
    with jitter so that a fleet of loops does not come back to a restarted database in step."""
    step = min(FAILURE_BACKOFF_CAP, FAILURE_BACKOFF_FIRST * 2 ** (max(1, failures) - 1))
    return step / 2 + random.uniform(0, step / 2)


def discard_connection() -> None:
    """Throw away this thread's database connection after a failed step: it may be terminated,
    mid-transaction or broken, and the next step must start on a fresh one."""
    try:
        connection.close()
    except Exception:  # closing a connection the server already dropped can itself fail
        connection.connection = None


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


def run_loop(loop, *, stop: threading.Event, wake: threading.Event | None = None) -> None:
    """Call `loop.step()` until stopped; when it reports idle, wait `loop.idle_seconds()` or until
    `wake` is set. A step that raises is logged and retried after `failure_backoff`."""
    failures = 0
    while not stop.is_set():
        try:
            close_old_connections()
            busy = loop.step()
        except Exception:
            failures += 1
            delay = failure_backoff(failures)
            log.exception("%s step failed (%d in a row); retrying in %.1f s", loop.name, failures, delay)
            discard_connection()
            stop.wait(delay)
            continue
        if failures:
            log.info("%s recovered after %d failed steps", loop.name, failures)
            failures = 0
        if busy:
            continue
        try:
            seconds = loop.idle_seconds()
        except Exception:
            log.warning("%s could not tell how long to wait; polling", loop.name, exc_info=True)
            discard_connection()
            seconds = settings.SCHEDULER_POLL_SECONDS
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


class LoopThreads:
    """Loops on threads of one process (`scheduler`, `quickstart`), each with its own database
    connection. If one dies, every loop is stopped and `died` names it, so that the command exits
    non-zero instead of running on without it."""

    def __init__(self, stop: threading.Event):
        self.stop = stop
        self.threads: list[threading.Thread] = []
        self.died: list[str] = []

    def start(self, loop, *, wake: threading.Event | None = None) -> threading.Thread:
        def target():
            try:
                run_loop(loop, stop=self.stop, wake=wake)
            except BaseException as exc:
                log.critical("the %s loop died (%r): stopping every loop so that the process exits and is restarted",
                             loop.name, exc, exc_info=True)
                self.died.append(loop.name)
                self.stop.set()
            finally:
                discard_connection()

        t = threading.Thread(target=target, name=loop.name, daemon=True)
        t.start()
        self.threads.append(t)
        return t

    def join(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, end - time.monotonic()))


# --- the steps ------------------------------------------------------------------------------


# How long a scanner pass that stepped aside for partition DDL waits before the next one.
STEPPED_ASIDE_SECONDS = 0.05


def scan_step(*, shards=None, shard=None, batch=None, horizon_seconds=None) -> bool:
    """One scanner transaction. True when it filled its batch and made progress (more may be
    due; a batch of schedules that only wait inside the horizon is not progress)."""
    return _scan(shards=shards, shard=shard, batch=batch, horizon_seconds=horizon_seconds)[0]


def _scan(*, shards=None, shard=None, batch=None, horizon_seconds=None) -> tuple[bool, int, bool]:
    """scan_step's answer, the number of runs the transaction made, and whether it stepped aside
    for partition DDL (runs.partitions, "The scanner's gate")."""
    batch = batch or settings.SCHEDULER_SCAN_BATCH
    horizon = timedelta(seconds=settings.SCHEDULER_HORIZON_SECONDS if horizon_seconds is None else horizon_seconds)
    with tracing.span("materialise", batch=batch, shard=-1 if shard is None else shard) as traced:
        result = queue.materialise_due(batch=batch, shards=shards, shard=shard, horizon=horizon)
        traced["runs"], traced["schedules"] = result.runs + result.skipped, result.schedules
    for sid, err in result.errors:
        log.error("schedule %s could not be scanned: %s", sid, err)
    if result.stepped_aside:
        # Partition DDL waits for the passes in progress, then holds the tables for milliseconds:
        # look again shortly, as more may be due (a `--once` drain would otherwise end here).
        time.sleep(STEPPED_ASIDE_SECONDS)
        return True, 0, True
    return result.locked >= batch and result.schedules > 0, result.runs + result.skipped, False


class Scanner:
    """The `scan` loop's step with database-leased shard ownership (see dispatch.sharding).
    Without `shards`, every copy scans every due schedule it can lock.

    Look-ahead: the base horizon (SCHEDULER_HORIZON_SECONDS) makes runs a few seconds early,
    which is enough for steady traffic but not for a burst: a hundred thousand schedules due at
    one midnight take one scanner longer than that to materialise. So when idle, at most once a
    second, it checks (queue.lookahead_seconds) whether what is due within
    SCHEDULER_LOOKAHEAD_SECONDS could still be made in time at a quarter of the rate it has
    measured itself making runs, and if not, materialises that whole window at once."""

    name = "scan"
    RECORD_EVERY = 5.0
    LOOKAHEAD_EVERY = 1.0
    # The look-ahead plans with a quarter of the scanner's measured rate: it measured itself with
    # the machine's CPU to itself, and under a burst the workers take most of it.
    LOOKAHEAD_MARGIN = 4.0
    # Runs per second assumed until the scanner has measured its own: on the low side of what
    # one scanner makes (bench/README.md), so that a first guess starts early.
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
        self.stepped_aside = False

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
        busy, made, self.stepped_aside = _scan(batch=self.batch, horizon_seconds=self._horizon(), **where)
        if self.stepped_aside:
            return True  # more is due; a look-ahead under way goes on after the DDL
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
        ahead = queue.lookahead_seconds(base=self.base_horizon, limit=limit, rate=self.rate / self.LOOKAHEAD_MARGIN,
                                        shards=shards, shard=shard)
        if not ahead:
            return False
        log.info("materialising the next %.0f s now: a burst is due that would not be ready in time", ahead)
        self.ahead_until = time.monotonic() + ahead
        return True

    def step(self) -> bool:
        if not self.shards:
            return self._pass()

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


class Reconciler:
    """The `reconcile` loop: recover expired leases, apply misfire policy to runs no worker
    claimed in time, and prune expired Idempotency-Key records (at most once a minute: they only
    cost space)."""

    name = "reconcile"
    IDEMPOTENCY_PRUNE_SECONDS = 60.0

    def __init__(self, *, batch: int = 500):
        self.batch = batch
        self.next_prune = 0.0

    def idle_seconds(self) -> float:
        return settings.SCHEDULER_RECONCILE_SECONDS

    def step(self) -> bool:
        expired = queue.expire_leases(batch=self.batch)
        skipped = queue.skip_unclaimed_misfires(batch=self.batch)
        if expired or skipped:
            log.info("reconcile: %d expired leases recovered, %d unclaimed occurrences skipped (misfire)",
                     expired, skipped)
        if time.monotonic() >= self.next_prune:
            # Expired Idempotency-Key records (registered by the web, which owns their table). A full
            # batch means more are waiting: come back on the next pass rather than in a minute.
            more = expiry.prune_expired()
            self.next_prune = time.monotonic() + (0 if more else self.IDEMPOTENCY_PRUNE_SECONDS)
        # Either step may have stopped at its bound with more to do: come straight back.
        return expired >= self.batch or skipped >= self.batch * queue.MISFIRE_BATCHES_PER_PASS


_reconcilers: dict[int, Reconciler] = {}


def reconcile_step(*, batch: int = 500) -> bool:
    """One reconciler pass (for tests and `--once`), keeping its prune schedule between calls."""
    if batch not in _reconcilers:
        _reconcilers[batch] = Reconciler(batch=batch)
    return _reconcilers[batch].step()


def drain(step, **kwargs) -> None:
    """Run a step until it reports no more immediate work (the `--once` mode)."""
    while step(**kwargs):
        pass


class LoopCommand(BaseCommand):
    """Base for the loop commands: --once, signal handling, application_name, and a non-zero exit
    when one of its loops died."""

    loop_name = "loop"

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="do one full pass and exit")

    def handle(self, *args, **options):
        set_application_name(self.loop_name)
        self.stop = threading.Event()
        self.loops = LoopThreads(self.stop)
        install_signal_handlers(self.stop)
        started = time.monotonic()
        self.run(options)
        log.info("%s stopped after %.1fs", self.loop_name, time.monotonic() - started)
        if self.loops.died:
            # Exit at once: a thread stuck in a call to a dead database must not keep a process
            # that has lost a loop alive.
            log.critical("exiting with status 1: the %s loop died", ", ".join(self.loops.died))
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)

    def run(self, options):  # pragma: no cover - each command defines it
        raise NotImplementedError
