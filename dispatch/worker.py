"""The worker: claim runs in batches, call their targets concurrently on asyncio, report results
in batches.

Why this shape: an HTTP call through the asyncio transport (dispatch/http1.py) costs a fraction of
the CPU of aiohttp's or requests' clients, and per-run commits cost many times batched ones
(docs/dispatch.md has the measurements). So the event loop only makes HTTP calls; every
database step runs on one of two dedicated threads ("lanes"), each owning its own connection:
claims on one, results and heartbeats on the other. Each step handles a whole batch. No lock is
held while a target is called: the claim commits before the first call starts.

Steps of one run: claimed (committed: leased, generation + 1, attempt open) -> call -> result
queued -> complete() applies it only if the generation still holds the lease.
"""

import asyncio
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from django.conf import settings
from django.db import close_old_connections, connection

from dispatch import signing, tracing
from dispatch.loops import failure_backoff
from dispatch.metrics import BATCH_BUCKETS
from dispatch.models import WorkerStat
from dispatch.safehttp import SafeClient, client_from_settings
from dispatch.wakeup import RUNS_CHANNEL, Listener
from runs import queue, tracecontext
from runs.decisions import Holding
from runs.models import AttemptOutcome
from runs.queue import Claimed, Result
from scheduler_project.foundation.dbclock import db_now
from schedules.models import Tenant

log = logging.getLogger("scheduler.worker")

# Due runs are waiting that the last claim could not take while a tenant or a target holds its
# share of this worker's slots: the next claim waits until a good part of the slots is free, a
# NOTIFY, or this long, whichever is first, instead of claiming again at once (a claim per
# finished call, or a spin when nothing finishes).
CAPPED_WAIT_SECONDS = 0.25


class Target:
    """A version's call, prepared once: versions are immutable, so this is cached for good."""

    __slots__ = ("url", "method", "headers", "body", "timeout", "digest")

    def __init__(self, url: str, method: str, headers: dict, body: bytes, timeout: float):
        self.url, self.method, self.headers, self.body, self.timeout = url, method, headers, body, timeout
        # The body's SHA-256, which every call's v2 signature covers (dispatch/signing.py).
        self.digest = signing.body_digest(body)


@dataclass(frozen=True)
class TenantAuth:
    secret: str
    prefixes: tuple


class TargetCache:
    """What a claimed run's call needs. The claim returns its version's target with it; versions
    are immutable, so each is prepared once and kept, within a bound. Tenants' secrets and
    allowlists can change, so they are re-read every few seconds (a prefix removed by an operator
    stops calls within that time)."""

    TENANT_TTL = 5.0
    MAX_VERSIONS = 10_000

    def __init__(self):
        self.versions: dict[int, Target] = {}
        self.tenants: dict[object, tuple[float, TenantAuth]] = {}
        # A call may outlast one lease: the heartbeater extends leases while it runs, and cancels
        # a call whose lease is lost. This cap only guards versions stored under a higher limit.
        self.max_timeout = float(max(1, settings.SCHEDULER_MAX_TIMEOUT_SECONDS))

    def _timeout(self, seconds) -> float:
        return min(float(seconds), self.max_timeout)

    def target(self, c: Claimed) -> Target:
        t = self.versions.get(c.version_id)
        if t is None:
            url, method, headers, timeout, payload = c.target
            # The payload as PostgreSQL renders its JSON is the body: it is what gets signed.
            t = Target(url, method, json.loads(headers) if headers and headers != "{}" else {}, payload.encode(),
                       self._timeout(timeout))
            if len(self.versions) > self.MAX_VERSIONS:
                self.versions.clear()
            self.versions[c.version_id] = t
        return t

    def load(self, claims: list[Claimed]) -> None:
        now = time.monotonic()
        stale = {c.tenant_id for c in claims if now - self.tenants.get(c.tenant_id, (0, None))[0] > self.TENANT_TTL}
        if stale:
            for t in Tenant.objects.filter(id__in=stale).prefetch_related("targets"):
                self.tenants[t.id] = (now, TenantAuth(t.signing_secret, tuple(t.allowed_prefixes())))


