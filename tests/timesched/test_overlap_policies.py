"""overlapPolicy when an occurrence comes due while an earlier run of the schedule is leased:
allow runs both, skip records a skipped run (reason overlap), buffer_one holds one until the
earlier run ends (through complete or expire_leases), and skips the rest."""

from datetime import timedelta

import pytest

from runs.actions import cancel_run
from runs.models import OutboxEvent, Run
from runs.queue import BUFFERED_UNTIL, Result, claim, complete, expire_leases, skip_unclaimed_misfires
from scheduler_project.foundation.dbclock import db_now
from tests.helpers import ACTOR, expire_lease, make_due, make_schedule
from tests.timesched.support import scan_until_idle

pytestmark = pytest.mark.django_db


def occurrence_due(schedule, seconds_ago):
    # Each call makes one occurrence `seconds_ago` old (inside the 60 s grace, so on time), at a
    # distinct instant so it is a new occurrence and not the same one again.
    make_due(schedule, db_now() - timedelta(seconds=seconds_ago))


def leased_first_run(tenant, target, policy, **fields):
    schedule = make_schedule(tenant, target.url + "/o", overlap_policy=policy, **fields)
    occurrence_due(schedule, 30)
    scan_until_idle()
    (claimed,) = claim("w-1", 10)
    return schedule, claimed


def next_occurrence_due(schedule, seconds_ago=20):
    occurrence_due(schedule, seconds_ago)


def later_runs(schedule, first_id):
    return list(Run.objects.filter(schedule=schedule).exclude(id=first_id).order_by("scheduled_time")
                .values_list("state", "reason"))


def test_allow_runs_the_new_occurrence_beside_the_leased_one(tenant, target):
    schedule, first = leased_first_run(tenant, target, "allow")
    next_occurrence_due(schedule)
    scan_until_idle()
    assert later_runs(schedule, first.run_id) == [("ready", "")]


def test_skip_records_the_overlapping_occurrence_as_skipped(tenant, target):
    schedule, first = leased_first_run(tenant, target, "skip")
    next_occurrence_due(schedule)
    scan_until_idle()
    assert later_runs(schedule, first.run_id) == [("skipped", "overlap")]
    assert OutboxEvent.objects.filter(kind="run.skipped", payload__reason="overlap").count() == 1


def test_buffer_one_holds_one_and_skips_the_next_then_releases_it_when_the_earlier_completes(tenant, target):
    schedule, first = leased_first_run(tenant, target, "buffer_one")
    next_occurrence_due(schedule, 20)
    scan_until_idle()
    next_occurrence_due(schedule, 10)
    scan_until_idle()
    assert later_runs(schedule, first.run_id) == [("ready", "buffered"), ("skipped", "overlap")]
    buffered = Run.objects.get(schedule=schedule, reason="buffered")
    assert buffered.next_eligible_at == BUFFERED_UNTIL
    assert claim("w-2", 10) == []  # it waits

    complete([Result(first, "succeeded", http_status=200)])

    buffered.refresh_from_db()
    assert buffered.reason == "" and buffered.next_eligible_at <= Run.objects.get(id=first.run_id).finished_at
    assert OutboxEvent.objects.filter(run=buffered, kind="run.unbuffered").count() == 1
    assert [c.run_id for c in claim("w-2", 10)] == [buffered.id]


def test_a_buffered_run_is_released_when_the_earlier_run_dies_of_an_expired_lease(tenant, target):
    schedule, first = leased_first_run(tenant, target, "buffer_one", max_attempts=1)
    next_occurrence_due(schedule)
    scan_until_idle()
    expire_lease(first.run_id)
    expire_leases()
    assert Run.objects.get(id=first.run_id).state == "dead"
    assert Run.objects.get(schedule=schedule, scheduled_time__gt=first.scheduled_time).reason == ""


def test_a_buffered_run_waits_while_the_earlier_run_retries(tenant, target):
    schedule, first = leased_first_run(tenant, target, "buffer_one")
    next_occurrence_due(schedule)
    scan_until_idle()
    complete([Result(first, "failed", retryable=True, http_status=503)])
    assert Run.objects.get(id=first.run_id).state == "ready"
    assert Run.objects.get(schedule=schedule, scheduled_time__gt=first.scheduled_time).reason == "buffered"


def test_the_reconciler_wakes_a_buffered_run_whose_earlier_run_was_canceled(tenant, target):
    # An operator cancel does not go through complete(); without the reconciler's sweep the
    # buffered run would wait forever.
    schedule, first = leased_first_run(tenant, target, "buffer_one")
    next_occurrence_due(schedule)
    scan_until_idle()
    cancel_run(first.run_id, by=ACTOR)
    skip_unclaimed_misfires()
    woken = Run.objects.get(schedule=schedule, scheduled_time__gt=first.scheduled_time)
    assert (woken.state, woken.reason) == ("ready", "")
    # Its grace counts from its release, so the same reconcile pass did not skip it as missed.
    assert woken.next_eligible_at > woken.scheduled_time


def test_overlap_policy_schedules_are_not_materialised_ahead_of_the_horizon(tenant, target):
    allow = make_schedule(tenant, target.url + "/a", expression="rate(1 minute)")
    skip = make_schedule(tenant, target.url + "/s", expression="rate(1 minute)", overlap_policy="skip")
    make_due(allow)
    make_due(skip)
    scan_until_idle(horizon=timedelta(minutes=5))
    # allow: now and the next five minutes; skip: only what is due now, decided when it is due.
    assert Run.objects.filter(schedule=allow).count() == 6
    assert Run.objects.filter(schedule=skip).count() == 1


def test_a_waiting_overlap_schedule_inside_the_horizon_neither_spins_nor_blocks_allow_ones(tenant, target):
    from dispatch.loops import scan_step
    from runs.queue import seconds_until_next_due
    from schedules.models import Schedule

    skip = make_schedule(tenant, target.url + "/s", expression="rate(1 minute)", overlap_policy="skip")
    allow = make_schedule(tenant, target.url + "/a", expression="rate(1 minute)")
    soon = (db_now() + timedelta(seconds=4)).replace(microsecond=0)
    # rate() rules count from their anchor: anchor each a minute before its next instant.
    for schedule, at in ((skip, soon), (allow, soon + timedelta(seconds=1))):
        Schedule.objects.filter(id=schedule.id).update(next_run_at=at, anchor_at=at - timedelta(minutes=1))
    # The skip schedule is first in the horizon and not due: a pass leaves it and makes the
    # allow one's run ahead of time; the next pass finds only the waiting one and reports no
    # progress, so the loop sleeps instead of scanning again at once.
    scan_step(batch=10, horizon_seconds=10)
    assert Run.objects.filter(schedule=skip).count() == 0
    assert Run.objects.filter(schedule=allow).count() == 1
    assert scan_step(batch=1, horizon_seconds=10) is False
    # The scanner sleeps until the skip schedule is due, not zero (which would spin).
    wait = seconds_until_next_due(horizon=timedelta(seconds=10))
    assert 2 < wait <= 4
