"""Tenants, their target allowlists, limits and quotas, API keys, signing secret and members:
one entry point per change. Every value is checked here, whoever sends it (API, portal, admin, command), and errors
name the field as a person reads it ("Max runs in flight"), since the portal shows them as they
are."""

import hashlib
import secrets
import unicodedata
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from scheduler_project.foundation.errors import Conflict, ServiceError, ValidationFailed
from scheduler_project.foundation.usernames import normalized_username
from schedules.models import (
    ApiKey,
    AuditAction,
    MemberRole,
    TargetPrefix,
    Tenant,
    TenantMembership,
    hash_api_key,
    new_signing_secret,
    tenant_set,
)
from schedules.services import SYSTEM, Actor, audit
from schedules.spread import MAX_SPREAD_SECONDS
from schedules.targets import url_allowed

KEY_PREFIX = "sk_"
MAX_LABEL = 200
MAX_URL = 2000
# Upper bound of every per-tenant and per-target cap: far above any real need, far below what the
# integer columns hold, so a 30-digit number is a message rather than a database error.
MAX_CAP = 1_000_000
MAX_QUOTA = 10_000_000
# "not given" for the optional arguments of update_tenant_settings (None means "no limit").
UNCHANGED = object()


class TooManyRequests(ServiceError):
    """Asked too often; `retryAfter` (seconds) says when it may work again."""

    status = 429


def _clean_text(value, *, field: str, max_length: int) -> str:
    text = "" if value is None else str(value).strip()
    if len(text) > max_length:
        raise ValidationFailed({field: [f"must be at most {max_length} characters (this is {len(text)})"]})
    for ch in text:
        # Controls (NUL among them: PostgreSQL refuses it) and lone surrogates cannot be stored or shown.
        if unicodedata.category(ch) in ("Cc", "Cs"):
            raise ValidationFailed({field: [f"may not contain the control character U+{ord(ch):04X}"]})
    return text


def parse_cap(raw, *, field: str, maximum: int = MAX_CAP, empty: str = "no limit") -> int | None:
    """A cap as given by a form or a caller: empty or None is None (what that means, `empty`, is
    said in the message); otherwise a whole number from 1 to `maximum` in ASCII digits (`²` and
    `١٢٣` are digits to Python's int(), not to people typing a limit)."""
    message = f"must be a whole number from 1 to {maximum:,}, or empty for {empty}"
    if raw is None:
        return None
    if isinstance(raw, bool):
        raise ValidationFailed({field: [message]})
    if isinstance(raw, int):
        value = raw
    else:
        text = str(raw).strip()
        if not text:
            return None
        if not (text.isascii() and text.isdigit()) or len(text) > len(str(maximum)):
            raise ValidationFailed({field: [message]})
        value = int(text)
    if not 1 <= value <= maximum:
        raise ValidationFailed({field: [message]})
    return value


@transaction.atomic
def create_tenant(slug: str, *, name: str = "", allow_targets=(), by: Actor = SYSTEM) -> Tenant:
    """Make a tenant, or add allowlist prefixes to an existing one (idempotent, for scripts)."""
    name = _clean_text(name, field="Name", max_length=200)
    tenant, created = Tenant.objects.get_or_create(slug=slug, defaults={"name": name or slug})
    if not created and name and tenant.name != name:
        tenant.name = name
        tenant.save(update_fields=["name"])
    for prefix in allow_targets:
        add_target_prefix(tenant, prefix, by=by)
    if created:
        audit(AuditAction.TENANT_CREATE, by=by, obj_type="tenant", obj_id=tenant.id, tenant=tenant, after={"slug": slug})
    return tenant


def _clean_url(raw, *, field: str, what: str = "URL") -> str:
    url = _clean_text(raw, field=field, max_length=MAX_URL)
    if url and not url_allowed(url, [url]):
        raise ValidationFailed({field: [f"{url[:200]!r} is not an absolute http(s) {what} without user info"]})
    return url


