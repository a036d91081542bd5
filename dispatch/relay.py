"""The outbox relay: publishes every run transition, at least once, to its tenant's webhook.

One step (`Relay.step`, or `relay_step()` for the loops):

1. Events of tenants without a `notification_url` are marked published without a call, in one
   bounded UPDATE: nobody is listening, and leaving them would keep the outbox growing.
2. **Claim** (one short transaction): lock up to a batch of due events with `FOR UPDATE SKIP
   LOCKED`, count the attempt and lease them by moving `next_attempt_at` to now + the visibility
   timeout; commit. Another relay skips them while locked and ignores them while leased. The
   tenants this relay is still delivering to are left out.
3. **Call** outside any transaction or lock, through `dispatch.safehttp` (one `SafeClient` per
   relay, on the relay's own event loop): one task per tenant, tenants in parallel, each
   tenant's events one by one in order. The step lets them run for STEP_WAIT_SECONDS at most;
   a tenant whose webhook is slow or hangs keeps its task running through the next steps (until
   its time limit), and only its own events wait: the next steps record the other tenants'
   outcomes and claim and deliver their new events meanwhile.
4. **Record** (a second short transaction, for every tenant task that has ended): delivered
   events get `published_at`; a failed one gets `next_attempt_at` = now + backoff and
   `last_error`.

A crash anywhere between 2 and 4 leaves the events unpublished with a lease that simply runs
out, after which any relay claims them again: an event may be delivered twice (consumers
dedupe by `eventId`), never lost. This is also why the claim counts the attempt before calling:
an event whose delivery crashes the relay every time still backs off.

One request per event, not a JSON array: the `Idempotency-Key` header can then name the event
(consumers that dedupe on that header, like our own API, need nothing else), one bad event
cannot make a consumer reject its neighbours, and a consumer's 2xx means exactly one event.
Per-tenant batching is in the order and the parallelism: a tenant's events go in id order on
one connection, tenants in parallel, at most one delivery in flight per tenant (and
SCHEDULER_RELAY_CONCURRENCY in all).

A webhook that fails stops its tenant's deliveries for this step, and the relay holds that
tenant back for the backoff (a circuit per tenant, in memory: other relays find out for
themselves): a dead webhook costs one call per backoff interval, not one per event. The
tenant's other claimed events are put back with the same wait without using an attempt.

Published events older than SCHEDULER_OUTBOX_RETENTION_HOURS are deleted in bounded batches on
SQLite; on PostgreSQL retention removes them with their partition of the outbox (`maintain`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from django.conf import settings
from django.db import transaction
from django.db.models import Case, DateTimeField, F, PositiveIntegerField, TextField, Value, When

from dispatch import signing
from dispatch.safehttp import HttpOutcome, SafeClient, client_from_settings
from runs.models import OutboxEvent
from runs.store import store
from scheduler_project.foundation.dbclock import db_now

log = logging.getLogger("scheduler.relay")

MARK_BATCH = 5000
PRUNE_BATCH = 5000
# Pruning is housekeeping: once a minute is plenty unless the last pass filled its batch.
PRUNE_EVERY_SECONDS = 60.0
BACKOFF_BASE_SECONDS = 1.0
# A step lets the deliveries it started run this long at most before it records those that ended
# and claims again; the others go on meanwhile. It bounds what a slow webhook adds to other
# tenants' events (once per claim of the slow tenant's events: later steps do not wait for it).
STEP_WAIT_SECONDS = 0.5
# On close, deliveries in flight get this long to end and be recorded.
CLOSE_WAIT_SECONDS = 2.0


def _setting(name: str, default):
    return getattr(settings, name, default)


def backoff_seconds(failures: int, cap: float, base: float = BACKOFF_BASE_SECONDS) -> float:
    """Exponential with "equal jitter": between half and all of min(cap, base * 2**(n-1)). Full
    jitter (as for runs) could retry a failing webhook at once; half the step is always waited."""
    step = min(cap, base * 2 ** (max(1, failures) - 1))
    return step / 2 + random.uniform(0, step / 2)


def _iso(dt: datetime) -> str:
    return dt.isoformat().replace("+00:00", "Z")


@dataclass
class Pending:
    """A claimed event with what its delivery needs, read in the claim transaction."""

    id: int
    event_id: object
    tenant_id: object
    run_id: object
    kind: str
    payload: dict
    created_at: datetime
    publish_attempts: int  # including this one
    url: str
    secret: str
    leased_until: datetime  # the claim's lease; a record only applies while it still holds

    def body(self) -> bytes:
        fixed = {"eventId": str(self.event_id), "kind": self.kind, "runId": str(self.run_id) if self.run_id else None,
                 "createdAt": _iso(self.created_at)}
        extra = {k: v for k, v in (self.payload or {}).items() if k not in fixed}
        return json.dumps({**fixed, **extra}, separators=(",", ":")).encode()

    def headers(self, body: bytes) -> dict:
        return {
            "Content-Type": "application/json",
            # Same value on every delivery of this event: consumers dedupe on it.
            "Idempotency-Key": str(self.event_id),
            "X-Scheduler-Event-Id": str(self.event_id),
            "X-Scheduler-Event-Kind": self.kind,
            signing.HEADER: signing.sign(self.secret, body),
        }


# --- database steps --------------------------------------------------------------------------


def mark_without_webhook(*, limit: int = MARK_BATCH) -> int:
    """Mark published, without a call, the events of tenants that have no webhook."""
    now = db_now()
    # Never-tried events only: those are the head of outbox_relay_due_idx, so a webhook tenant's
    # backlog (tried, waiting) is not walked. An event that waits for a retry when its tenant
    # removes the webhook is published by the claim instead.
    ids = OutboxEvent.objects.filter(
        published_at__isnull=True, next_attempt_at__isnull=True, tenant__notification_url=""
    ).values("id")[:limit]
    return OutboxEvent.objects.filter(id__in=ids, published_at__isnull=True).update(published_at=now)


def claim_events(limit: int, *, visibility_seconds: float, skip_tenants=()) -> tuple[list[Pending], bool]:
    """Lease up to `limit` due events, none of the tenants in `skip_tenants` (the relay's own
    tenants still being delivered to). Half the batch at most goes
    to retries (oldest due first), the rest to events never tried (in id order), so a failing
    webhook's backlog cannot crowd out fresh events and fresh events cannot starve retries.
    Returns (events, more may be due)."""
    with transaction.atomic():
        now = db_now()
        base = OutboxEvent.objects.filter(published_at__isnull=True)
        if skip_tenants:
            base = base.exclude(tenant_id__in=list(skip_tenants))
        retry_limit = max(1, limit // 2)
        retry_ids = list(
            base.filter(next_attempt_at__lte=now)
            .order_by("next_attempt_at", "id")
            .select_for_update(skip_locked=True, of=("self",))
            .values_list("id", flat=True)[:retry_limit]
        )
        fresh_limit = limit - len(retry_ids)
        fresh_ids = list(
            base.filter(next_attempt_at__isnull=True)
            .exclude(tenant__notification_url="")
            .order_by("id")
            .select_for_update(skip_locked=True, of=("self",))
            .values_list("id", flat=True)[:fresh_limit]
        ) if fresh_limit else []
        ids = retry_ids + fresh_ids
        if not ids:
            return [], False
        leased_until = now + timedelta(seconds=visibility_seconds)
        OutboxEvent.objects.filter(id__in=ids).update(
            next_attempt_at=leased_until, publish_attempts=F("publish_attempts") + 1
        )
        rows = (
            OutboxEvent.objects.filter(id__in=ids)
            .order_by("id")
            .values_list("id", "event_id", "tenant_id", "run_id", "kind", "payload", "created_at", "publish_attempts",
                         "tenant__notification_url", "tenant__signing_secret")
        )
        events = [Pending(*r, leased_until=leased_until) for r in rows]
        # The tenant removed its webhook while these waited for a retry: nobody to tell.
        orphans = [e.id for e in events if not e.url]
        if orphans:
            OutboxEvent.objects.filter(id__in=orphans).update(published_at=now, next_attempt_at=None)
            events = [e for e in events if e.url]
    more = len(retry_ids) == retry_limit or (fresh_limit > 0 and len(fresh_ids) == fresh_limit)
    return events, more


class Delivery(StrEnum):
    """What became of one event in a delivery pass."""

    PUBLISHED = "published"
    FAILED = "failed"
    DEFERRED = "deferred"  # the target's circuit is open, or an earlier event of its run failed
    UNSENT = "unsent"  # the pass ran out of time before sending it


@dataclass
class Outcome:
    pending: Pending
    status: Delivery
    delay: float = 0.0  # failed, deferred: seconds until the next try
    error: str = ""


def record(outcomes: list[Outcome]) -> None:
    """Apply delivery outcomes in one transaction. Failures, deferrals and unsent events are
    applied only while the claim's lease still holds (`next_attempt_at` unchanged): if it ran
    out and another relay claimed the event meanwhile, that relay owns it now. Publication is
    applied regardless: the event was delivered."""
    if not outcomes:
        return
    with transaction.atomic():
        now = db_now()
        published = [o.pending.id for o in outcomes if o.status == Delivery.PUBLISHED]
        if published:
            OutboxEvent.objects.filter(id__in=published, published_at__isnull=True).update(
                published_at=now, next_attempt_at=None, last_error=""
            )
        rest = [o for o in outcomes if o.status != Delivery.PUBLISHED]
        if not rest:
            return
        when = Case(
            *[When(id=o.pending.id, then=Value(now + timedelta(seconds=o.delay))) for o in rest],
            output_field=DateTimeField(),
        )
        error = Case(
            *[When(id=o.pending.id, then=Value(o.error[:2000])) for o in rest if o.status == Delivery.FAILED],
            default=F("last_error"),
            output_field=TextField(),
        )
        # Deferred and unsent events were not tried: give back the attempt the claim counted.
        untried = [o.pending.id for o in rest if o.status != Delivery.FAILED]
        attempts = (
            Case(When(id__in=untried, then=F("publish_attempts") - 1), default=F("publish_attempts"),
                 output_field=PositiveIntegerField())
            if untried
            else F("publish_attempts")
        )
        for leased_until in {o.pending.leased_until for o in rest}:
            ids = [o.pending.id for o in rest if o.pending.leased_until == leased_until]
            OutboxEvent.objects.filter(id__in=ids, published_at__isnull=True, next_attempt_at=leased_until).update(
                next_attempt_at=when, last_error=error, publish_attempts=attempts
            )


def prune_published(*, older_than_hours: float | None = None, limit: int = PRUNE_BATCH) -> int:
    """Delete up to `limit` events published longer ago than the retention, where the store
    removes events row by row (SQLite); on PostgreSQL none, the outbox's partitions go whole."""
    hours = settings.SCHEDULER_OUTBOX_RETENTION_HOURS if older_than_hours is None else older_than_hours
    with transaction.atomic():
        return store().history_delete_published_events(published_before=db_now() - timedelta(hours=hours), limit=limit)


