"""Tenants, memberships, API keys, schedules and the audit log in the admin. Reads for operators
(either role); the changes are actions and pages that call the services, each allowed only with
its capability (scheduler_project.web.access). Nothing is deleted here: keys are revoked and
schedules archived, so their history stays."""

import json

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.template.response import TemplateResponse

from runs import actions
from scheduler_project.foundation.errors import ServiceError
from scheduler_project.web.access import actor_for as admin_actor
from scheduler_project.web.access import has_operator_permission
from scheduler_project.web.admin.base import OperatorAdmin, OperatorInline
from scheduler_project.web.portal.display import headers_shown, masked_change
from schedules.models import (
    ApiKey,
    AuditEntry,
    Schedule,
    ScheduleStatus,
    ScheduleVersion,
    TargetPrefix,
    Tenant,
    TenantMembership,
)
from schedules.tenants import revoke_api_key


class TargetPrefixInline(OperatorInline):
    """Read here; changed on the portal's tenant page, which goes through
    `schedules.tenants.add_target_prefix` / `remove_target_prefix` and so is audited."""

    model = TargetPrefix
    fields = ("prefix", "max_concurrency", "created_at")
    readonly_fields = fields


@admin.register(Tenant)
class TenantAdmin(OperatorAdmin):
    list_display = ("slug", "name", "max_in_flight", "max_schedules", "max_subminute_schedules",
                    "default_spread_seconds", "notification_url", "created_at")
    search_fields = ("slug", "name")
    inlines = [TargetPrefixInline]
    # The allowlist, webhook, caps and quotas change through the portal's tenant page (audited
    # services); a direct admin edit would leave no audit entry.
    readonly_fields = ("notification_url", "max_in_flight", "max_schedules", "max_subminute_schedules",
                       "default_spread_seconds", "created_at")
    # The secret is shown to operators who may see secrets only (the read-only role may not).
    exclude = ("signing_secret",)

    def get_readonly_fields(self, request, obj=None):
        shown = "signing_secret" if has_operator_permission(request.user, "view_secret") else "signing_secret_hidden"
        return (shown, *self.readonly_fields)

    @admin.display(description="signing secret")
    def signing_secret_hidden(self, obj):
        return "•••• (hidden: only the Operator role and the tenant's admins see it)"

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
    fields = ("version", "expression", "time_zone", "target_url", "spread_seconds", "spread_offset_seconds",
              "created_by", "created_at", "changes")
    readonly_fields = fields


@admin.register(Schedule)
class ScheduleAdmin(OperatorAdmin):
    list_display = ("name", "id", "tenant", "owner", "version", "enabled", "status", "next_run_at")
    list_filter = ("enabled", "status", "tenant", "owner")
    search_fields = ("name", "id")
    list_select_related = ("tenant", "owner")
    show_full_result_count = False
    inlines = [VersionInline]
    actions = ["pause", "resume", "archive"]
    # Edits go through the API or the portal so that they make a new version; the admin reads.
    readonly_fields = [f.name for f in Schedule._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def _each(self, request, queryset, bulk, label):
        result = bulk(queryset, by=admin_actor(request))
        for s, message in result.refused:
            self.message_user(request, f"{s}: {message}", level=messages.WARNING)
        done = len(result.done)
        self.message_user(request, f"{label} {done} schedule{'' if done == 1 else 's'}")

    @admin.action(description="Pause selected schedules", permissions=["operate_schedules"])
    def pause(self, request, queryset):
        self._each(request, queryset.filter(enabled=True), actions.pause_schedules, "paused")

    @admin.action(description="Resume selected schedules", permissions=["operate_schedules"])
    def resume(self, request, queryset):
        self._each(request, queryset.filter(enabled=False), actions.resume_schedules, "resumed")


    @admin.action(description="Archive selected schedules…", permissions=["operate_schedules"])
    def archive(self, request, queryset):
        """Asks first (a page listing them, as Django's delete does), then archives each through
        runs.actions.archive_schedule, the API's and the portal's entry point (audited)."""
        live = queryset.exclude(status=ScheduleStatus.ARCHIVED)
        if request.POST.get("post") != "yes":
            return TemplateResponse(request, "admin/schedules/archive_confirmation.html", {
                **self.admin_site.each_context(request), "title": "Archive schedules?", "opts": self.model._meta,
                "schedules": list(live.select_related("tenant")[:1000]),
                "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
                "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            })
        self._each(request, live, actions.archive_schedules, "archived")
        return None


@admin.register(ScheduleVersion)
class ScheduleVersionAdmin(OperatorAdmin):
    list_display = ("schedule", "version", "expression", "time_zone", "created_by", "created_at")
    readonly_fields = [f.name for f in ScheduleVersion._meta.fields]

    def get_readonly_fields(self, request, obj=None):
        # Header values are usually credentials: masked, as in the portal, for whoever may not
        # edit schedules.
        if has_operator_permission(request.user, "operate_schedules"):
            return self.readonly_fields
        return [("target_headers_masked" if f == "target_headers" else f) for f in self.readonly_fields]

    def get_exclude(self, request, obj=None):
        return None if has_operator_permission(request.user, "operate_schedules") else ("target_headers",)

    @admin.display(description="target headers")
    def target_headers_masked(self, obj):
        return ", ".join(f"{name}: {value}" for name, value, _ in headers_shown(obj.target_headers, False)) or "—"

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

    def get_readonly_fields(self, request, obj=None):
        # A schedule's create and edit entries hold its header values: masked for whoever may not
        # edit schedules, as on the version pages.
        if has_operator_permission(request.user, "operate_schedules"):
            return self.readonly_fields
        masked = {"before": "before_masked", "after": "after_masked"}
        return [masked.get(f, f) for f in self.readonly_fields]

    def get_exclude(self, request, obj=None):
        return None if has_operator_permission(request.user, "operate_schedules") else ("before", "after")

    @admin.display(description="before")
    def before_masked(self, obj):
        return json.dumps(masked_change(obj.before, False), ensure_ascii=False)

    @admin.display(description="after")
    def after_masked(self, obj):
        return json.dumps(masked_change(obj.after, False), ensure_ascii=False)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
