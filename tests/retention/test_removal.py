"""Retention removes finished history once its time is up, by class and by tenant, with its
attempts and occurrences, and never a run that is not finished; on both engines (PostgreSQL by
swapping out whole partitions, SQLite by batches)."""

from datetime import timedelta

import pytest

from dispatch import invariants
from runs import retention
from runs.actions import retry_run
from runs.models import Attempt, HistoryRemoval, Occurrence, Run
from scheduler_project.foundation.dbclock import db_now
from schedules.models import AuditEntry
from schedules.services import SYSTEM
from tests.helpers import ACTOR
from tests.retention.conftest import one_run, run_retention

pytestmark = pytest.mark.django_db


HISTORY_CHECKS = ("duplicate_occurrences", "occurrences_without_one_run", "runs_without_occurrence",
                  "attempt_generations", "attempts_without_run", "leased_without_open_attempt",
                  "misplaced_open_attempts")


def history_violations() -> list:
    """The invariants about the history rows themselves (1-3). (The event checks judge a window
    around the real now; these tests remove history as seen from weeks ahead, events included.)"""
    ctx = invariants.Context(now=db_now())
    return [v for name in HISTORY_CHECKS for v in invariants.CHECKS[name](ctx)]


def present(*runs) -> dict:
    ids = {r.id for r in runs}
    return {r.id: Run.objects.filter(id=r.id).exists() for r in runs} if ids else {}


def test_it_removes_finished_runs_past_their_time_and_keeps_every_unfinished_one(tenant, target, later):
    ready = one_run(tenant, target, "/ready", to="ready")
    leased = one_run(tenant, target, "/leased", to="leased")
    succeeded = one_run(tenant, target, "/ok", to="succeeded")
    canceled = one_run(tenant, target, "/cancel", to="canceled")
    skipped = one_run(tenant, target, "/skip", to="skipped", misfire_policy="skip", expression="rate(30 minutes)")
    dead_old = one_run(tenant, target, "/dead-old", to="dead")
    dead_recent = one_run(tenant, target, "/dead-recent", to="dead")
    # Went dead 10 days from now: 25 days old at `later`, within the 30 days dead runs are kept.
    Run.objects.filter(id=dead_recent.id).update(finished_at=db_now() + timedelta(days=10))
    attempts_before = {r.id: Attempt.objects.filter(run_id=r.id).count() for r in (leased, dead_recent)}

    run_retention(later)

    assert present(ready, leased, dead_recent) == {ready.id: True, leased.id: True, dead_recent.id: True}
    assert present(succeeded, canceled, skipped, dead_old) == {
        succeeded.id: False, canceled.id: False, skipped.id: False, dead_old.id: False}
    # A run goes with its attempts and its occurrence; one that stays keeps them.
    assert not Attempt.objects.filter(run_id__in=[succeeded.id, dead_old.id]).exists()
    assert not Occurrence.objects.filter(id__in=[succeeded.occurrence_id, dead_old.occurrence_id]).exists()
    assert {r.id: Attempt.objects.filter(run_id=r.id).count() for r in (leased, dead_recent)} == attempts_before
    assert Occurrence.objects.filter(id__in=[ready.occurrence_id, leased.occurrence_id]).count() == 2
    assert history_violations() == []


def test_nothing_is_removed_before_its_time(tenant, target):
    runs = [one_run(tenant, target, f"/{s}", to=s) for s in ("succeeded", "dead", "canceled")]
    run_retention(db_now() + timedelta(days=13))
    assert all(present(*runs).values())


def test_a_tenants_own_policy_keeps_longer_or_shorter(tenant, other_tenant, target, later):
    retention.set_policy(tenant, finished_days=60, dead_days=None, by=SYSTEM)
    retention.set_policy(other_tenant, finished_days=1, dead_days=2, by=SYSTEM)
    long_ok = one_run(tenant, target, "/long", to="succeeded")
    long_dead = one_run(tenant, target, "/long-dead", to="dead")
    short_ok = one_run(other_tenant, target, "/short", to="succeeded")
    short_dead = one_run(other_tenant, target, "/short-dead", to="dead")

    # Two days on, the short tenant's finished history is past its time; nothing else is.
    run_retention(db_now() + timedelta(days=3))
    assert present(long_ok, long_dead, short_ok, short_dead) == {
        long_ok.id: True, long_dead.id: True, short_ok.id: False, short_dead.id: False}

    # 35 days on: the long tenant's dead run is past the default 30; its succeeded run, kept 60, is not.
    run_retention(db_now() + timedelta(days=35))
    assert present(long_ok, long_dead) == {long_ok.id: True, long_dead.id: False}
    assert history_violations() == []


