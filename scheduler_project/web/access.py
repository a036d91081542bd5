"""Who may see what and do what, in the portal and the admin: the one place that decides.

Seeing:
- Operators see every tenant: superusers, and staff users with the `view_all_tenants`
  permission (both built-in roles carry it).
- Tenant users (a `TenantMembership`) see only their tenants.
- Anyone else sees nothing but a message; a staff account without a role is no operator.

Doing: `can(user, capability, tenant_id)`, with the capabilities below. An operator needs the
capability's permission (the "Operator" role has all of them, the "Read-only operator" role none,
so it sees no tenant's signing secret; superusers have all). A tenant member's role decides for their own tenants: a viewer sees and
changes nothing; an admin creates, edits and operates the tenant's schedules and runs, manages its
API keys and members, and sees and rotates its signing secret. The tenant settings (allowlist,
webhook, caps, quotas) stay with operators. The API is not a user's: an API key acts for its one
tenant (scheduler_project.web.api).

An object outside the caller's scope answers 404, never 403, so a tenant user cannot even learn
that another tenant's schedule or run exists; an action on an object the caller may see but not
change answers 403.
"""

from functools import wraps

from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import Group, Permission
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import render

from scheduler_project.web.clientaddr import client_address
from schedules.models import MemberRole, Tenant, TenantMembership
from schedules.services import Actor

# capability -> the permission that gives it to an operator (schedules.models.Tenant.Meta).
CAPABILITIES = {
    "view_all": "schedules.view_all_tenants",
    "operate_runs": "schedules.operate_runs",
    # Creating and editing schedules too: the same people who pause and trigger them.
    "operate_schedules": "schedules.operate_schedules",
    "manage_keys": "schedules.manage_api_keys",
    "manage_tenants": "schedules.manage_tenants",
    # Members and the signing secret: operators who manage tenants; and a tenant's own admins.
    "manage_members": "schedules.manage_tenants",
    "rotate_secret": "schedules.manage_tenants",
    # Seeing the signing secret: operators who manage tenants (the Operator role), never the
    # read-only one: whoever holds a tenant's secret can sign calls its targets accept.
    "view_secret": "schedules.manage_tenants",
}
# What a tenant admin may do to their own tenants without any permission; a viewer, nothing.
MEMBER_CAPABILITIES = frozenset({"operate_runs", "operate_schedules", "manage_keys", "manage_members",
                                 "rotate_secret", "view_secret"})
ROLE_OPERATOR = "Operator"
ROLE_READ_ONLY = "Read-only operator"
# What each capability lets a person do, for the 403 page that says which role is needed.
CAPABILITY_TEXT = {
    "view_all": "Seeing every tenant",
    "operate_runs": "Retrying and canceling runs",
    "operate_schedules": "Creating, editing, pausing, triggering and archiving schedules",
    "manage_keys": "Managing API keys",
    "manage_tenants": "Changing tenant settings",
    "manage_members": "Managing a tenant's members",
    "rotate_secret": "Rotating a tenant's signing secret",
    "view_secret": "Seeing a tenant's signing secret",
}


def _active(user) -> bool:
    return bool(user is not None and user.is_authenticated and user.is_active)


def _member_roles(user) -> dict:
    """{tenant id: role} of the user's memberships, read once per request (per user object)."""
    cached = getattr(user, "_portal_tenant_roles", None)
    if cached is None:
        cached = dict(TenantMembership.objects.filter(user=user).values_list("tenant_id", "role"))
        user._portal_tenant_roles = cached
    return cached


def _member_tenant_ids(user) -> list:
    return list(_member_roles(user))


def _admin_tenant_ids(user) -> list:
    return [t for t, r in _member_roles(user).items() if r == MemberRole.ADMIN]


def member_role(user, tenant_id) -> str | None:
    """The user's role in one tenant ("viewer", "admin"), or None without a membership."""
    if not _active(user):
        return None
    return _member_roles(user).get(tenant_id)


def has_operator_permission(user, capability: str) -> bool:
    """The capability across every tenant: a superuser, or staff holding its permission."""
    if capability not in CAPABILITIES:
        raise ValueError(f"unknown capability {capability!r}")
    if not _active(user):
        return False
    if user.is_superuser:
        return True
    return bool(user.is_staff and user.has_perm(CAPABILITIES[capability]))


def can(user, capability: str, tenant_id=None) -> bool:
    """May `user` do `capability`, to `tenant_id`'s objects (or, without one, to every tenant's)?"""
    if has_operator_permission(user, capability):
        return True
    if tenant_id is None or capability not in MEMBER_CAPABILITIES or not _active(user):
        return False
    return _member_roles(user).get(tenant_id) == MemberRole.ADMIN


def operable_tenant_ids(user, capability: str) -> list | None:
    """The tenants whose objects the user may `capability`: None means every tenant."""
    if has_operator_permission(user, capability):
        return None
    if capability not in MEMBER_CAPABILITIES or not _active(user):
        return []
    return _admin_tenant_ids(user)


def needed_role_text(user, capability: str, tenant_id=None) -> str:
    """Which role `capability` needs, and which one the user has: what the 403 page says."""
    needed = f"the {ROLE_OPERATOR} role"
    if capability in MEMBER_CAPABILITIES:
        needed += ", or the admin role in this tenant"
    text = f"{CAPABILITY_TEXT.get(capability, capability.replace('_', ' ').capitalize())} needs {needed}."
    role_here = member_role(user, tenant_id) if tenant_id is not None else None
    if role_here:
        text += f" Your account is a {role_here} in this tenant."
    elif is_operator(user) and not user.is_superuser:
        groups = ", ".join(sorted(user.groups.values_list("name", flat=True))) or "no role"
        text += f" Your account is an operator with: {groups}."
    return text


def require(user, capability: str, tenant_id=None) -> None:
    if not can(user, capability, tenant_id):
        raise PermissionDenied(needed_role_text(user, capability, tenant_id))


def is_operator(user) -> bool:
    """Sees every tenant (either role, or a superuser)."""
    return has_operator_permission(user, "view_all")


def visible_tenant_ids(user) -> list | None:
    """None means every tenant (an operator); otherwise the ids of the user's tenants."""
    if is_operator(user):
        return None
    if not _active(user):
        return []
    return _member_tenant_ids(user)


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
    """For operator-managed settings (target allowlists, webhooks, limits, quotas). Tenant users
    get 404, like any other page outside their scope; an operator without `manage_tenants` (the
    read-only role) gets 403."""

    @portal_view
    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if not is_operator(request.user) and not has_operator_permission(request.user, "manage_tenants"):
            raise Http404("not found")
        require(request.user, "manage_tenants")
        return view(request, *args, **kwargs)

    return wrapper


# The built-in roles, as migration schedules/0005 creates them; `role()` makes sure one exists
# (for set-up scripts and tests: a flushed test database keeps the permissions, not the groups).
ROLES = {
    ROLE_OPERATOR: [perm.split(".", 1)[1] for perm in CAPABILITIES.values()],
    ROLE_READ_ONLY: [CAPABILITIES["view_all"].split(".", 1)[1]],
}


def role(name: str):
    group, _ = Group.objects.get_or_create(name=name)
    group.permissions.add(*Permission.objects.filter(content_type__app_label="schedules",
                                                     content_type__model="tenant", codename__in=ROLES[name]))
    return group
