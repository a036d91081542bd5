"""Tenants: their target allowlists (operators), API keys (created once, revoked) and
notification webhook, caps and quotas; every change through `schedules.tenants`, which checks
every value."""

from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from scheduler_project.web.access import (actor_for, can, get_scoped, has_operator_permission, is_operator,
                                          operator_only, portal_view, require, visible_tenants)
from schedules import tenants as tenant_services
from schedules.models import ApiKey, TargetPrefix, Tenant
from scheduler_project.web.portal.common import call_service, render_view

# The settings form's fields and the service's arguments; a field the form does not carry is
# left as it is.
SETTINGS_FIELDS = ("notification_url", "max_in_flight", "max_schedules", "max_subminute_schedules")


@portal_view
def tenant_list(request):
    tenants = visible_tenants(request.user)
    if not is_operator(request.user) and tenants.count() == 1:
        return redirect("schedules-tenant-detail", pk=tenants.get().id)
    return render_view(request, "tenants/list.html", {"tenants": tenants})


def _tenant(request, pk) -> Tenant:
    return get_scoped(Tenant.objects.all(), request.user, field="id", id=pk)


def _context(request, tenant, **extra):
    return {
        "tenant": tenant,
        "targets": tenant.targets.all(),
        "keys": tenant.api_keys.all(),
        "is_operator": is_operator(request.user),
        "can_manage_keys": can(request.user, "manage_keys", tenant.id),
        "can_manage_tenant": has_operator_permission(request.user, "manage_tenants"),
        **extra,
    }


@portal_view
def tenant_detail(request, pk):
    tenant = _tenant(request, pk)
    return render_view(request, "tenants/detail.html", _context(request, tenant), partial="keys")


@portal_view
@require_POST
def key_create(request, pk):
    tenant = _tenant(request, pk)
    require(request.user, "manage_keys", tenant.id)
    ok, made = call_service(request, tenant_services.create_api_key, tenant, label=request.POST.get("label", ""),
                            by=actor_for(request))
    ctx = _context(request, tenant, new_key=made[1] if ok else None, new_key_row=made[0] if ok else None)
    # The raw key is in this response only: it is not stored, so the page must not be cached.
    response = render_view(request, "tenants/detail.html", ctx, partial="keys")
    response["Cache-Control"] = "no-store"
    return response


@portal_view
@require_POST
def key_revoke(request, pk, key_id):
    tenant = _tenant(request, pk)
    require(request.user, "manage_keys", tenant.id)
    key = get_object_or_404(ApiKey, id=key_id, tenant=tenant)
    call_service(request, tenant_services.revoke_api_key, key, by=actor_for(request),
                 success=f"Revoked key {key.prefix}…; requests made with it now answer 401.")
    if request.htmx:
        return render_view(request, "tenants/detail.html", _context(request, tenant), partial="keys")
    return redirect("schedules-tenant-detail", pk=tenant.id)


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
    call_service(request, tenant_services.remove_target_prefix, target, by=actor_for(request),
                 success=f"Removed {target.prefix}; new schedules and edits may no longer call it.")
    return redirect("schedules-tenant-detail", pk=tenant.id)


@operator_only
@require_POST
def tenant_settings(request, pk):
    tenant = _tenant(request, pk)
    given = {name: request.POST[name] for name in SETTINGS_FIELDS if name in request.POST}
    ok, _ = call_service(request, tenant_services.update_tenant_settings, tenant, by=actor_for(request), **given)
    if ok:
        messages.success(request, "Settings saved.")
    return redirect("schedules-tenant-detail", pk=tenant.id)
