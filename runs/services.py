"""Manual run transitions: the one entry point for each, called by the API, the portal, the admin
and the commands alike. Batched loop transitions are in `runs.queue`; schedule changes that touch
runs in `runs.schedule_changes`."""

from django.db import transaction

from runs.decisions import event
from runs.models import Attempt, AttemptOutcome, EventKind, Reason, Run, RunState
from runs.queue import release_buffered, write_events
from runs.store import store
from scheduler_project.foundation.dbclock import db_now
from scheduler_project.foundation.errors import Conflict
from scheduler_project.foundation.notify import RUNS_CHANNEL, notify
from schedules.services import Actor, audit

RETRYABLE_FROM = (RunState.DEAD, RunState.CANCELED)
CANCELABLE_FROM = (RunState.READY, RunState.LEASED)


def _locked(run_or_id) -> Run:
    run_id = getattr(run_or_id, "id", run_or_id)
    return Run.objects.select_for_update().get(id=run_id)


@transaction.atomic
def retry_run(run, *, by: Actor) -> Run:
    """dead | canceled -> ready now. Keeps the run id (the idempotency key); the next attempt gets
    the next generation and a fresh retry budget."""
    run = _locked(run)
    if run.state not in RETRYABLE_FROM:
        raise Conflict(f"only dead or canceled runs can be retried; this run is {run.state}", state=run.state)
    before = run.state
    now = db_now()
    run.state = RunState.READY
    run.reason = ""
    run.next_eligible_at = now
    run.finished_at = None
    run.attempts_used = 0
    run.retried_by = by.name
    run.retried_at = now
    run.save(update_fields=["state", "reason", "next_eligible_at", "finished_at", "attempts_used", "retried_by",
                            "retried_at"])
    write_events([event(run.id, run.tenant_id, EventKind.RETRIED, state=RunState.READY, by=by.name)], now)
    notify(RUNS_CHANNEL)
    audit("run.retry", by=by, obj_type="run", obj_id=run.id, tenant_id=run.tenant_id,
          before={"state": before}, after={"state": RunState.READY})
    return run


@transaction.atomic
def cancel_run(run, *, by: Actor, reason: str = Reason.CANCELED) -> Run:
    """ready | leased -> canceled. A leased run's worker learns of it at its next heartbeat and
    abandons the call; whatever it reports later is fenced and kept only as evidence."""
    run = _locked(run)
    if run.state not in CANCELABLE_FROM:
        raise Conflict(f"only ready or leased runs can be canceled; this run is {run.state}", state=run.state)
    before = run.state
    now = db_now()
    if run.state == RunState.LEASED:
        Attempt.objects.filter(run_id=run.id, generation=run.generation, outcome__isnull=True).update(
            outcome=AttemptOutcome.ABANDONED,
            finished_at=now,
            canceled_in_flight=True,
            error_class="Canceled",
            error=f"run canceled by {by.name} while this attempt was in flight; the target may have acted",
        )
    run.state = RunState.CANCELED
    run.reason = reason
    run.lease_until = None
    run.lease_owner = ""
    run.next_eligible_at = None
    run.finished_at = now
    run.save(update_fields=["state", "reason", "lease_until", "lease_owner", "next_eligible_at", "finished_at"])
    write_events([event(run.id, run.tenant_id, EventKind.CANCELED, state=RunState.CANCELED, reason=reason,
                        inFlight=before == RunState.LEASED, by=by.name)], now)
    audit("run.cancel", by=by, obj_type="run", obj_id=run.id, tenant_id=run.tenant_id,
          before={"state": before}, after={"state": RunState.CANCELED, "reason": reason})
    # A run buffered behind this one (overlap buffer_one) may start now.
    release_buffered({run.schedule_id}, now)
    return run


def cancel_unstarted(schedule_id, *, reason: str, versions_below: int | None = None) -> int:
    """Cancel a schedule's runs that have not started (ready, never attempted) in one statement,
    with their events: used by pause (reason paused), edit (superseded) and archive."""
    return store().cancel_unstarted(schedule_id, now=db_now(), reason=reason, versions_below=versions_below)