def test_a_run_retried_by_hand_is_counted_from_the_retry(tenant, target, later):
    run = one_run(tenant, target, "/again", to="dead")
    retry_run(run, by=ACTOR)
    # The retry is 25 days before `later`: the run, whatever it became, is kept 14 days from it.
    Run.objects.filter(id=run.id).update(retried_at=db_now() + timedelta(days=25))
    run_retention(later)
    assert Run.objects.filter(id=run.id, state="ready").exists()


def test_each_removal_is_in_the_audit_log_and_the_status(tenant, target, later):
    gone = [one_run(tenant, target, f"/ok{i}", to="succeeded") for i in range(3)]
    stays = one_run(tenant, target, "/ready", to="ready")
    run_retention(later)
    assert present(*gone) == {r.id: False for r in gone} and present(stays)[stays.id]
    entries = AuditEntry.objects.filter(action=retention.AUDIT_ACTION)
    assert {e.actor for e in entries} == {"system:maintain"}
    # The entries say how many rows went: the three runs, their attempts and occurrences (the
    # partition swap recorded 0 for a partition never analysed, as a fresh one is).
    removed = {t: sum(e.after["removed"].get(t, 0) for e in entries)
               for t in ("runs_run", "runs_attempt", "runs_occurrence")}
    assert removed == {"runs_run": 3, "runs_attempt": 3, "runs_occurrence": 3}
    assert sum(h.removed.get("runs_run", 0) for h in HistoryRemoval.objects.all()) == 3
    st = retention.status()
    assert st.last_removal_at is not None and st.last_removal
    assert (st.finished_days, st.dead_days) == (14.0, 30.0)


def test_export_writes_what_goes_and_nothing_that_stays(tenant, target, later, tmp_path):
    import gzip
    import json

    gone = one_run(tenant, target, "/gone", to="succeeded")
    stays = one_run(tenant, target, "/stays", to="ready")
    run_retention(later, export_dir=str(tmp_path))
    lines = []
    for f in tmp_path.iterdir():
        with gzip.open(f, "rt") as fh:
            lines += [json.loads(x) for x in fh]
    ids = {str(x.get("id") or x.get("pk")) for x in lines}
    assert str(gone.id) in ids and str(stays.id) not in ids
    assert str(gone.occurrence_id) in ids
    assert any(x.get("run_id") == str(gone.id) or x.get("run") == str(gone.id) for x in lines)  # its attempt


def test_the_status_says_what_is_kept(tenant, target, settings):
    settings.SCHEDULER_RETENTION_DAYS = 7
    retention.set_policy(tenant, finished_days=3, dead_days=None, by=SYSTEM)
    st = retention.status(tenant_ids=[tenant.id])
    assert (st.finished_days, st.dead_days, st.overrides) == (7.0, 30.0, 1)
    (t,) = st.tenants
    assert (t.slug, t.finished_days, t.dead_days, t.own) == ("acme", 3.0, 30.0, True)


def test_a_removal_whose_audit_entry_fails_is_undone(tenant, target, later, monkeypatch):
    """The audit entry is written in the removal's own transaction: a removal is never committed
    without it (it was written after the swap or the batch had committed)."""
    run = one_run(tenant, target, "/ok", to="succeeded")

    def audit_fails(*args, **kwargs):
        raise RuntimeError("the audit log is unavailable")

    monkeypatch.setattr(retention, "audit", audit_fails)
    with pytest.raises(RuntimeError, match="audit log"):
        run_retention(later)
    assert present(run) == {run.id: True}
    assert Attempt.objects.filter(run_id=run.id).count() == 1
    assert Occurrence.objects.filter(id=run.occurrence_id).exists()
    assert not HistoryRemoval.objects.exists()
    assert history_violations() == []