def add_target_prefix(tenant: Tenant, prefix: str, *, by: Actor, max_concurrency=None) -> TargetPrefix:
    """Allow `prefix`; `max_concurrency` (a number, its text, or empty/None for no limit) caps the
    runs in flight to its host."""
    errors: dict = {}
    try:
        prefix = _clean_url(prefix, field="Prefix", what="URL prefix")
        if not prefix:
            errors["Prefix"] = ["give an absolute http(s) URL prefix, e.g. https://hooks.example.com/"]
    except ValidationFailed as e:
        errors.update(e.errors)
    try:
        # Empty: the default target share of each worker's slots (runs.queue.claim).
        limit = parse_cap(max_concurrency, field="Max concurrency", empty="the default share")
    except ValidationFailed as e:
        errors.update(e.errors)  # said together with a bad prefix, not on the next try
    if errors:
        raise ValidationFailed(errors)
    target, created = TargetPrefix.objects.get_or_create(
        tenant=tenant, prefix=prefix, defaults={"max_concurrency": limit}
    )
    if created:
        audit(AuditAction.TENANT_ALLOW_TARGET, by=by, obj_type="tenant", obj_id=tenant.id, tenant=tenant,
              after={"prefix": prefix, "max_concurrency": limit})
    return target


def remove_target_prefix(target: TargetPrefix, *, by: Actor) -> None:
    audit(AuditAction.TENANT_REMOVE_TARGET, by=by, obj_type="tenant", obj_id=target.tenant_id, tenant_id=target.tenant_id,
          before={"prefix": target.prefix})
    target.delete()


@transaction.atomic
def create_api_key(tenant: Tenant, *, label: str = "", by: Actor = SYSTEM) -> tuple[ApiKey, str]:
    """Returns the key row and the raw key, which is shown once and never stored.

    Bounded per tenant, because each key has its own request rate limit: at most
    SCHEDULER_MAX_ACTIVE_KEYS_PER_TENANT keys not revoked, and at most
    SCHEDULER_KEY_CREATIONS_PER_HOUR made in any hour (revoked ones count: revoking and minting
    again must not be a way around it). The tenant row is locked so that concurrent requests
    are counted one after the other. Commands run on the server (`by` a system actor: quickstart,
    create_api_key) are neither limited nor counted: whoever runs them can change the settings."""
    label = _clean_text(label, field="label", max_length=MAX_LABEL)
    if not by.name.startswith("system"):
        _check_key_limits(tenant)
    raw = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey.objects.create(
        tenant=tenant, label=label, prefix=raw[:11], key_hash=hash_api_key(raw), created_by=by.name
    )
    audit(AuditAction.APIKEY_CREATE, by=by, obj_type="apikey", obj_id=key.id, tenant=tenant,
          after={"prefix": key.prefix, "label": label})
    return key, raw


def _check_key_limits(tenant: Tenant) -> None:
    Tenant.objects.select_for_update(no_key=True).filter(id=tenant.id).first()
    keys = ApiKey.objects.filter(tenant=tenant)
    active_cap = settings.SCHEDULER_MAX_ACTIVE_KEYS_PER_TENANT
    if active_cap and keys.filter(revoked_at__isnull=True).count() >= active_cap:
        raise ValidationFailed({"body": [
            f"this tenant already has {active_cap} active API keys, the most it may have; revoke one it no "
            "longer uses first"]})
    hourly = settings.SCHEDULER_KEY_CREATIONS_PER_HOUR
    if hourly:
        hour_ago = timezone.now() - timedelta(hours=1)
        recent = list(keys.filter(created_at__gte=hour_ago).exclude(created_by__startswith="system")
                      .order_by("created_at").values_list("created_at", flat=True)[:hourly])
        if len(recent) >= hourly:
            wait = max(1, int((recent[0] + timedelta(hours=1) - timezone.now()).total_seconds()) + 1)
            raise TooManyRequests(
                f"this tenant has created {hourly} API keys in the last hour, the most allowed; try again in {wait} s",
                retryAfter=wait,
            )


