"""Delivers incident notifications (dispatch.models.Notification, written by dispatch.incidents
in the transaction that opened or resolved the incident) to owners' webhooks and e-mail.

The webhook side is the outbox relay's own delivery (`dispatch.relay.Relay.deliver` and
`send`): the same signed JSON body and headers (X-Scheduler-Signature with the tenant's secret,
Idempotency-Key and X-Scheduler-Event-Id = the notification's event id), the same SafeClient
address policy (no private addresses, no redirects, bounded answers), timeout, backoff with
jitter, and a circuit per destination, so a channel that keeps failing holds back only itself.
Its rows are its own table rather than the run outbox: the destination is the channel's URL, not
the tenant's notification_url, and the run outbox stays as the relay's claim knows it.

One step: claim (lock a batch of due rows with SKIP LOCKED, count the attempt, lease them), send
outside any transaction, record (published, or the next try after a backoff, only while the
lease still holds). A crash between claim and record leaves the lease to run out and the rows
are sent again: at least once; consumers dedupe by the event id (e-mail: the Message-ID).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.core.mail import EmailMessage
from django.db import transaction
from django.db.models import F

from dispatch.models import Notification, NotificationChannel
from dispatch.relay import Outcome, Pending, Relay, backoff_seconds
from scheduler_project.foundation.dbclock import db_now

log = logging.getLogger("scheduler.notifications")

PRUNE_BATCH = 5000


@dataclass
class NotePending(Pending):
    channel: str = NotificationChannel.WEBHOOK
    webhook_format: str = "json"

    def body(self) -> bytes:
        if self.webhook_format in ("slack", "teams"):
            # Incoming webhooks of Slack and Teams take {"text": ...}; the event id rides along.
            body = {"text": (self.payload or {}).get("text", ""), "eventId": str(self.event_id)}
            if self.webhook_format == "teams":
                body["title"] = self.kind
            return json.dumps(body, separators=(",", ":")).encode()
        return super().body()


def claim(limit: int, *, visibility_seconds: float) -> list[NotePending]:
    with transaction.atomic():
        now = db_now()
        base = Notification.objects.filter(published_at__isnull=True)
        retry = list(base.filter(next_attempt_at__lte=now).order_by("next_attempt_at", "id")
                     .select_for_update(skip_locked=True).values_list("id", flat=True)[:max(1, limit // 2)])
        fresh = list(base.filter(next_attempt_at__isnull=True).order_by("id")
                     .select_for_update(skip_locked=True).values_list("id", flat=True)[:limit - len(retry)])
        ids = retry + fresh
        if not ids:
            return []
        leased_until = now + timedelta(seconds=visibility_seconds)
        Notification.objects.filter(id__in=ids).update(next_attempt_at=leased_until,
                                                       publish_attempts=F("publish_attempts") + 1)
        rows = Notification.objects.filter(id__in=ids).order_by("id").values_list(
            "id", "event_id", "destination", "incident__last_run_id", "kind", "payload", "created_at",
            "publish_attempts", "destination", "tenant__signing_secret", "channel", "webhook_format")
        # tenant_id carries the destination: the relay's circuit is then one per channel.
        return [NotePending(*r[:10], leased_until=leased_until, channel=r[10], webhook_format=r[11]) for r in rows]


def record(outcomes: list[Outcome]) -> None:
    if not outcomes:
        return
    with transaction.atomic():
        now = db_now()
        for o in outcomes:
            rows = Notification.objects.filter(id=o.pending.id, published_at__isnull=True)
            if o.status == "published":
                rows.update(published_at=now, next_attempt_at=None, last_error="")
                continue
            untried = o.status != "failed"
            rows.filter(next_attempt_at=o.pending.leased_until).update(
                next_attempt_at=now + timedelta(seconds=o.delay),
                last_error=o.error[:2000] if o.status == "failed" else F("last_error"),
                publish_attempts=F("publish_attempts") - 1 if untried else F("publish_attempts"))


def send_email(ev: NotePending, max_backoff: float) -> Outcome:
    payload = ev.payload or {}
    inc = payload.get("incident") or {}
    subject = f"[scheduler] {payload.get('text', ev.kind)}"[:200]
    lines = [payload.get("text", ""), "", f"tenant: {payload.get('tenant')}"]
    lines += [f"{k}: {v}" for k, v in inc.items() if v is not None]
    lines += ["", f"event id: {ev.event_id}"]
    msg = EmailMessage(subject, "\n".join(lines), to=[ev.url],
                       headers={"Message-ID": f"<{ev.event_id}@scheduler>", "X-Scheduler-Event-Id": str(ev.event_id),
                                "X-Scheduler-Event-Kind": ev.kind})
    try:
        msg.send()
    except Exception as exc:  # an SMTP server down or refusing: retried with the same Message-ID
        delay = backoff_seconds(ev.publish_attempts, max_backoff)
        log.warning("e-mail notification %s to %s failed (%s); retried in %.0fs", ev.event_id, ev.url, exc, delay)
        return Outcome(ev, "failed", delay, f"{type(exc).__name__}: {exc}")
    return Outcome(ev, "published")


class NotificationRelay(Relay):
    """The `notify` loop: a Relay (its event loop, SafeClient and circuits) over Notification rows."""

    name = "notify"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.stats = {"published": 0, "failed": 0, "deferred": 0, "unsent": 0, "pruned": 0}

    def step(self, *, prune: bool | None = None) -> bool:
        events = claim(self.batch, visibility_seconds=self.visibility)
        hooks = [e for e in events if e.channel == NotificationChannel.WEBHOOK]
        outcomes = self._loop.run_until_complete(self.deliver(hooks)) if hooks else []
        outcomes += [send_email(e, self.max_backoff) for e in events if e.channel == NotificationChannel.EMAIL]
        record(outcomes)
        for o in outcomes:
            self.stats[o.status] = self.stats.get(o.status, 0) + 1
        if prune or (prune is None and time.monotonic() >= self._next_prune):
            hours = settings.SCHEDULER_OUTBOX_RETENTION_HOURS
            ids = Notification.objects.filter(published_at__lt=db_now() - timedelta(hours=hours)).values("id")[:PRUNE_BATCH]
            pruned, _ = Notification.objects.filter(id__in=ids).delete()
            self.stats["pruned"] += pruned
            self._next_prune = time.monotonic() + 60
        return len(events) >= self.batch


def drain(relay: NotificationRelay | None = None) -> None:
    own = relay is None
    relay = relay or NotificationRelay()
    try:
        while relay.step():
            pass
    finally:
        if own:
            relay.close()
