"""A tenant's owners (teams or contacts that own schedules and hear about their incidents): the
one entry point for creating and editing them and for choosing the tenant's default owner. A
schedule's own owner changes through runs.actions (create and edit), which uses
`owner_for` to resolve a slug inside the tenant."""

import re
from datetime import time
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import validate_email
from django.db import IntegrityError, transaction

from scheduler_project.foundation.errors import Conflict, ServiceError, ValidationFailed
from schedules.models import AuditAction, Owner, Tenant, WebhookFormat
from schedules.services import Actor, audit
from schedules.timeexpr import ExpressionError
from schedules.timeexpr.zones import validate_time_zone

SLUG = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
HHMM = re.compile(r"^([01][0-9]|2[0-3]):([0-5][0-9])$")
FIELDS = ("slug", "name", "email", "webhook_url", "webhook_format", "time_zone", "quiet_start", "quiet_end",
          "max_per_hour")
# Fields that may be null (no quiet hours, no hourly limit); the others are strings.
NULLABLE = ("quiet_start", "quiet_end", "max_per_hour")


class OwnerNotFound(ServiceError):
    status = 404


def owner_json(owner: Owner | None) -> dict | None:
    if owner is None:
        return None
    return {"slug": owner.slug, "name": owner.name, "email": owner.email, "webhook_url": owner.webhook_url,
            "webhook_format": owner.webhook_format, "time_zone": owner.time_zone,
            "quiet_start": _hhmm(owner.quiet_start), "quiet_end": _hhmm(owner.quiet_end),
            "max_per_hour": owner.max_per_hour}


def _hhmm(t: time | None) -> str | None:
    return t.strftime("%H:%M") if t is not None else None


def _clean(fields: dict, *, partial: bool) -> dict:
    errors: dict[str, list[str]] = {}
    out = {}
    for key, value in fields.items():
        if key not in FIELDS:
            errors[key] = ["unknown field"]
            continue
        if value is None and key in NULLABLE:
            out[key] = None
            continue
        if key == "max_per_hour":
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100_000:
                errors[key] = ["must be a whole number from 1 to 100000, or null for no limit"]
            else:
                out[key] = value
            continue
        if not isinstance(value, str):
            errors[key] = ["must be a string"]
            continue
        value = value.strip()
        if key == "slug" and not SLUG.match(value):
            errors[key] = ["lower-case letters, digits, '-' and '_', at most 64, starting with a letter or digit"]
        elif key == "name" and not (0 < len(value) <= 200):
            errors[key] = ["must be 1 to 200 characters"]
        elif key == "email" and value:
            try:
                validate_email(value)
            except DjangoValidationError:
                errors[key] = ["not an e-mail address"]
        elif key == "webhook_url" and value:
            parts = urlsplit(value)
            # Where the address may point (public addresses only, no redirects) is the delivery's
            # rule, applied on every call (dispatch.safehttp): a name can change what it resolves to.
            if parts.scheme not in ("http", "https") or not parts.hostname or len(value) > 2000:
                errors[key] = ["must be an http:// or https:// URL of at most 2000 characters"]
        elif key == "webhook_format" and value not in WebhookFormat.values:
            errors[key] = [f"must be one of {', '.join(WebhookFormat.values)}"]
        elif key == "time_zone":
            try:
                validate_time_zone(value)
            except ExpressionError as exc:
                errors[key] = [str(exc)]
        elif key in ("quiet_start", "quiet_end"):
            m = HHMM.match(value)
            if m is None:
                errors[key] = ["must be a wall time HH:MM (00:00 to 23:59), or null"]
                continue
            value = time(int(m.group(1)), int(m.group(2)))
        out[key] = value
    if not partial:
        for key in ("slug", "name"):
            if key not in fields:
                errors.setdefault(key, ["this field is required"])
    if errors:
        raise ValidationFailed(errors)
    return out


def owner_for(tenant: Tenant, slug) -> Owner | None:
    """The tenant's owner with this slug; None for None or ""; a 400 naming the field otherwise."""
    if slug in (None, ""):
        return None
    owner = Owner.objects.filter(tenant=tenant, slug=slug).first() if isinstance(slug, str) else None
    if owner is None:
        raise ValidationFailed({"owner": [f"no owner {slug!r} in this tenant"]})
    return owner


def get_owner(tenant: Tenant, slug: str) -> Owner:
    owner = Owner.objects.filter(tenant=tenant, slug=slug).first()
    if owner is None:
        raise OwnerNotFound(f"no owner {slug!r}")
    return owner


def _check_quiet(owner: Owner) -> None:
    if (owner.quiet_start is None) != (owner.quiet_end is None):
        raise ValidationFailed({"quiet_end" if owner.quiet_end is None else "quiet_start":
                                ["quiet hours need both a start and an end (or neither)"]})
    if owner.quiet_start is not None and owner.quiet_start == owner.quiet_end:
        raise ValidationFailed({"quiet_end": ["must differ from the start"]})


@transaction.atomic
def create_owner(tenant: Tenant, fields: dict, *, by: Actor, default: bool = False) -> Owner:
    clean = _clean(fields, partial=False)
    owner = Owner(tenant=tenant, **clean)
    _check_quiet(owner)
    try:
        with transaction.atomic():
            owner.save(force_insert=True)
    except IntegrityError:
        raise Conflict(f"an owner {clean['slug']!r} already exists") from None
    audit(AuditAction.OWNER_CREATE, by=by, obj_type="owner", obj_id=owner.id, tenant=tenant, after=owner_json(owner))
    if default:
        set_default_owner(tenant, owner, by=by)
    return owner


@transaction.atomic
def edit_owner(owner: Owner, fields: dict, *, by: Actor) -> Owner:
    clean = _clean(fields, partial=True)
    owner = Owner.objects.select_for_update().get(id=owner.id)
    before = owner_json(owner)
    for key, value in clean.items():
        setattr(owner, key, value)
    _check_quiet(owner)
    try:
        with transaction.atomic():
            owner.save()
    except IntegrityError:
        raise Conflict(f"an owner {clean.get('slug')!r} already exists") from None
    if owner_json(owner) != before:
        audit(AuditAction.OWNER_EDIT, by=by, obj_type="owner", obj_id=owner.id, tenant_id=owner.tenant_id, before=before,
              after=owner_json(owner))
    return owner


def set_default_owner(tenant: Tenant, owner: Owner | None, *, by: Actor) -> Tenant:
    """The owner of schedules created without one from now on (existing schedules keep theirs)."""
    if owner is not None and owner.tenant_id != tenant.id:
        raise ValidationFailed({"owner": ["not an owner of this tenant"]})
    before = tenant.default_owner.slug if tenant.default_owner_id else None
    Tenant.objects.filter(id=tenant.id).update(default_owner=owner)
    tenant.default_owner = owner
    audit(AuditAction.TENANT_DEFAULT_OWNER, by=by, obj_type="tenant", obj_id=tenant.id, tenant=tenant,
          before={"owner": before}, after={"owner": owner.slug if owner else None})
    return tenant