def revoke_api_key(key: ApiKey, *, by: Actor) -> ApiKey:
    updated = ApiKey.objects.filter(id=key.id, revoked_at__isnull=True).update(revoked_at=timezone.now())
    if not updated:
        raise Conflict("this key is already revoked")
    key.refresh_from_db()
    audit(AuditAction.APIKEY_REVOKE, by=by, obj_type="apikey", obj_id=key.id, tenant_id=key.tenant_id, after={"prefix": key.prefix})
    return key


@transaction.atomic
def _parse_default_spread(raw) -> int:
    if raw in (None, 0) or str(raw).strip() in ("", "0"):
        return 0
    return parse_cap(raw, field="Default spread", maximum=MAX_SPREAD_SECONDS)


def update_tenant_settings(tenant: Tenant, *, notification_url=UNCHANGED, max_in_flight=UNCHANGED,
                           max_schedules=UNCHANGED, max_subminute_schedules=UNCHANGED,
                           default_spread_seconds=UNCHANGED, by: Actor, check_url=None) -> Tenant:
    """The operator-managed settings of a tenant, given as values or as the text of a form: where
    its run notifications (webhooks) go (empty turns them off), its cap on runs in flight, its
    schedule quotas (empty: the deployment's default) and the spread window its new schedules get
    when they give none (empty: none). Everything given is checked before
    anything changes, so a refused value leaves every setting as it was. Each change is audited.

    `check_url(url) -> problem or None` is a further check of a new webhook URL that this app
    cannot make itself: whether the addresses it leads to are ones the outbound client will call
    (that policy is dispatch.safehttp's; the portal passes it in)."""
    changes, errors = {}, {}

    def read(name, parse, raw, **how):
        # Every value is read, so a form is told all of its problems at once, not one per save.
        if raw is UNCHANGED:
            return
        try:
            changes[name] = parse(raw, **how)
        except ValidationFailed as e:
            for field, messages in e.errors.items():
                errors.setdefault(field, []).extend(messages)

    read("notification_url", _clean_url, notification_url, field="Notification webhook URL")
    # Empty: the default tenant share of each worker's slots (runs.queue.claim).
    read("max_in_flight", parse_cap, max_in_flight, field="Max runs in flight", empty="the default share")
    read("max_schedules", parse_cap, max_schedules, field="Schedule quota", maximum=MAX_QUOTA)
    read("max_subminute_schedules", parse_cap, max_subminute_schedules, field="Sub-minute schedule quota",
         maximum=MAX_QUOTA)
    # The window new schedules get when they give none (schedules.spread); empty or 0 is none.
    read("default_spread_seconds", _parse_default_spread, default_spread_seconds)
    changed = {k: v for k, v in changes.items() if getattr(tenant, k) != v}
    if check_url and changed.get("notification_url"):
        # Last, after every other value was read: it may resolve a name.
        problem = check_url(changed["notification_url"])
        if problem:
            errors.setdefault("Notification webhook URL", []).append(problem)
    if errors:
        raise ValidationFailed(errors)
    if not changed:
        return tenant
    before = {k: getattr(tenant, k) for k in changed}
    for k, v in changed.items():
        setattr(tenant, k, v)
    tenant.save(update_fields=list(changed))
    for k in changed:
        audit(tenant_set(k), by=by, obj_type="tenant", obj_id=tenant.id, tenant=tenant,
              before={k: before[k]}, after={k: changed[k]})
    return tenant


def set_notification_url(tenant: Tenant, url: str, *, by: Actor) -> Tenant:
    """Where the tenant's run notifications (webhooks) go; empty turns them off. Operator-managed,
    like the target allowlist: the scheduler itself calls this URL."""
    return update_tenant_settings(tenant, notification_url=url, by=by)


