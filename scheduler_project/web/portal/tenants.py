"""Tenants: their target allowlists (operators), API keys (created once, revoked) and
notification webhook; every change through `schedules.tenants`."""

from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from scheduler_project.web.access import actor_for, get_scoped, is_operator, operator_only, portal_view, visible_tenants
from schedules import tenants as tenant_services
from schedules.models import ApiKey, TargetPrefix, Tenant
from scheduler_project.web.portal.common import call_service, render_view


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
    label = request.POST.get("label", "").strip()[:200]
    ok, made = call_service(request, tenant_services.create_api_key, tenant, label=label, by=actor_for(request))
    ctx = _context(request, tenant, new_key=made[1] if ok else None, new_key_row=made[0] if ok else None)
    # The raw key is in this response only: it is not stored, so the page must not be cached.
    response = render_view(request, "tenants/detail.html", ctx, partial="keys")
    response["Cache-Control"] = "no-store"
    return response


@portal_view
@require_POST
def key_revoke(request, pk, key_id):
    tenant = _tenant(request, pk)
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
    raw = request.POST.get("max_concurrency", "").strip()
    limit = int(raw) if raw.isdigit() and int(raw) > 0 else None
    call_service(request, tenant_services.add_target_prefix, tenant, prefix, by=actor_for(request),
                 max_concurrency=limit, success=f"Allowed {prefix}")
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
    by = actor_for(request)
    ok, _ = call_service(request, tenant_services.set_notification_url, tenant,
                         request.POST.get("notification_url", ""), by=by)
    raw = request.POST.get("max_in_flight", "").strip()
    if ok:
        if raw and not raw.isdigit():
            messages.error(request, "max in flight must be a whole number, or empty for no limit")
        else:
            ok, _ = call_service(request, tenant_services.set_max_in_flight, tenant, int(raw) if raw else None, by=by)
            if ok:
                messages.success(request, "Settings saved.")
    return redirect("schedules-tenant-detail", pk=tenant.id)
