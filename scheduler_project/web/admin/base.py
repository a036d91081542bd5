"""What the admin lets a user see and do, asked of scheduler_project.web.access like the portal.

Operators (either role) may read every registered model; changes are actions that call the
services, each allowed only with its capability (`@admin.action(permissions=[...])` makes Django
ask `has_<capability>_permission`, which hides the action and refuses it if posted anyway). Django's
own model permissions still work on top, for accounts an administrator set up by hand."""

from datetime import timezone

from django.contrib import admin
from django.core.exceptions import FieldDoesNotExist
from django.db import models

from scheduler_project.web.access import has_operator_permission, is_operator


def _utc_column(field: models.DateTimeField):
    """A list column showing a time with its zone ("2026-03-29 01:30:00 UTC"): the admin's own
    rendering drops the zone."""

    @admin.display(description=f"{field.verbose_name} (UTC)", ordering=field.name, empty_value="—")
    def column(obj):
        value = getattr(obj, field.attname)
        return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC") if value else None

    column.__name__ = f"{field.name}_utc"
    return column


def _with_zones(model, names):
    out = []
    for name in names:
        try:
            field = model._meta.get_field(name) if isinstance(name, str) else None
        except FieldDoesNotExist:  # a method or callable column, shown as it is
            field = None
        out.append(_utc_column(field) if isinstance(field, models.DateTimeField) else name)
    return out


class OperatorAdmin(admin.ModelAdmin):
    def has_module_permission(self, request):
        return is_operator(request.user) or super().has_module_permission(request)

    def get_list_display(self, request):
        return _with_zones(self.model, super().get_list_display(request))

    def get_actions(self, request):
        # Nothing here is deleted (keys are revoked, schedules archived), so no bulk delete either;
        # admins that do delete (memberships) keep Django's action.
        actions = super().get_actions(request)
        if not self.has_delete_permission(request):
            actions.pop("delete_selected", None)
        return actions

    def has_view_permission(self, request, obj=None):
        return is_operator(request.user) or super().has_view_permission(request, obj)

    def has_operate_runs_permission(self, request):
        return has_operator_permission(request.user, "operate_runs")

    def has_operate_schedules_permission(self, request):
        return has_operator_permission(request.user, "operate_schedules")

    def has_manage_keys_permission(self, request):
        return has_operator_permission(request.user, "manage_keys")

    def has_manage_tenants_permission(self, request):
        return has_operator_permission(request.user, "manage_tenants")


class OperatorInline(admin.TabularInline):
    """Read-only rows shown inside another model's page."""

    extra = 0
    can_delete = False

    def has_view_permission(self, request, obj=None):
        return is_operator(request.user) or super().has_view_permission(request, obj)

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