def call_headers(c: Claimed, target: Target, secret: str) -> dict:
    run_id = c.run_text
    headers = {
        **target.headers,
        "Content-Type": "application/json",
        # The run id, identical on every attempt: a retry must not look like a new effect.
        "Idempotency-Key": run_id,
        "X-Scheduler-Run-Id": run_id,
        # Fencing token: only grows, so a target can refuse a call older than one it has seen.
        "X-Scheduler-Generation": str(c.generation),
        "X-Scheduler-Scheduled-Time": c.scheduled_text,
        "X-Scheduler-Schedule-Id": c.schedule_text,
        "X-Scheduler-Schedule-Version": str(c.schedule_version),
        # W3C trace context: the run's trace, this attempt's span (a schedule's own `tracestate`
        # header, if it has one, goes out with it from target.headers).
        tracecontext.HEADER: tracecontext.traceparent(run_id, c.attempt_id),
    }
    # v2 signs this call's method, URL and headers above with the body, so the signature of one
    # call is refused on any other run, key, generation or URL.
    headers[signing.HEADER] = signing.sign_call(
        secret, method=target.method, url=target.url, headers=headers, body=target.body,
        digest=target.digest, with_v1=settings.SCHEDULER_SIGNATURE_V1)
    return headers


class Worker:
    def __init__(
        self,
        worker_id: str,
        *,
        concurrency: int | None = None,
        batch: int | None = None,
        lease_seconds: int | None = None,
        poll_seconds: float | None = None,
        grace_seconds: float | None = None,
        client: SafeClient | None = None,
        stop: threading.Event | None = None,
    ):
        self.worker_id = worker_id
        self.concurrency = concurrency or settings.SCHEDULER_WORKER_CONCURRENCY
        self.batch = batch or settings.SCHEDULER_CLAIM_BATCH
        self.lease_seconds = lease_seconds or settings.SCHEDULER_LEASE_SECONDS
        self.poll = settings.SCHEDULER_POLL_SECONDS if poll_seconds is None else poll_seconds
        self.grace = settings.SCHEDULER_SHUTDOWN_GRACE_SECONDS if grace_seconds is None else grace_seconds
        self.stop = stop or threading.Event()
        self._client = client
        # Two database lanes, each one thread with its own connection: claims on one, results and
        # heartbeats on the other, so a claim never waits behind a batch of completions (they
        # lock different rows: ready ones with SKIP LOCKED, leased ones by key).
        self._lanes = {
            "claim": ThreadPoolExecutor(1, thread_name_prefix=f"db-claim-{worker_id}"),
            "write": ThreadPoolExecutor(1, thread_name_prefix=f"db-write-{worker_id}"),
        }
        self.targets = TargetCache()
        self.inflight: dict[tuple, asyncio.Task] = {}
        self.claims: dict[tuple, Claimed] = {}
        self.calling: set[tuple] = set()
        self.results: list[Result] = []
        self.stats = {"claimed": 0, "applied": 0, "fenced": 0, "abandoned": 0, "released": 0, "claims": 0,
                      "empty_claims": 0}
        self.batch_buckets = {b: 0 for b in BATCH_BUCKETS}
        self.started_at = None
        self.died: list[str] = []  # background tasks that ended unexpectedly
        # What this worker has in flight, per tenant and per target host: the default shares are
        # counted against it (runs.decisions.Holding). Changed on the event loop only; each claim
        # takes a copy.
        self.holding = Holding(self.concurrency, settings.SCHEDULER_TENANT_SHARE, settings.SCHEDULER_TARGET_SHARE)
        self.finished = 0  # calls ended so far

    # -- database steps, on the worker's two database lanes ---------------------------------

    async def db(self, fn, *args, lane: str = "write", **kwargs):
        def run():
            try:
                return fn(*args, **kwargs)
            except Exception:
                # A dropped connection (restart, pg_terminate_backend) must not wedge the worker:
                # discard it so the next step reconnects.
                close_old_connections()
                if connection.connection is not None and not connection.is_usable():
                    connection.close()
                raise

        return await asyncio.get_running_loop().run_in_executor(self._lanes[lane], run)

    def close_db(self) -> None:
        for lane in self._lanes.values():
            lane.submit(lambda: connection.close()).result()  # each lane's own connection
            lane.shutdown(wait=True)

    def _held(self) -> Holding:
        h = self.holding
        return Holding(h.slots, h.tenant_share, h.target_share, dict(h.tenants), dict(h.hosts))

    def _claim(self, n: int, holding: Holding | None = None) -> list[Claimed]:
        with tracing.span("claim", worker=self.worker_id, asked=n) as traced:
            claims = queue.claim(self.worker_id, n, lease_seconds=self.lease_seconds, holding=holding or self._held())
            traced["runs"] = len(claims)
        if claims:
            self.targets.load(claims)
        return claims

    @staticmethod
    def _complete(batch: list) -> tuple[int, int]:
        with tracing.span("complete", results=len(batch)) as traced:
            applied, fenced = queue.complete(batch)
            traced["applied"], traced["fenced"] = applied, fenced
        return applied, fenced

    # -- one call ------------------------------------------------------------------------

    async def execute(self, c: Claimed) -> None:
        key = (c.run_id, c.generation)
        target = self.targets.target(c)
        auth = self.targets.tenants[c.tenant_id][1]
        self.calling.add(key)
        traced = tracing.enabled()
        start_ns = time.time_ns() if traced else 0
        res = await self.client.request(
            target.method,
            target.url,
            headers=call_headers(c, target, auth.secret),
            body=target.body,
            timeout=target.timeout,
            allowed_prefixes=auth.prefixes,
        )
        outcome = res.outcome
        if outcome == AttemptOutcome.FAILED and res.status is None and res.sent:
            # No answer after the request went out (time limit, disconnect): the target may have
            # acted, so the outcome is unknown (retried like a failure, shown as unknown). A
            # refused connection or a name that did not resolve never reached it.
            outcome = AttemptOutcome.UNKNOWN
        if traced:
            tracing.call(c.run_text, c.attempt_id, start_ns=start_ns, end_ns=time.time_ns(), method=target.method,
                         url=target.url, outcome=outcome, http_status=res.status, generation=c.generation,
                         error_class=res.error_class or "")
        self.results.append(
            Result(
                claimed=c,
                outcome=outcome,
                retryable=res.retryable,
                http_status=res.status,
                error_class=res.error_class or "",
                error=(res.error or "").replace("\x00", "\ufffd"),
                # PostgreSQL text cannot hold NUL: one in a target's answer must not make the
                # whole batch of results unwritable.
                response_excerpt=res.body_excerpt.decode("utf-8", "replace").replace("\x00", "\ufffd"),
                latency_ms=res.latency_ms,
                remote_address=res.remote_address or "",
                retry_after=res.retry_after,
            )
        )

    def _spawn(self, c: Claimed) -> None:
        key = (c.run_id, c.generation)
        task = asyncio.create_task(self.execute(c))
        self.inflight[key] = task
        self.claims[key] = c
        tenants, hosts = self.holding.tenants, self.holding.hosts
        tenants[c.tenant_id] = tenants.get(c.tenant_id, 0) + 1
        target = (c.tenant_id, c.target_host)
        hosts[target] = hosts.get(target, 0) + 1

        def done(t, key=key, tenant=c.tenant_id, host=target):
            self.inflight.pop(key, None)
            self.claims.pop(key, None)
            self.calling.discard(key)
            for held, k in ((tenants, tenant), (hosts, host)):
                if held[k] <= 1:
                    del held[k]
                else:
                    held[k] -= 1
            self.finished += 1
            self._slot.set()
            if not t.cancelled() and t.exception() is not None:
                log.error("call for run %s failed unexpectedly: %r", key[0], t.exception())

        task.add_done_callback(done)

    # -- loops ---------------------------------------------------------------------------

    async def flush(self) -> None:
        if not self.results:
            return
        batch, self.results = self.results, []
        try:
            applied, fenced = await self.db(self._complete, batch)
        except Exception:
            log.exception("could not record %d results; retrying", len(batch))
            self.results[:0] = batch  # keep them: the lease still protects the runs meanwhile
            await asyncio.sleep(0.5)
            return
        self.stats["applied"] += applied
        self.stats["fenced"] += fenced

    async def flusher(self) -> None:
        # Never cancelled mid-flush (a cancelled executor call may never run, losing the batch):
        # it is told to stop and awaited.
        while not self._flusher_stop.is_set():
            await self._wait(self._flusher_stop, 0.02)
            await self.flush()

    def _save_stats(self) -> None:
        now = db_now()
        WorkerStat.objects.update_or_create(
            worker_id=self.worker_id,
            defaults={
                "started_at": self.started_at or now, "seen_at": now, "claims": self.stats["claims"],
                "empty_claims": self.stats["empty_claims"], "claimed_runs": self.stats["claimed"],
                "batch_buckets": dict(self.batch_buckets), "abandoned": self.stats["abandoned"],
                "fenced_results": self.stats["fenced"],
            },
        )
        if self.started_at is None:
            self.started_at = now

    async def stats_saver(self) -> None:
        """Counters for /metrics, written every few seconds (a restarted worker starts a new row:
        its worker id includes its pid)."""
        while True:
            try:
                await self.db(self._save_stats)
            except Exception:
                log.warning("could not save worker counters; will retry", exc_info=True)
            await asyncio.sleep(5.0)

    async def heartbeater(self) -> None:
        interval = max(0.5, self.lease_seconds / 3)
        while True:
            await asyncio.sleep(interval)
            keys = list(self.inflight)
            if not keys:
                continue
            try:
                lost = await self.db(queue.heartbeat, self.worker_id, keys, lease_seconds=self.lease_seconds)
            except Exception:
                log.exception("heartbeat failed; will retry")
                continue
            for key in lost:
                # Canceled or expired and re-leased: stop the call; nothing it says would count.
                task = self.inflight.get(key)
                if task:
                    task.cancel()
                    self.stats["abandoned"] += 1

    @property
    def _refill_at(self) -> int:
        return max(1, min(self.batch, self.concurrency // 4))

    async def run(self, *, once: bool = False) -> dict:
        self._slot = asyncio.Event()
        self._wake = asyncio.Event()
        loop = asyncio.get_running_loop()
        listener = None if once else Listener(RUNS_CHANNEL, lambda: loop.call_soon_threadsafe(self._wake.set)).start()
        own_client = self._client is None
        self.client = self._client or client_from_settings(limit=max(100, self.concurrency))
        self._flusher_stop = asyncio.Event()
        flusher = self._supervised(self.flusher())
        heartbeater = self._supervised(self.heartbeater())
        saver = None if once else self._supervised(self.stats_saver())
        claim_failures = 0
        try:
            while not self.stop.is_set():
                free = self.concurrency - len(self.inflight)
                if free < self._refill_at and self.inflight:
                    # Claim in real batches: wait until a good part of the slots is free again
                    # instead of one claim transaction per finished call.
                    self._slot.clear()
                    await self._wait(self._slot, 0.05)
                    continue
                asked = min(free, self.batch)
                try:
                    claims = await self.db(self._claim, asked, self._held(), lane="claim")
                except Exception:
                    if once:
                        raise  # a one-pass run reports the failure instead of retrying forever
                    claim_failures += 1
                    delay = failure_backoff(claim_failures)
                    log.exception("claim failed (%d in a row); retrying in %.1f s", claim_failures, delay)
                    await self._sleep(delay)
                    continue
                if claim_failures:
                    log.info("claiming again after %d failed claims", claim_failures)
                    claim_failures = 0
                self.stats["claimed"] += len(claims)
                self.stats["claims"] += 1
                if claims:
                    for b in BATCH_BUCKETS:
                        if b == "+Inf" or len(claims) <= int(b):
                            self.batch_buckets[b] += 1
                else:
                    self.stats["empty_claims"] += 1
                for c in claims:
                    self._spawn(c)
                if claims and (len(claims) == asked or not self.holding.at_a_cap()):
                    continue
                if claims:
                    # A short claim while a tenant or host holds its share: what is left due is
                    # (mostly) theirs; claim again once some of their calls have ended.
                    await self._wait_for_room()
                    continue
                if once:
                    if not self.inflight:
                        break
                    self._slot.clear()
                    await self._wait(self._slot, 0.1)
                    continue
                seconds = await self._idle_seconds()
                if seconds <= 0 and self.inflight and self.holding.at_a_cap():
                    await self._wait_for_room()  # due, but (likely) only runs of tenants at their share
                else:
                    # Due runs another worker holds locked for a moment (a burst) are claimed
                    # again at once, as before the shares.
                    await self._sleep(seconds)
            await self._shutdown()
        finally:
            if listener:
                listener.stop()
            heartbeater.cancel()
            if saver:
                saver.cancel()
            self._flusher_stop.set()
            await flusher
            for _ in range(5):  # if the database stays away, lease expiry settles these as unknown
                if not self.results:
                    break
                await self.flush()
            if own_client:
                await self.client.close()
            self.close_db()
        if self.died:
            raise RuntimeError(f"the worker's {', '.join(self.died)} task died; see the log above")
        return self.stats

    def _supervised(self, coro) -> asyncio.Task:
        """A background task of the worker (flusher, heartbeats, counters). Each handles its own
        database errors; if one ends anyway, the worker must not run on without it (no heartbeats:
        every lease would run out mid-call), so it stops, and run_worker raises."""
        task = asyncio.create_task(coro)
        name = coro.__name__

        def done(t):
            if t.cancelled() or (name == "flusher" and self._flusher_stop.is_set() and t.exception() is None):
                return
            log.critical("the worker's %s task ended unexpectedly: %r; stopping the worker", name,
                         t.exception() if not t.cancelled() else "cancelled")
            self.died.append(name)
            self.stop.set()

        task.add_done_callback(done)
        return task

    async def _wait_for_room(self) -> None:
        """Until a claim's worth of calls has ended, a NOTIFY, shutdown or CAPPED_WAIT_SECONDS."""
        mark = self.finished + self._refill_at
        end = time.monotonic() + min(self.poll, CAPPED_WAIT_SECONDS) if self.poll else time.monotonic()
        while (self.finished < mark and not self._wake.is_set() and not self.stop.is_set()
               and time.monotonic() < end):
            self._slot.clear()
            await self._wait(self._slot, min(0.05, max(0.0, end - time.monotonic())))
        self._wake.clear()

    async def _wait(self, ev: asyncio.Event, timeout: float) -> None:
        try:
            await asyncio.wait_for(ev.wait(), timeout)
        except TimeoutError:
            pass

    async def _idle_seconds(self) -> float:
        """Nothing to claim: sleep the poll interval, or less when a run materialised ahead of
        time (the horizon) becomes eligible sooner. NOTIFY covers runs made ready now."""
        try:
            soonest = await self.db(queue.seconds_until_next_ready, self.poll, lane="claim")
        except Exception:
            return self.poll
        return self.poll if soonest is None else max(0.0, min(self.poll, soonest))

    async def _sleep(self, seconds: float) -> None:
        """Idle: wait for the poll interval, a NOTIFY wake-up, or shutdown, whichever is first."""
        end = time.monotonic() + seconds
        while not self.stop.is_set() and not self._wake.is_set() and time.monotonic() < end:
            await self._wait(self._wake, min(0.1, max(0.0, end - time.monotonic())))
        self._wake.clear()

    async def _shutdown(self) -> None:
        """Stop claiming (done by the caller); give back runs not yet called; let calls in flight
        finish within the grace period; abandon the rest to lease expiry (they will show as
        unknown, since the target may have acted)."""
        unstarted = [self.claims[k] for k in list(self.inflight) if k not in self.calling]
        if unstarted:
            for c in unstarted:
                self.inflight[(c.run_id, c.generation)].cancel()
            self.stats["released"] += await self.db(queue.release_unstarted, unstarted)
        if self.inflight:
            await asyncio.wait(list(self.inflight.values()), timeout=self.grace)
        for task in list(self.inflight.values()):
            task.cancel()
        await self.flush()


def loop_factory():
    """uvloop's event loop unless SCHEDULER_WORKER_LOOP says asyncio or uvloop is missing
    (bench/README.md has the measured difference)."""
    if getattr(settings, "SCHEDULER_WORKER_LOOP", "uvloop") == "uvloop":
        try:
            import uvloop
        except ImportError:
            log.warning("uvloop is not installed; using asyncio's event loop")
        else:
            return uvloop.new_event_loop
    return None


def run_worker(worker_id: str, *, once: bool = False, stop: threading.Event | None = None, **kwargs) -> dict:
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(Worker(worker_id, stop=stop, **kwargs).run(once=once))
