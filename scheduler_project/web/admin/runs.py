"""The admin as a safe back office: runs and attempts are read-only; the only changes are the
retry and cancel actions, narrowed to valid states, allowed with the `operate_runs` capability
(scheduler_project.web.access) and made by the same services as the API."""

from django.contrib import admin, messages

from runs import actions
from runs.models import Attempt, OutboxEvent, Run
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

    def _each(self, request, queryset, bulk, states, label):
        # Counted before acting: afterwards the runs just changed would count as left alone.
        skipped = queryset.exclude(state__in=states).count()
        result = bulk(queryset.filter(state__in=states), by=admin_actor(request))
        for run, message in result.refused:
            self.message_user(request, f"{run.id}: {message}", level=messages.WARNING)
        done = len(result.done)
        msg = f"{label} {done} run{'' if done == 1 else 's'}"
        if skipped:
            msg += f"; {skipped} left alone (not in {'/'.join(states)})"
        self.message_user(request, msg)

    @admin.action(description="Retry selected dead or canceled runs", permissions=["operate_runs"])
    def retry(self, request, queryset):
        self._each(request, queryset, actions.retry_runs, actions.RETRYABLE_FROM, "retried")

    @admin.action(description="Cancel selected ready or leased runs", permissions=["operate_runs"])
    def cancel(self, request, queryset):
        self._each(request, queryset, actions.cancel_runs, actions.CANCELABLE_FROM, "canceled")


@admin.register(Attempt)
class AttemptAdmin(ReadOnlyAdmin):
    list_display = ("run", "generation", "worker_id", "started_at", "finished_at", "outcome", "http_status")
    list_filter = ("outcome",)


@admin.register(OutboxEvent)
class OutboxEventAdmin(ReadOnlyAdmin):
    list_display = ("id", "kind", "tenant", "run", "created_at", "published_at", "publish_attempts")
    list_filter = ("kind",)
