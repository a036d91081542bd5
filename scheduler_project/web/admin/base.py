"""What the admin lets a user see and do, asked of scheduler_project.web.access like the portal.

Operators (either role) may read every registered model; changes are actions that call the
services, each allowed only with its capability (`@admin.action(permissions=[...])` makes Django
ask `has_<capability>_permission`, which hides the action and refuses it if posted anyway). Django's
own model permissions still work on top, for accounts an administrator set up by hand."""

from django.contrib import admin

from scheduler_project.web.access import has_operator_permission, is_operator


class OperatorAdmin(admin.ModelAdmin):
    def has_module_permission(self, request):
        return is_operator(request.user) or super().has_module_permission(request)

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
