"""Delivers incident notifications (dispatch.models.Notification, written by dispatch.incidents
in the transaction that opened or resolved the incident) to owners' webhooks and e-mail.

The webhook side is the outbox relay's own delivery (`dispatch.relay.Relay.deliver` and
`send`): the same signed JSON body and headers (X-Scheduler-Signature with the tenant's secret,
Idempotency-Key and X-Scheduler-Event-Id = the notification's event id), the same SafeClient
address policy (no private addresses, no redirects, bounded answers), timeout, backoff with
jitter, and a circuit per destination, so a channel that keeps failing holds back only itself.
Its rows are its own table rather than the run outbox: the destination is the channel's URL, not
the tenant's notification_url, and the run outbox stays as the relay's claim knows it.

One step: claim (lock a batch of due rows with SKIP LOCKED, hold or summarise what the owner's
quiet hours and hourly limit say must wait, count the attempt, lease the rest), send outside any
transaction, record (published, or the next try after a backoff, only while the lease still
holds). A crash between claim and record leaves the lease to run out and the rows are sent again:
at least once; consumers dedupe by the event id (e-mail: the Message-ID).

Quiet hours and the hourly limit (`hold_or_summarize`, in the claim's transaction) never drop a
notification: one due during the owner's quiet hours waits (held "quiet") until they end; one
over the owner's limit on its channel waits (held "rate") until the oldest message of the last
hour is an hour old; when more are due than the hour has room for, the last room goes to one
summary (kind notification.summary) that lists every one it stands for, and those are marked sent
as part of it in the same transaction. Test notifications are never held.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

from django.conf import settings
from django.core.mail import EmailMessage
from django.db import transaction
from django.db.models import F

from dispatch.models import HoldReason, Notification, NotificationChannel, NotificationKind
from dispatch.relay import Delivery, Outcome, Pending, Relay, backoff_seconds
from scheduler_project.foundation.dbclock import db_now
from schedules.models import Owner, WebhookFormat

log = logging.getLogger("scheduler.notifications")

PRUNE_BATCH = 5000
HOUR = timedelta(hours=1)


@dataclass
class NotePending(Pending):
    channel: str = NotificationChannel.WEBHOOK
    webhook_format: str = WebhookFormat.JSON

    def body(self) -> bytes:
        if self.webhook_format in (WebhookFormat.SLACK, WebhookFormat.TEAMS):
            # Incoming webhooks of Slack and Teams take {"text": ...}; the event id rides along.
            body = {"text": (self.payload or {}).get("text", ""), "eventId": str(self.event_id)}
            if self.webhook_format == WebhookFormat.TEAMS:
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
        ids = hold_or_summarize(retry + fresh, now)
        if not ids:
            return []
        leased_until = now + timedelta(seconds=visibility_seconds)
        Notification.objects.filter(id__in=ids).update(next_attempt_at=leased_until, held="",
                                                       publish_attempts=F("publish_attempts") + 1)
        rows = Notification.objects.filter(id__in=ids).order_by("id").values_list(
            "id", "event_id", "destination", "incident__last_run_id", "kind", "payload", "created_at",
            "publish_attempts", "destination", "tenant__signing_secret", "channel", "webhook_format")
        # tenant_id carries the destination: the relay's circuit is then one per channel.
        return [NotePending(*r[:10], leased_until=leased_until, channel=r[10], webhook_format=r[11]) for r in rows]


def quiet_until(owner: Owner, now: datetime) -> datetime | None:
    """When the owner's quiet hours now in force end (None: not quiet now). Wall times in the
    owner's zone; a start after the end spans midnight (22:00-07:00)."""
    start, end = owner.quiet_start, owner.quiet_end
    if start is None or end is None or start == end:
        return None
    zone = ZoneInfo(owner.time_zone or "UTC")
    local = now.astimezone(zone)
    t = local.time().replace(tzinfo=None)
    if not (start <= t < end if start < end else (t >= start or t < end)):
        return None
    day = local.date() if t < end else local.date() + timedelta(days=1)
    # A wall time that a DST change skips is read with the offset before it: at most an hour off,
    # and never before now.
    until = datetime.combine(day, end, tzinfo=zone).astimezone(timezone.utc)
    return max(until, now + timedelta(seconds=1))


