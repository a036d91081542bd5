"""Tenants: their target allowlists (operators), API keys (created once, revoked), signing secret
(seen and rotated by operators and the tenant's admins), members and their roles, notification
webhook, caps and quotas; every change through `schedules.tenants`, which checks every value."""

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from runs import retention
from scheduler_project.web.access import (
    actor_for,
    can,
    get_scoped,
    has_operator_permission,
    is_operator,
    member_role,
    operator_only,
    portal_view,
    require,
    visible_tenants,
)
from scheduler_project.web.portal.common import Confirm, call_service, confirm_response, confirmed, render_view
from scheduler_project.web.portal.webhooks import webhook_address_check
from schedules import services as schedule_services
from schedules import tenants as tenant_services
from schedules.models import ApiKey, MemberRole, TargetPrefix, Tenant, TenantMembership

# The settings form's fields and the service's arguments; a field the form does not carry is
# left as it is.
SETTINGS_FIELDS = ("notification_url", "max_in_flight", "max_schedules", "max_subminute_schedules",
                   "default_spread_seconds")


@portal_view
def tenant_list(request):
    tenants = visible_tenants(request.user)
    if not is_operator(request.user) and tenants.count() == 1:
        return redirect("schedules-tenant-detail", pk=tenants.get().id)
    return render_view(request, "tenants/list.html", {"tenants": tenants})


def _tenant(request, pk) -> Tenant:
    return get_scoped(Tenant.objects.all(), request.user, field="id", id=pk)


def _context(request, tenant, **extra):
    can_members = can(request.user, "manage_members", tenant.id)
    return {
        "tenant": tenant,
        "targets": tenant.targets.all(),
        "keys": tenant.api_keys.all(),
        "members": tenant.members.select_related("user").order_by("user__username"),
        "roles": MemberRole.values,
        "my_role": member_role(request.user, tenant.id),
        "is_operator": is_operator(request.user),
        "can_manage_keys": can(request.user, "manage_keys", tenant.id),
        "can_manage_members": can_members,
        # Adding someone by username is for operators: it would let a tenant admin learn which
        # account names exist.
        "can_add_members": has_operator_permission(request.user, "manage_members"),
        "can_view_secret": can(request.user, "view_secret", tenant.id),
        "can_rotate_secret": can(request.user, "rotate_secret", tenant.id),
        "can_manage_tenant": has_operator_permission(request.user, "manage_tenants"),
        **extra,
    }


def _no_store(response):
    # Pages that show the signing secret or a new key must not be kept by a browser or a proxy.
    response["Cache-Control"] = "no-store"
    return response


@portal_view
def tenant_detail(request, pk):
    tenant = _tenant(request, pk)
    # How long this tenant's history is kept and when the next removal is due (its own policy or
    # the defaults); the full page only, not the key fragment.
    ctx = _context(request, tenant, retention=retention.status(tenant_ids=[tenant.id]),
                   quota_use=schedule_services.quota_use(tenant))
    return _no_store(render_view(request, "tenants/detail.html", ctx, partial="keys"))


@portal_view
@require_POST
def key_create(request, pk):
    tenant = _tenant(request, pk)
    require(request.user, "manage_keys", tenant.id)
    ok, made = call_service(request, tenant_services.create_api_key, tenant, label=request.POST.get("label", ""),
                            by=actor_for(request))
    ctx = _context(request, tenant, new_key=made[1] if ok else None, new_key_row=made[0] if ok else None)
    # The raw key is in this response only: it is not stored, so the page must not be cached.
    return _no_store(render_view(request, "tenants/detail.html", ctx, partial="keys"))


@portal_view
@require_POST
def key_revoke(request, pk, key_id):
    tenant = _tenant(request, pk)
    require(request.user, "manage_keys", tenant.id)
    key = get_object_or_404(ApiKey, id=key_id, tenant=tenant)
    if not confirmed(request) and key.revoked_at is None:
        confirm = Confirm(
            title=f"Revoke key {key.prefix}…{' (' + key.label + ')' if key.label else ''}?",
            text="Anything using it gets 401 from the next request on. This cannot be undone; a new key can be made.",
            action=reverse("schedules-key-revoke", args=[tenant.id, key.id]), yes="Yes, revoke the key",
            back=reverse("schedules-tenant-detail", args=[tenant.id]), danger=True, target="keys")
        return confirm_response(request, confirm, template="tenants/detail.html", partial="keys",
                                context=_context(request, tenant))
    call_service(request, tenant_services.revoke_api_key, key, by=actor_for(request),
                 success=f"Revoked key {key.prefix}…; requests made with it now answer 401.")
    if request.htmx:
        return render_view(request, "tenants/detail.html", _context(request, tenant), partial="keys")
    return redirect("schedules-tenant-detail", pk=tenant.id)


