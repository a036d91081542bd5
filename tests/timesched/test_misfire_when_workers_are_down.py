"""All workers down: occurrences were materialised on time but nobody claimed them. The
reconciler (reconcile_step -> skip_unclaimed_misfires) applies the misfire policy to them."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from dispatch.loops import reconcile_step
from runs.models import OutboxEvent, Run, RunKind, RunState
from runs.queue import build_run, claim, insert_runs, skip_unclaimed_misfires
from scheduler_project.foundation.dbclock import db_now
from schedules.services import rule_for
from tests.timesched.support import every_15_minutes_after_outage, states

pytestmark = pytest.mark.django_db


def materialised_on_time(tenant, url, **fields):
    """13 ready runs over the last 3 hours, as the scanner made them at each instant."""
    schedule = every_15_minutes_after_outage(tenant, url, **fields)
    version = schedule.current
    rule = rule_for(version, schedule.anchor_at)
    now = db_now()
    occs = rule.between(schedule.next_run_at, now, 100)
    insert_runs([build_run(schedule, version, o, state=RunState.READY, reason="", eligible_at=o.at,
                           kind=RunKind.SCHEDULED, now=now) for o in occs])
    assert len(occs) == 13
    return schedule


@pytest.mark.parametrize("policy, ready, skipped", [("skip", 0, 13), ("run_once", 1, 12), ("catch_up", 10, 3)])
def test_the_policy_decides_which_unclaimed_runs_still_run(tenant, target, policy, ready, skipped):
    schedule = materialised_on_time(tenant, target.url + "/w", misfire_policy=policy)

    reconcile_step()

    assert [r[1:] for r in states(schedule)] == [("skipped", "misfire")] * skipped + [("ready", "")] * ready
    assert OutboxEvent.objects.filter(kind="run.skipped").count() == skipped
    # Applying it again changes nothing: the kept runs are the latest, and stay.
    assert skip_unclaimed_misfires() == 0
    # When the workers come back they get exactly the kept runs.
    got = claim("w-back", 100)
    assert sorted(c.scheduled_time for c in got) == [r[0] for r in states(schedule) if r[1] == "leased"]
    assert len(got) == ready


def test_a_run_still_within_its_grace_is_left_for_the_workers(tenant, target):
    schedule = materialised_on_time(tenant, target.url + "/w", misfire_policy="skip", misfire_grace_seconds=400)
    skip_unclaimed_misfires()
    # Only the latest (5 minutes old) is within 400 s; the rest were missed.
    assert [r[1] for r in states(schedule)] == ["skipped"] * 12 + ["ready"]


def test_a_small_batch_never_skips_a_run_the_policy_keeps(tenant, target):
    schedules = [materialised_on_time(tenant, target.url + f"/w{i}", misfire_policy="catch_up", catchup_limit=5)
                 for i in range(3)]
    # Batches of 4 work the 24 surplus runs off over several passes; none of the kept ones goes.
    while skip_unclaimed_misfires(batch=4):
        pass
    for s in schedules:
        assert [r[1] for r in states(s)] == ["skipped"] * 8 + ["ready"] * 5


def test_a_backlog_is_worked_off_one_batch_per_pass_and_each_policy_keeps_its_runs(tenant, target):
    """Batches of one over three schedules with different policies: every pass makes progress,
    and each schedule ends with exactly what its policy keeps."""
    policies = {"skip": 0, "run_once": 1, "catch_up": 4}
    schedules = {p: materialised_on_time(tenant, target.url + f"/{p}", misfire_policy=p, catchup_limit=4)
                 for p in policies}
    passes = []
    while n := skip_unclaimed_misfires(batch=1, max_batches=1):
        passes.append(n)
    assert sum(passes) == 39 - sum(policies.values()) and len(passes) == sum(passes)  # one run per pass
    for p, kept in policies.items():
        assert [r[1] for r in states(schedules[p])] == ["skipped"] * (13 - kept) + ["ready"] * kept, p


def test_a_backlog_still_within_every_grace_is_checked_without_reading_it(tenant, target):
    """The smallest grace of any version bounds what can have been missed: while the oldest
    unclaimed run is within it, the pass stops after a few index probes and never reads or ranks
    the backlog (a burst being worked off)."""
    materialised_on_time(tenant, target.url + "/w", misfire_policy="skip", misfire_grace_seconds=4 * 3600)
    with CaptureQueriesContext(connection) as queries:
        assert skip_unclaimed_misfires() == 0
    sql = " ".join(q["sql"].upper() for q in queries.captured_queries)
    assert "MIN(" in sql and "ROW_NUMBER" not in sql and "DISTINCT" not in sql
    # One version with a short grace anywhere and the same backlog is ranked (and skipped).
    materialised_on_time(tenant, target.url + "/v", misfire_policy="skip")
    assert skip_unclaimed_misfires() == 13


def test_one_pass_skips_several_batches_of_what_it_ranked(tenant, target):
    schedule = materialised_on_time(tenant, target.url + "/w", misfire_policy="skip")
    assert skip_unclaimed_misfires(batch=2, max_batches=3) == 6
    assert skip_unclaimed_misfires(batch=2, max_batches=10) == 7
    assert [r[1] for r in states(schedule)] == ["skipped"] * 13


def test_manual_and_backfill_runs_are_not_misfires(tenant, target):
    schedule = materialised_on_time(tenant, target.url + "/w", misfire_policy="skip")
    Run.objects.filter(schedule=schedule, scheduled_time=states(schedule)[0][0]).update(kind=RunKind.MANUAL)
    Run.objects.filter(schedule=schedule, scheduled_time=states(schedule)[1][0]).update(kind=RunKind.BACKFILL)
    skip_unclaimed_misfires()
    assert [r[1] for r in states(schedule)] == ["ready", "ready"] + ["skipped"] * 11


def test_a_run_waiting_to_retry_is_not_a_misfire(tenant, target):
    schedule = materialised_on_time(tenant, target.url + "/w", misfire_policy="skip")
    first = Run.objects.filter(schedule=schedule).order_by("scheduled_time").first()
    Run.objects.filter(id=first.id).update(generation=1, attempts_used=1,
                                           next_eligible_at=db_now() - timedelta(hours=1))
    skip_unclaimed_misfires()
    assert Run.objects.get(id=first.id).state == "ready"


def test_a_grace_seen_only_among_older_runs_is_not_missed(tenant, target, monkeypatch):
    # The distinct graces of the unclaimed runs were read with the runs' default ordering, so
    # DISTINCT gave a row per run, newest first, cut at GRACE_VALUES: a schedule whose grace
    # appeared only among older runs was never looked at, and its missed runs stayed ready.
    from runs.store import portable

    monkeypatch.setattr(portable, "GRACE_VALUES", 2)
    newer = materialised_on_time(tenant, target.url + "/newer", misfire_policy="skip")  # grace 60 s
    older = every_15_minutes_after_outage(tenant, target.url + "/older", misfire_policy="skip",
                                          misfire_grace_seconds=120)
    now = db_now()
    occs = rule_for(older.current, older.anchor_at).between(older.next_run_at, now - timedelta(hours=2), 100)
    insert_runs([build_run(older, older.current, o, state=RunState.READY, reason="", eligible_at=o.at,
                           kind=RunKind.SCHEDULED, now=now) for o in occs])
    assert len(occs) >= 4

    skip_unclaimed_misfires()

    assert [r[1] for r in states(older)] == ["skipped"] * len(occs)
    assert [r[1] for r in states(newer)] == ["skipped"] * 13
