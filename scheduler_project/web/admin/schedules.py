from django.contrib import admin, messages

from scheduler_project.errors import ServiceError
from schedules.models import ApiKey, AuditEntry, Schedule, ScheduleVersion, TargetPrefix, Tenant, TenantMembership
from scheduler_project.web.access import actor_for as admin_actor


class TargetPrefixInline(admin.TabularInline):
    """Read here; changed on the portal's tenant page, which goes through
    `schedules.tenants.add_target_prefix` / `remove_target_prefix` and so is audited."""

    model = TargetPrefix
    extra = 0
    can_delete = False
    fields = ("prefix", "max_concurrency", "created_at")
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "max_in_flight", "notification_url", "created_at")
    search_fields = ("slug", "name")
    inlines = [TargetPrefixInline]
    # The allowlist, webhook and in-flight cap change through the portal's tenant page (audited
    # services); a direct admin edit would leave no audit entry.
    readonly_fields = ("signing_secret", "notification_url", "max_in_flight", "created_at")


@admin.register(TenantMembership)
class TenantMembershipAdmin(admin.ModelAdmin):
    list_display = ("user", "tenant")
    list_select_related = ("user", "tenant")


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    """Keys are made with `manage.py create_api_key` or in the portal (shown once); here they
    can be read and revoked, never created or edited."""

    list_display = ("prefix", "label", "tenant", "created_at", "last_used_at", "revoked_at")
    list_filter = ("tenant",)
    readonly_fields = [f.name for f in ApiKey._meta.fields]
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False

    @admin.action(description="Revoke selected keys")
    def revoke(self, request, queryset):
        from schedules.tenants import revoke_api_key

        done = 0
        for key in queryset.filter(revoked_at__isnull=True):
            revoke_api_key(key, by=admin_actor(request))
            done += 1
        self.message_user(request, f"revoked {done} key(s)")


class VersionInline(admin.TabularInline):
    model = ScheduleVersion
    extra = 0
    can_delete = False
    fields = ("version", "expression", "time_zone", "target_url", "created_by", "created_at", "changes")
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    list_display = ("name", "id", "tenant", "version", "enabled", "status", "next_run_at")
    list_filter = ("enabled", "status", "tenant")
    search_fields = ("name", "id")
    list_select_related = ("tenant",)
    show_full_result_count = False
    inlines = [VersionInline]
    actions = ["pause", "resume"]
    # Edits go through the API or the portal so that they make a new version; the admin reads.
    readonly_fields = [f.name for f in Schedule._meta.fields]

    def has_add_permission(self, request):
        return False

    def _each(self, request, queryset, fn, label):
        done = 0
        for s in queryset:
            try:
                fn(s, by=admin_actor(request))
                done += 1
            except ServiceError as e:
                self.message_user(request, f"{s}: {e.message}", level=messages.WARNING)
        self.message_user(request, f"{label} {done} schedule(s)")

    @admin.action(description="Pause selected schedules")
    def pause(self, request, queryset):
        from runs.schedule_changes import pause_schedule

        self._each(request, queryset.filter(enabled=True), pause_schedule, "paused")

    @admin.action(description="Resume selected schedules")
    def resume(self, request, queryset):
        from runs.schedule_changes import resume_schedule

        self._each(request, queryset.filter(enabled=False), resume_schedule, "resumed")


@admin.register(ScheduleVersion)
class ScheduleVersionAdmin(admin.ModelAdmin):
    list_display = ("schedule", "version", "expression", "time_zone", "created_by", "created_at")
    readonly_fields = [f.name for f in ScheduleVersion._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
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
