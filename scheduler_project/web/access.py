"""Who may see what in the portal: the one scoping rule every portal view goes through.

- Operators are staff users: they see every tenant.
- Tenant users are non-staff users with a `TenantMembership`: they see only their tenants.
- Anyone else sees nothing but a message.

An object outside the caller's scope answers 404, never 403, so a tenant user cannot even learn
that another tenant's schedule or run exists.
"""

from functools import wraps

from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import render

from scheduler_project.web.clientaddr import client_address
from schedules.models import Tenant, TenantMembership
from schedules.services import Actor


def is_operator(user) -> bool:
    return bool(user.is_authenticated and user.is_active and user.is_staff)


def visible_tenant_ids(user) -> list | None:
    """None means every tenant (an operator); otherwise the ids of the user's tenants."""
    if is_operator(user):
        return None
    if not user.is_authenticated:
        return []
    cached = getattr(user, "_portal_tenant_ids", None)
    if cached is None:
        cached = list(TenantMembership.objects.filter(user=user).values_list("tenant_id", flat=True))
        user._portal_tenant_ids = cached
    return cached


def visible_tenants(user):
    ids = visible_tenant_ids(user)
    qs = Tenant.objects.all()
    return qs if ids is None else qs.filter(id__in=ids)


def scope(queryset, user, field: str = "tenant_id"):
    """The part of `queryset` the user may see; `field` names the tenant column."""
    ids = visible_tenant_ids(user)
    if ids is None:
        return queryset
    return queryset.filter(**{f"{field}__in": ids})


def get_scoped(queryset, user, field: str = "tenant_id", **lookup):
    """One object inside the user's scope, or Http404 (also for objects that exist elsewhere)."""
    try:
        return scope(queryset, user, field).get(**lookup)
    except (queryset.model.DoesNotExist, ValueError):
        raise Http404("not found")


def actor_for(request) -> Actor:
    """The audit identity of a portal or admin user's request."""
    return Actor(f"user:{request.user.get_username()}", client_address(request)[:64])


def portal_view(view):
    """Login required; a user who is neither an operator nor a tenant member gets a page that says
    so (status 403) instead of an empty portal that looks broken."""

    @login_required
    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if not is_operator(request.user) and not visible_tenant_ids(request.user):
            return render(request, "portal/no_access.html", status=403)
        return view(request, *args, **kwargs)

    return wrapper


def operator_only(view):
    """For operator-managed settings (target allowlists, webhooks, limits). Tenant users get 404,
    like any other page outside their scope."""

    @portal_view
    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if not is_operator(request.user):
            raise Http404("not found")
        return view(request, *args, **kwargs)

    return wrapper