# --- the relay -------------------------------------------------------------------------------


class Relay:
    """One relay: its event loop, its SafeClient, its per-tenant circuits and deliveries in
    flight. Not thread-safe: one thread steps it (the `relay` command's, or the scheduler's relay
    thread), and the event loop runs inside its steps."""

    name = "relay"

    def __init__(
        self,
        *,
        batch: int | None = None,
        timeout_seconds: float | None = None,
        visibility_seconds: float | None = None,
        max_backoff_seconds: float | None = None,
        concurrency: int | None = None,
        client: SafeClient | None = None,
    ):
        self.batch = batch or _setting("SCHEDULER_RELAY_BATCH", 100)
        self.timeout = float(timeout_seconds or _setting("SCHEDULER_RELAY_TIMEOUT_SECONDS", 10))
        # Longer than a tenant's deliveries of one claim can take (sends start only in its first
        # half, each ends within the timeout), so a live relay's events are never claimed by
        # another one.
        self.visibility = max(
            float(visibility_seconds or _setting("SCHEDULER_RELAY_VISIBILITY_SECONDS", 120)), 2 * self.timeout + 5
        )
        self.max_backoff = float(max_backoff_seconds or _setting("SCHEDULER_RELAY_MAX_BACKOFF_SECONDS", 600))
        self.concurrency = concurrency or _setting("SCHEDULER_RELAY_CONCURRENCY", 16)
        self._loop = asyncio.new_event_loop()
        self._own_client = client is None
        self._client = client
        # tenant id -> (consecutive failures, monotonic time before which it is not called)
        self.circuits: dict[object, tuple[int, float]] = {}
        # tenant id -> the task delivering that tenant's claimed events, in order (its outcomes).
        # At most one per tenant: a tenant with deliveries in flight is left out of the next
        # claims, so its events keep their order and a slow webhook holds only its own events.
        self.deliveries: dict[object, asyncio.Task] = {}
        # Sends in flight at once, all tenants together.
        self._gate = asyncio.Semaphore(self.concurrency)
        self._next_prune = 0.0
        self.stats = {"published": 0, "failed": 0, "deferred": 0, "unsent": 0, "marked": 0, "pruned": 0}

    @property
    def client(self) -> SafeClient:
        if self._client is None:
            # Made here, used only on self._loop: a SafeClient's session belongs to one loop.
            self._client = client_from_settings(limit=max(100, self.concurrency * 2))
        return self._client

    def idle_seconds(self) -> float:
        return settings.SCHEDULER_POLL_SECONDS

    def step(self, *, prune: bool | None = None) -> bool:
        """One pass: mark webhook-less events; record the deliveries that ended; claim due events
        of the tenants not in flight or held back, and start delivering them; let deliveries run
        for up to STEP_WAIT_SECONDS and record those that ended; prune when due. A delivery
        still running then (a slow or hanging webhook) goes on in the background of the next
        steps, holding back no other tenant. True when some part filled its batch or deliveries
        are in flight (call again at once)."""
        marked = mark_without_webhook()
        self.stats["marked"] += marked
        self._record_ended()
        # A tenant held back after a failure is still claimed: its events are put back with the
        # circuit's wait (no call), and those whose webhook was removed are published.
        events, more = claim_events(self.batch, visibility_seconds=self.visibility, skip_tenants=set(self.deliveries))
        started = []
        if events:
            stop_sending = time.monotonic() + self.visibility / 2 - self.timeout
            for tenant, evs in _by_tenant(events).items():
                started.append(self._loop.create_task(self._deliver_tenant(evs, stop_sending)))
                self.deliveries[tenant] = started[-1]
        if started:
            # This step's deliveries, up to the step's wait; those of earlier steps still in
            # flight are slow ones, and are not waited for.
            self._loop.run_until_complete(asyncio.wait(started, timeout=STEP_WAIT_SECONDS))
        elif self.deliveries:
            # Only slow ones in flight: until one of them ends or the step's wait is over, so
            # that new events are claimed that often and not in a busy loop.
            self._loop.run_until_complete(asyncio.wait(list(self.deliveries.values()), timeout=STEP_WAIT_SECONDS,
                                                       return_when=asyncio.FIRST_COMPLETED))
        self._record_ended()
        pruned = 0
        if prune or (prune is None and time.monotonic() >= self._next_prune):
            pruned = prune_published()
            self.stats["pruned"] += pruned
            self._next_prune = time.monotonic() + (0 if pruned >= PRUNE_BATCH else PRUNE_EVERY_SECONDS)
        return more or marked >= MARK_BATCH or pruned >= PRUNE_BATCH or bool(self.deliveries)

    def _record_ended(self) -> None:
        """Record, in one transaction, the outcomes of every tenant's deliveries that ended."""
        ended = [t for t, task in self.deliveries.items() if task.done()]
        outcomes: list[Outcome] = []
        for tenant in ended:
            task = self.deliveries.pop(tenant)
            if task.cancelled() or task.exception() is not None:
                # Its events stay leased: they are delivered again once the lease runs out.
                log.error("deliveries to tenant %s ended unexpectedly: %r", tenant,
                          "cancelled" if task.cancelled() else task.exception())
                continue
            outcomes.extend(task.result())
        if not outcomes:
            return
        try:
            record(outcomes)
        except Exception:
            # Not recorded: published events are delivered again after their lease, the others
            # tried again; at least once either way. Their tenants may be claimed again now.
            log.exception("could not record %d delivery outcomes", len(outcomes))
            raise
        for o in outcomes:
            if o.status in self.stats:
                self.stats[o.status] += 1

    async def deliver(self, events: list[Pending]) -> list[Outcome]:
        """Deliver claimed events (tenants in parallel, each tenant's in order) and return every
        outcome."""
        stop_sending = time.monotonic() + self.visibility / 2 - self.timeout
        chains = await asyncio.gather(*(self._deliver_tenant(evs, stop_sending) for evs in _by_tenant(events).values()))
        return [o for chain in chains for o in chain]

    async def _deliver_tenant(self, evs: list[Pending], stop_sending: float) -> list[Outcome]:
        """One tenant's claimed events, one by one in order. A failure stops them and holds the
        tenant back for the backoff (its other events are put back with that wait); new sends
        start only in the first half of the lease (the rest go back unsent)."""
        results: list[Outcome] = []
        for i, ev in enumerate(evs):
            failures, closed_at = self.circuits.get(ev.tenant_id, (0, 0.0))
            now = time.monotonic()
            if closed_at > now:
                results.extend(Outcome(e, Delivery.DEFERRED, closed_at - now) for e in evs[i:])
                return results
            if now > stop_sending:
                results.extend(Outcome(e, Delivery.UNSENT) for e in evs[i:])
                return results
            async with self._gate:
                out = await self.send(ev)
            results.append(out)
            if out.status == Delivery.PUBLISHED:
                self.circuits.pop(ev.tenant_id, None)
                continue
            self.circuits[ev.tenant_id] = (failures + 1, time.monotonic() + out.delay)
            results.extend(Outcome(e, Delivery.DEFERRED, out.delay) for e in evs[i + 1:])
            return results
        return results

    async def send(self, ev: Pending) -> Outcome:
        body = ev.body()
        res = await self.client.request(
            "POST",
            ev.url,
            headers=ev.headers(body),
            body=body,
            timeout=self.timeout,
            # The webhook is the tenant's own URL, not a target: it is its own allowlist. The
            # address policy (public addresses and operator networks only) still applies.
            allowed_prefixes=[ev.url],
        )
        if res.outcome == HttpOutcome.SUCCEEDED:
            return Outcome(ev, Delivery.PUBLISHED)
        failures = max(ev.publish_attempts, self.circuits.get(ev.tenant_id, (0, 0.0))[0] + 1)
        delay = backoff_seconds(failures, self.max_backoff)
        if res.retry_after:
            delay = max(delay, min(res.retry_after, self.max_backoff))
        error = res.error or f"HTTP {res.status}"
        log.warning("webhook for tenant %s failed (%s); event %s retried in %.0fs", ev.tenant_id, error, ev.event_id, delay)
        return Outcome(ev, Delivery.FAILED, delay, f"{res.error_class or 'HTTPStatus'}: {error}")

    def close(self) -> None:
        """Let deliveries in flight end for a moment and record them; the rest are cancelled and
        their events, still leased, are delivered again once the lease runs out."""
        if self.deliveries:
            self._loop.run_until_complete(asyncio.wait(list(self.deliveries.values()), timeout=CLOSE_WAIT_SECONDS))
            try:
                self._record_ended()
            except Exception:
                pass  # logged; the leases settle it
            pending = list(self.deliveries.values())
            for task in pending:
                task.cancel()
            self._loop.run_until_complete(_settled(pending))
            self.deliveries.clear()
        if self._client is not None and self._own_client:
            self._loop.run_until_complete(self._client.close())
        self._client = None
        self._loop.close()


async def _settled(tasks) -> None:
    await asyncio.gather(*tasks, return_exceptions=True)


def _by_tenant(events: list[Pending]) -> dict:
    by_tenant: dict[object, list[Pending]] = {}
    for e in events:
        by_tenant.setdefault(e.tenant_id, []).append(e)
    return by_tenant


_local = threading.local()


def relay_step(*, relay: Relay | None = None, **kwargs) -> bool:
    """The step for `run_loop`: each thread that calls it keeps one Relay (so one SafeClient and
    one event loop per relay thread, kept across steps for connection reuse)."""
    if relay is None:
        relay = getattr(_local, "relay", None)
        if relay is None:
            relay = _local.relay = Relay()
    return relay.step(**kwargs)
