"""The admin as a safe back office: runs and attempts are read-only; the only changes are the
retry and cancel actions, narrowed to valid states, allowed with the `operate_runs` capability
(scheduler_project.web.access) and made by the same services as the API."""

from django.contrib import admin, messages

from runs import services
from runs.models import Attempt, OutboxEvent, Run
from scheduler_project.foundation.errors import ServiceError
from scheduler_project.web.access import actor_for as admin_actor
from scheduler_project.web.admin.base import OperatorAdmin, OperatorInline


class ReadOnlyAdmin(OperatorAdmin):
    show_full_result_count = False  # COUNT(*) over hundreds of millions of rows is not free

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class AttemptInline(OperatorInline):
    model = Attempt
    fields = ("generation", "worker_id", "started_at", "finished_at", "outcome", "http_status", "error_class",
              "error", "latency_ms", "canceled_in_flight", "late_result")
    readonly_fields = fields


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = ("id", "tenant", "schedule", "scheduled_time", "kind", "state", "reason", "generation",
                    "next_eligible_at", "lease_owner")
    list_filter = ("state", "kind", "tenant")
    search_fields = ("id",)
    list_select_related = ("tenant", "schedule")
    inlines = [AttemptInline]
    actions = ["retry", "cancel"]

    def _each(self, request, queryset, fn, states, label):
        # Counted before acting: afterwards the runs just changed would count as left alone.
        skipped = queryset.exclude(state__in=states).count()
        done = 0
        for run in queryset.filter(state__in=states):
            try:
                fn(run, by=admin_actor(request))
                done += 1
            except ServiceError as e:
                self.message_user(request, f"{run.id}: {e.message}", level=messages.WARNING)
        msg = f"{label} {done} run{'' if done == 1 else 's'}"
        if skipped:
            msg += f"; {skipped} left alone (not in {'/'.join(states)})"
        self.message_user(request, msg)

    @admin.action(description="Retry selected dead or canceled runs", permissions=["operate_runs"])
    def retry(self, request, queryset):
        self._each(request, queryset, services.retry_run, services.RETRYABLE_FROM, "retried")

    @admin.action(description="Cancel selected ready or leased runs", permissions=["operate_runs"])
    def cancel(self, request, queryset):
        self._each(request, queryset, services.cancel_run, services.CANCELABLE_FROM, "canceled")


@admin.register(Attempt)
class AttemptAdmin(ReadOnlyAdmin):
    list_display = ("run", "generation", "worker_id", "started_at", "finished_at", "outcome", "http_status")
    list_filter = ("outcome",)


@admin.register(OutboxEvent)
class OutboxEventAdmin(ReadOnlyAdmin):
    list_display = ("id", "kind", "tenant", "run", "created_at", "published_at", "publish_attempts")
    list_filter = ("kind",)
