"""Tenants, memberships, API keys, schedules and the audit log in the admin. Reads for operators
(either role); the changes are actions and pages that call the services, each allowed only with
its capability (scheduler_project.web.access). Nothing is deleted here: keys are revoked and
schedules archived, so their history stays."""

from django.contrib import admin, messages

from scheduler_project.errors import ServiceError
from scheduler_project.web.access import actor_for as admin_actor
from scheduler_project.web.access import has_operator_permission
from scheduler_project.web.admin.base import OperatorAdmin, OperatorInline
from schedules.models import ApiKey, AuditEntry, Schedule, ScheduleVersion, TargetPrefix, Tenant, TenantMembership


class TargetPrefixInline(OperatorInline):
    """Read here; changed on the portal's tenant page, which goes through
    `schedules.tenants.add_target_prefix` / `remove_target_prefix` and so is audited."""

    model = TargetPrefix
    fields = ("prefix", "max_concurrency", "created_at")
    readonly_fields = fields


@admin.register(Tenant)
class TenantAdmin(OperatorAdmin):
    list_display = ("slug", "name", "max_in_flight", "max_schedules", "max_subminute_schedules", "notification_url",
                    "created_at")
    search_fields = ("slug", "name")
    inlines = [TargetPrefixInline]
    # The allowlist, webhook, caps and quotas change through the portal's tenant page (audited
    # services); a direct admin edit would leave no audit entry.
    readonly_fields = ("signing_secret", "notification_url", "max_in_flight", "max_schedules",
                       "max_subminute_schedules", "created_at")

    def has_change_permission(self, request, obj=None):
        return has_operator_permission(request.user, "manage_tenants") or super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(TenantMembership)
class TenantMembershipAdmin(OperatorAdmin):
    list_display = ("user", "tenant", "role")
    list_filter = ("role",)
    list_select_related = ("user", "tenant")

    def has_add_permission(self, request):
        return self.has_manage_tenants_permission(request) or super().has_add_permission(request)

    def has_change_permission(self, request, obj=None):
        return self.has_manage_tenants_permission(request) or super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        return self.has_manage_tenants_permission(request) or super().has_delete_permission(request, obj)


@admin.register(ApiKey)
class ApiKeyAdmin(OperatorAdmin):
    """Keys are made with `manage.py create_api_key` or in the portal (shown once); here they
    can be read and revoked, never created, edited or deleted."""

    list_display = ("prefix", "label", "tenant", "created_at", "last_used_at", "revoked_at")
    list_filter = ("tenant",)
    readonly_fields = [f.name for f in ApiKey._meta.fields]
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.action(description="Revoke selected keys", permissions=["manage_keys"])
    def revoke(self, request, queryset):
        from schedules.tenants import revoke_api_key

        done = 0
        for key in queryset.filter(revoked_at__isnull=True):
            try:
                revoke_api_key(key, by=admin_actor(request))
                done += 1
            except ServiceError as e:
                self.message_user(request, f"{key}: {e.message}", level=messages.WARNING)
        self.message_user(request, f"revoked {done} key{'' if done == 1 else 's'}")


class VersionInline(OperatorInline):
    model = ScheduleVersion
    fields = ("version", "expression", "time_zone", "target_url", "created_by", "created_at", "changes")
    readonly_fields = fields


@admin.register(Schedule)
class ScheduleAdmin(OperatorAdmin):
    list_display = ("name", "id", "tenant", "owner", "version", "enabled", "status", "next_run_at")
    list_filter = ("enabled", "status", "tenant", "owner")
    search_fields = ("name", "id")
    list_select_related = ("tenant", "owner")
    show_full_result_count = False
    inlines = [VersionInline]
    actions = ["pause", "resume"]
    # Edits go through the API or the portal so that they make a new version; the admin reads.
    readonly_fields = [f.name for f in Schedule._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def _each(self, request, queryset, fn, label):
        done = 0
        for s in queryset:
            try:
                fn(s, by=admin_actor(request))
                done += 1
            except ServiceError as e:
                self.message_user(request, f"{s}: {e.message}", level=messages.WARNING)
        self.message_user(request, f"{label} {done} schedule{'' if done == 1 else 's'}")

    @admin.action(description="Pause selected schedules", permissions=["operate_schedules"])
    def pause(self, request, queryset):
        from runs.schedule_changes import pause_schedule

        self._each(request, queryset.filter(enabled=True), pause_schedule, "paused")

    @admin.action(description="Resume selected schedules", permissions=["operate_schedules"])
    def resume(self, request, queryset):
        from runs.schedule_changes import resume_schedule

        self._each(request, queryset.filter(enabled=False), resume_schedule, "resumed")


@admin.register(ScheduleVersion)
class ScheduleVersionAdmin(OperatorAdmin):
    list_display = ("schedule", "version", "expression", "time_zone", "created_by", "created_at")
    readonly_fields = [f.name for f in ScheduleVersion._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(AuditEntry)
class AuditEntryAdmin(OperatorAdmin):
    list_display = ("at", "actor", "action", "object_type", "object_id", "tenant", "remote_addr")
    list_filter = ("action", "tenant")
    search_fields = ("object_id", "actor")
    readonly_fields = [f.name for f in AuditEntry._meta.fields]
    show_full_result_count = False

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
