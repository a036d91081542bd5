"""The store's writes for the changes a person or a client asks for (runs.actions): retry and cancel
a run; pause, resume, archive a schedule, give it a new version, owner or managed name.

One class composed into both stores (PortableStore, and PostgresStore through it): these are one
row at a time, under the row lock the caller took, so the ORM's statements are what both engines
run. Each method applies a change already decided and checked by runs.actions (the state it
starts from, the values it computes) in the caller's transaction; the events and audit entries are
the caller's to write.
"""

from __future__ import annotations

from datetime import datetime

from runs.models import Attempt, AttemptOutcome, Run, RunState
from schedules.models import Schedule, ScheduleStatus, ScheduleVersion


class RequestedChanges:
    # --- runs -------------------------------------------------------------------------------------

    def run_set_retried(self, run: Run, *, by: str, now: datetime) -> None:
        """dead | canceled -> ready now, with a fresh retry budget (the generation goes on)."""
        run.state = RunState.READY
        run.reason = ""
        run.next_eligible_at = now
        run.finished_at = None
        run.attempts_used = 0
        run.retried_by = by
        run.retried_at = now
        run.save(update_fields=["state", "reason", "next_eligible_at", "finished_at", "attempts_used",
                                "retried_by", "retried_at"])

    def run_set_canceled(self, run: Run, *, reason: str, by: str, now: datetime) -> None:
        """ready | leased -> canceled; a leased run's open attempt is closed as abandoned in flight."""
        if run.state == RunState.LEASED:
            Attempt.objects.filter(run_id=run.id, generation=run.generation, outcome__isnull=True).update(
                outcome=AttemptOutcome.ABANDONED,
                finished_at=now,
                canceled_in_flight=True,
                error_class="Canceled",
                error=f"run canceled by {by} while this attempt was in flight; the target may have acted",
            )
        run.state = RunState.CANCELED
        run.reason = reason
        run.lease_until = None
        run.lease_owner = ""
        run.next_eligible_at = None
        run.finished_at = now
        run.save(update_fields=["state", "reason", "lease_until", "lease_owner", "next_eligible_at", "finished_at"])

    # --- schedules --------------------------------------------------------------------------------

    def schedule_set_paused(self, schedule: Schedule, *, now: datetime) -> None:
        schedule.enabled = False
        schedule.paused_at = now
        schedule.next_run_at = None
        schedule.save(update_fields=["enabled", "paused_at", "next_run_at", "updated_at"])

    def schedule_set_resumed(self, schedule: Schedule, *, next_run_at: datetime | None, completed_at: datetime | None) -> None:
        """Enabled again, due next at `next_run_at`; with no next instant (an active schedule whose
        rule has ended) it is completed at `completed_at`."""
        schedule.enabled = True
        schedule.paused_at = None
        if schedule.status == ScheduleStatus.ACTIVE:
            schedule.next_run_at = next_run_at
            if next_run_at is None:
                schedule.status, schedule.completed_at = ScheduleStatus.COMPLETED, completed_at
        schedule.save(update_fields=["enabled", "paused_at", "next_run_at", "status", "completed_at", "updated_at"])

    def schedule_set_archived(self, schedule: Schedule, *, now: datetime) -> None:
        schedule.status = ScheduleStatus.ARCHIVED
        schedule.archived_at = now
        schedule.next_run_at = None
        schedule.save(update_fields=["status", "archived_at", "next_run_at", "updated_at"])

    def schedule_set_owner(self, schedule_id, owner_id) -> None:
        Schedule.objects.filter(id=schedule_id).update(owner_id=owner_id)

    def schedule_set_managed_name(self, schedule_id, name: str) -> None:
        """A schedule set adopts an existing schedule under its name (runs.schedule_apply)."""
        Schedule.objects.filter(id=schedule_id).update(managed_name=name)

    # --- versions ---------------------------------------------------------------------------------

    def version_insert(self, schedule: Schedule, version: ScheduleVersion) -> None:
        """Insert the schedule's next version and save the schedule pointing at it, with the fields
        the edit recomputed (name, anchor, next instant, status)."""
        version.save(force_insert=True)
        schedule.version = version.version
        schedule.current = version
        schedule.save()