def hold_or_summarize(ids: list, now: datetime) -> list:
    """Of the claimed (locked) notifications, the ids to send now: the others are held until the
    owner's quiet hours end or its hour has room, or are sent as part of a summary, which is
    created here and is among the ids returned. Cost: the claimed rows, their owners by key, and
    per owner and channel its messages of the last hour (at most its limit) by
    notification_owner_sent_idx."""
    rows = list(Notification.objects.filter(id__in=ids).order_by("id").values(
        "id", "owner_id", "channel", "kind", "payload", "event_id", "tenant_id", "destination", "webhook_format"))
    owners = Owner.objects.in_bulk({r["owner_id"] for r in rows if r["owner_id"]})
    send, groups = [], defaultdict(list)
    for r in rows:
        if r["owner_id"] not in owners or r["kind"] == NotificationKind.INCIDENT_TEST:
            send.append(r["id"])  # a test is asked for now; a row without an owner has no settings
        else:
            groups[(r["owner_id"], r["channel"])].append(r)
    holds = defaultdict(list)
    for (owner_id, channel), group in groups.items():
        owner = owners[owner_id]
        until = quiet_until(owner, now)
        if until is not None:
            holds[(until, HoldReason.QUIET)] += [r["id"] for r in group]
            continue
        if owner.max_per_hour is None:
            send += [r["id"] for r in group]
            continue
        sent = list(Notification.objects.filter(owner_id=owner_id, channel=channel, published_at__gt=now - HOUR,
                                                summarized_in__isnull=True).order_by("published_at")
                    .values_list("published_at", flat=True)[:owner.max_per_hour])
        room = owner.max_per_hour - len(sent)
        if room <= 0:
            holds[(sent[0] + HOUR, HoldReason.RATE)] += [r["id"] for r in group]
        elif len(group) <= room:
            send += [r["id"] for r in group]
        else:
            # The last room of the hour goes to one message that stands for the rest.
            alone, rest = group[:room - 1], group[room - 1:]
            send += [r["id"] for r in alone]
            send.append(_summary(owner, channel, rest, now).id)
    for (until, reason), held in holds.items():
        Notification.objects.filter(id__in=held).update(next_attempt_at=until, held=reason)
    return send


def _summary(owner: Owner, channel: str, rows: list, now: datetime) -> Notification:
    """One notification standing for `rows` (sent as part of it from now on)."""
    listed = [{"eventId": str(r["event_id"]), "kind": r["kind"], "text": (r["payload"] or {}).get("text", ""),
               "incident": ((r["payload"] or {}).get("incident") or {}).get("id")} for r in rows]
    text = (f"{len(rows)} notifications for {owner.slug} held by its limit of {owner.max_per_hour} an hour: "
            + "; ".join(item["text"] for item in listed[:20]) + ("; ..." if len(listed) > 20 else ""))
    last = rows[-1]
    summary = Notification.objects.create(
        tenant_id=last["tenant_id"], owner=owner, kind=NotificationKind.SUMMARY, channel=channel, destination=last["destination"],
        webhook_format=last["webhook_format"], created_at=now,
        payload={"tenant": (last["payload"] or {}).get("tenant"), "text": text[:3000], "owner": owner.slug,
                 "notifications": listed})
    Notification.objects.filter(id__in=[r["id"] for r in rows]).update(
        published_at=now, next_attempt_at=None, held="", summarized_in=summary)
    return summary


def record(outcomes: list[Outcome]) -> None:
    if not outcomes:
        return
    with transaction.atomic():
        now = db_now()
        for o in outcomes:
            rows = Notification.objects.filter(id=o.pending.id, published_at__isnull=True)
            if o.status == Delivery.PUBLISHED:
                rows.update(published_at=now, next_attempt_at=None, last_error="", held="")
                continue
            untried = o.status != Delivery.FAILED
            rows.filter(next_attempt_at=o.pending.leased_until).update(
                next_attempt_at=now + timedelta(seconds=o.delay),
                last_error=o.error[:2000] if o.status == Delivery.FAILED else F("last_error"),
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
        return Outcome(ev, Delivery.FAILED, delay, f"{type(exc).__name__}: {exc}")
    return Outcome(ev, Delivery.PUBLISHED)


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