def set_max_in_flight(tenant: Tenant, limit, *, by: Actor) -> Tenant:
    """The per-tenant cap on concurrently leased runs; None (or empty text) removes it."""
    return update_tenant_settings(tenant, max_in_flight=limit, by=by)


def rotate_signing_secret(tenant: Tenant, *, by: Actor) -> Tenant:
    """A new signing secret for the tenant's target calls and webhooks, at once: calls signed from
    now on use it, so targets must be given the new one (there is no overlap period). The audit
    entry records who and when, and the secrets' fingerprints only: whoever reads the audit log (a
    read-only operator, a tenant viewer) learns no character of either."""
    old = tenant.signing_secret
    tenant.signing_secret = new_signing_secret()
    tenant.save(update_fields=["signing_secret"])
    audit(AuditAction.TENANT_ROTATE_SECRET, by=by, obj_type="tenant", obj_id=tenant.id, tenant=tenant,
          before={"secretFingerprint": secret_fingerprint(old)},
          after={"secretFingerprint": secret_fingerprint(tenant.signing_secret)})
    return tenant


def secret_fingerprint(secret: str) -> str:
    """A short name for a secret that reveals none of it: the start of its SHA-256."""
    return "sha256:" + hashlib.sha256(secret.encode()).hexdigest()[:12]


def _clean_role(role) -> str:
    if role not in MemberRole.values:
        raise ValidationFailed({"Role": [f"must be one of {', '.join(MemberRole.values)}"]})
    return role


def _keep_an_admin(membership: TenantMembership) -> None:
    # Checked under the tenant's row lock, so two admins cannot demote each other at once.
    Tenant.objects.select_for_update(no_key=True).filter(id=membership.tenant_id).first()
    others = TenantMembership.objects.filter(tenant_id=membership.tenant_id, role=MemberRole.ADMIN).exclude(
        id=membership.id)
    if membership.role == MemberRole.ADMIN and not others.exists():
        raise Conflict("this is the tenant's last admin: make another member admin first (an operator can also "
                       "change memberships in the admin)")


@transaction.atomic
def add_member(tenant: Tenant, username: str, *, role: str, by: Actor) -> TenantMembership:
    """Give an existing portal account a role in the tenant (or change the role it has)."""
    role = _clean_role(role)
    # Folded as the sign-in form folds it, so the name found is the account that signs in with it.
    username = normalized_username(_clean_text(username, field="Username", max_length=150))
    user = get_user_model().objects.filter(username=username, is_active=True).first()
    if user is None:
        raise ValidationFailed({"Username": [f"there is no active account {username[:150]!r}"]})
    membership, created = TenantMembership.objects.get_or_create(user=user, tenant=tenant, defaults={"role": role})
    if not created and membership.role != role:
        return set_member_role(membership, role, by=by)
    if created:
        audit(AuditAction.TENANT_ADD_MEMBER, by=by, obj_type="tenant", obj_id=tenant.id, tenant=tenant,
              after={"user": username, "role": role})
    return membership


@transaction.atomic
def set_member_role(membership: TenantMembership, role: str, *, by: Actor) -> TenantMembership:
    role = _clean_role(role)
    if membership.role == role:
        return membership
    if role != MemberRole.ADMIN:
        _keep_an_admin(membership)
    before = membership.role
    membership.role = role
    membership.save(update_fields=["role"])
    audit(AuditAction.TENANT_SET_MEMBER_ROLE, by=by, obj_type="tenant", obj_id=membership.tenant_id,
          tenant_id=membership.tenant_id, before={"user": membership.user.get_username(), "role": before},
          after={"user": membership.user.get_username(), "role": role})
    return membership


@transaction.atomic
def remove_member(membership: TenantMembership, *, by: Actor) -> None:
    _keep_an_admin(membership)
    audit(AuditAction.TENANT_REMOVE_MEMBER, by=by, obj_type="tenant", obj_id=membership.tenant_id,
          tenant_id=membership.tenant_id, before={"user": membership.user.get_username(), "role": membership.role})
    membership.delete()