@portal_view
@require_POST
def secret_rotate(request, pk):
    tenant = _tenant(request, pk)
    require(request.user, "rotate_secret", tenant.id)
    back = reverse("schedules-tenant-detail", args=[tenant.id]) + "#secret"
    if not confirmed(request):
        return confirm_response(request, Confirm(
            title="Rotate the signing secret?",
            text="Within a few seconds every target call and webhook is signed with a new secret, and the old one "
                 "stops working; until your targets have the new one, they will refuse the signatures.",
            action=reverse("schedules-secret-rotate", args=[tenant.id]), yes="Yes, rotate it", back=back,
            danger=True))
    call_service(request, tenant_services.rotate_signing_secret, tenant, by=actor_for(request),
                 success="Rotated: give your targets the new secret below.")
    return redirect(back)


@portal_view
@require_POST
def member_add(request, pk):
    tenant = _tenant(request, pk)
    if not has_operator_permission(request.user, "manage_members"):
        raise PermissionDenied("only operators add members; ask one")
    username = request.POST.get("username", "").strip()
    call_service(request, tenant_services.add_member, tenant, username, role=request.POST.get("role", ""),
                 by=actor_for(request), success=f"{username[:150]} is a member now.")
    return redirect(reverse("schedules-tenant-detail", args=[tenant.id]) + "#members")


@portal_view
@require_POST
def member_change(request, pk, member_id):
    """Change a member's role, or remove them (`remove`), after a confirmation."""
    tenant = _tenant(request, pk)
    require(request.user, "manage_members", tenant.id)
    membership = get_object_or_404(TenantMembership.objects.select_related("user"), id=member_id, tenant=tenant)
    back = reverse("schedules-tenant-detail", args=[tenant.id]) + "#members"
    name = membership.user.get_username()
    if request.POST.get("remove"):
        if not confirmed(request):
            return confirm_response(request, Confirm(
                title=f"Remove {name} from {tenant.slug}?",
                text="They no longer see this tenant's schedules, runs and keys in the portal. Their account stays.",
                action=reverse("schedules-member-change", args=[tenant.id, membership.id]), yes=f"Yes, remove {name}",
                back=back, danger=True, fields={"remove": "1"}))
        call_service(request, tenant_services.remove_member, membership, by=actor_for(request),
                     success=f"Removed {name}.")
    else:
        role = request.POST.get("role", "")
        call_service(request, tenant_services.set_member_role, membership, role, by=actor_for(request),
                     success=f"{name} is {'an' if role == 'admin' else 'a'} {role} now.")
    return redirect(back)


@operator_only
@require_POST
def target_add(request, pk):
    tenant = _tenant(request, pk)
    prefix = request.POST.get("prefix", "").strip()
    call_service(request, tenant_services.add_target_prefix, tenant, prefix, by=actor_for(request),
                 max_concurrency=request.POST.get("max_concurrency", ""), success=f"Allowed {prefix[:200]}")
    return redirect("schedules-tenant-detail", pk=tenant.id)


@operator_only
@require_POST
def target_remove(request, pk, target_id):
    tenant = _tenant(request, pk)
    target = get_object_or_404(TargetPrefix, id=target_id, tenant=tenant)
    if not confirmed(request):
        return confirm_response(request, Confirm(
            title=f"Remove {target.prefix} from {tenant.slug}'s allowlist?",
            text="New schedules and edits may no longer call URLs under it. Schedules that already call it keep "
                 "their version, but the workers refuse every call to it within a few seconds.",
            action=reverse("schedules-target-remove", args=[tenant.id, target.id]), yes="Yes, remove the prefix",
            back=reverse("schedules-tenant-detail", args=[tenant.id]), danger=True))
    call_service(request, tenant_services.remove_target_prefix, target, by=actor_for(request),
                 success=f"Removed {target.prefix}; new schedules and edits may no longer call it.")
    return redirect("schedules-tenant-detail", pk=tenant.id)


@operator_only
@require_POST
def tenant_settings(request, pk):
    tenant = _tenant(request, pk)
    given = {name: request.POST[name] for name in SETTINGS_FIELDS if name in request.POST}
    warnings = []

    def check_url(url):
        problem, warning = webhook_address_check(url)
        if warning:
            warnings.append(warning)
        return problem

    ok, _ = call_service(request, tenant_services.update_tenant_settings, tenant, by=actor_for(request),
                         check_url=check_url, **given)
    if ok:
        messages.success(request, "Settings saved.")
        for w in warnings:
            messages.warning(request, f"Webhook: {w}; the relay checks them at every delivery and refuses private "
                                      "addresses there.")
    return redirect("schedules-tenant-detail", pk=tenant.id)
