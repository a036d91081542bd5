"""Tenants, their target allowlists and their API keys: one entry point per change."""

import secrets

from django.db import transaction
from django.utils import timezone

from scheduler_project.errors import Conflict, ValidationFailed
from schedules.models import ApiKey, TargetPrefix, Tenant, hash_api_key
from schedules.services import SYSTEM, Actor, audit

KEY_PREFIX = "sk_"


@transaction.atomic
def create_tenant(slug: str, *, name: str = "", allow_targets=(), by: Actor = SYSTEM) -> Tenant:
    """Make a tenant, or add allowlist prefixes to an existing one (idempotent, for scripts)."""
    tenant, created = Tenant.objects.get_or_create(slug=slug, defaults={"name": name or slug})
    if not created and name and tenant.name != name:
        tenant.name = name
        tenant.save(update_fields=["name"])
    for prefix in allow_targets:
        add_target_prefix(tenant, prefix, by=by)
    if created:
        audit("tenant.create", by=by, obj_type="tenant", obj_id=tenant.id, tenant=tenant, after={"slug": slug})
    return tenant


def add_target_prefix(tenant: Tenant, prefix: str, *, by: Actor, max_concurrency: int | None = None) -> TargetPrefix:
    from schedules.targets import url_allowed

    if not url_allowed(prefix, [prefix]):
        raise ValidationFailed({"prefix": [f"{prefix!r} is not an absolute http(s) URL prefix without user info"]})
    target, created = TargetPrefix.objects.get_or_create(
        tenant=tenant, prefix=prefix, defaults={"max_concurrency": max_concurrency}
    )
    if created:
        audit("tenant.allow_target", by=by, obj_type="tenant", obj_id=tenant.id, tenant=tenant, after={"prefix": prefix})
    return target


def remove_target_prefix(target: TargetPrefix, *, by: Actor) -> None:
    audit("tenant.remove_target", by=by, obj_type="tenant", obj_id=target.tenant_id, tenant_id=target.tenant_id,
          before={"prefix": target.prefix})
    target.delete()


def create_api_key(tenant: Tenant, *, label: str = "", by: Actor = SYSTEM) -> tuple[ApiKey, str]:
    """Returns the key row and the raw key, which is shown once and never stored."""
    raw = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey.objects.create(
        tenant=tenant, label=label, prefix=raw[:11], key_hash=hash_api_key(raw), created_by=by.name
    )
    audit("apikey.create", by=by, obj_type="apikey", obj_id=key.id, tenant=tenant,
          after={"prefix": key.prefix, "label": label})
    return key, raw


def revoke_api_key(key: ApiKey, *, by: Actor) -> ApiKey:
    updated = ApiKey.objects.filter(id=key.id, revoked_at__isnull=True).update(revoked_at=timezone.now())
    if not updated:
        raise Conflict("this key is already revoked")
    key.refresh_from_db()
    audit("apikey.revoke", by=by, obj_type="apikey", obj_id=key.id, tenant_id=key.tenant_id, after={"prefix": key.prefix})
    return key


def set_notification_url(tenant: Tenant, url: str, *, by: Actor) -> Tenant:
    """Where the tenant's run notifications (webhooks) go; empty turns them off. Operator-managed,
    like the target allowlist: the scheduler itself calls this URL."""
    from schedules.targets import url_allowed

    url = (url or "").strip()
    if url and not url_allowed(url, [url]):
        raise ValidationFailed({"notification_url": [f"{url!r} is not an absolute http(s) URL without user info"]})
    before = tenant.notification_url
    if before == url:
        return tenant
    tenant.notification_url = url
    tenant.save(update_fields=["notification_url"])
    audit("tenant.set_notification_url", by=by, obj_type="tenant", obj_id=tenant.id, tenant=tenant,
          before={"notification_url": before}, after={"notification_url": url})
    return tenant


def set_max_in_flight(tenant: Tenant, limit: int | None, *, by: Actor) -> Tenant:
    """The per-tenant cap on concurrently leased runs; None removes it."""
    if limit is not None and limit < 1:
        raise ValidationFailed({"max_in_flight": ["must be at least 1, or empty for no limit"]})
    before = tenant.max_in_flight
    if before == limit:
        return tenant
    tenant.max_in_flight = limit
    tenant.save(update_fields=["max_in_flight"])
    audit("tenant.set_max_in_flight", by=by, obj_type="tenant", obj_id=tenant.id, tenant=tenant,
          before={"max_in_flight": before}, after={"max_in_flight": limit})
    return tenant
