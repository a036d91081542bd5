"""Idempotency-Key on create and trigger: a repeated request gets the first response; the same
key with a different body is refused with 422. Keys are per tenant and per operation (a create key
and a trigger key never collide), and only successes are remembered: after a 4xx the client may fix
the request and retry with the same key.

The record is inserted in the same transaction as the work it guards, so two concurrent requests
with one key cannot both do the work: the second blocks on the unique index until the first
commits, then replays its answer.

A key is remembered for SCHEDULER_IDEMPOTENCY_RETENTION_HOURS: an older record counts as absent
(whether or not the reconciler has pruned it yet), so the answer never depends on pruning."""

import hashlib
import json
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from rest_framework.response import Response

from scheduler_project.web.models import IdempotencyRecord

HEADER = "Idempotency-Key"


def _fingerprint(data) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def _replay(record: IdempotencyRecord, fingerprint: str) -> Response:
    if record.request_hash != fingerprint:
        return Response(
            {"error": f"{HEADER} {record.key!r} was already used with a different request body; use a new key"},
            status=422,
        )
    resp = Response(record.response, status=record.status_code)
    resp["Idempotent-Replayed"] = "true"
    return resp


def idempotent(request, scope: str, handler) -> Response:
    key = request.headers.get(HEADER, "").strip()
    if not key:
        return handler()
    if len(key) > 200 or not all(" " <= c <= "~" for c in key):
        return Response({"errors": {HEADER: ["at most 200 printable ASCII characters (a UUID is a good key)"]}},
                        status=400)
    tenant = request.user.tenant
    fingerprint = _fingerprint(request.data)
    existing = IdempotencyRecord.objects.filter(tenant=tenant, scope=scope, key=key).first()
    if existing and existing.created_at >= _cutoff():
        return _replay(existing, fingerprint)
    try:
        with transaction.atomic():
            if existing:  # expired: the key starts a new request
                IdempotencyRecord.objects.filter(id=existing.id, created_at__lt=_cutoff()).delete()
            record = IdempotencyRecord.objects.create(
                tenant=tenant, scope=scope, key=key, request_hash=fingerprint, status_code=0, response={}
            )
            response = handler()
            if response.status_code >= 300:
                # Errors are not remembered: the client may fix the request and retry with the key.
                transaction.set_rollback(True)
                return response
            record.status_code = response.status_code
            record.response = response.data
            record.save(update_fields=["status_code", "response"])
            return response
    except IntegrityError:
        return _replay(IdempotencyRecord.objects.get(tenant=tenant, scope=scope, key=key), fingerprint)


def _cutoff():
    return timezone.now() - timedelta(hours=settings.SCHEDULER_IDEMPOTENCY_RETENTION_HOURS)


PRUNE_BATCH = 1000


def prune_expired(*, limit: int = PRUNE_BATCH) -> int:
    """Delete up to `limit` records older than the retention, oldest first (idempotency_created_idx)."""
    expired = IdempotencyRecord.objects.filter(created_at__lt=_cutoff())
    ids = list(expired.order_by("created_at").values_list("id", flat=True)[:limit])
    return expired.filter(id__in=ids).delete()[0] if ids else 0
