"""Owners and incidents in the admin: read for operators; acknowledging and resolving are actions
that call dispatch.incidents (audited), allowed with the operate_runs capability."""

from django.contrib import admin, messages

from dispatch import incidents
from dispatch.models import Incident, IncidentState, Notification
from scheduler_project.foundation.errors import ServiceError
from scheduler_project.web.access import actor_for as admin_actor
from scheduler_project.web.admin.base import OperatorAdmin
from schedules.models import Owner


@admin.register(Owner)
class OwnerAdmin(OperatorAdmin):
    """Owners are made and edited through the API and the portal (schedules.owners, audited)."""

    list_display = ("slug", "name", "tenant", "email", "webhook_url", "webhook_format", "created_at")
    list_filter = ("tenant",)
    search_fields = ("slug", "name", "email")
    list_select_related = ("tenant",)
    readonly_fields = [f.name for f in Owner._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Incident)
class IncidentAdmin(OperatorAdmin):
    list_display = ("id", "tenant", "schedule", "owner", "rule", "state", "occurrences", "opened_at", "last_seen_at",
                    "resolved_at")
    list_filter = ("state", "rule", "tenant")
    list_select_related = ("tenant", "schedule", "owner")
    show_full_result_count = False
    readonly_fields = [f.name for f in Incident._meta.fields]
    actions = ["acknowledge", "resolve"]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def _each(self, request, queryset, fn, label):
        done = 0
        for inc in queryset:
            try:
                fn(inc.id, tenant_id=inc.tenant_id, by=admin_actor(request))
                done += 1
            except ServiceError as e:
                self.message_user(request, f"incident {inc.id}: {e.message}", level=messages.WARNING)
        self.message_user(request, f"{label} {done} incident{'' if done == 1 else 's'}")

    @admin.action(description="Acknowledge selected incidents", permissions=["operate_runs"])
    def acknowledge(self, request, queryset):
        self._each(request, queryset.filter(state=IncidentState.OPEN), incidents.acknowledge_incident, "acknowledged")

    @admin.action(description="Resolve selected incidents", permissions=["operate_runs"])
    def resolve(self, request, queryset):
        self._each(request, queryset.exclude(state=IncidentState.RESOLVED), incidents.resolve_incident, "resolved")


@admin.register(Notification)
class NotificationAdmin(OperatorAdmin):
    list_display = ("id", "tenant", "owner", "kind", "channel", "destination", "created_at", "published_at",
                    "held", "next_attempt_at", "summarized_in", "publish_attempts", "last_error")
    list_filter = ("channel", "kind", "held")
    list_select_related = ("tenant", "owner")
    show_full_result_count = False
    readonly_fields = [f.name for f in Notification._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
