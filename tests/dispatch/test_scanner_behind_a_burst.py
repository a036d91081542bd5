"""A scanner that is behind does not make everything due after a burst wait for the whole burst.

Oldest first, a hundred thousand schedules due at one midnight and made late hold back every
schedule due after that instant, of every tenant, until the last of the burst is made: the soak
saw a tenant with no part in the burst start its every-minute runs 86-210 s late. Behind, a pass
takes half its batch from the oldest due and half from the oldest due after those."""

from datetime import timedelta

import pytest
from django.db.models import Count

from dispatch.loops import scan_step
from runs.models import Run
from scheduler_project.foundation.dbclock import db_now
from schedules.models import Schedule
from tests.helpers import at_once, make_schedule

pytestmark = pytest.mark.django_db(transaction=True)

BATCH = 10


def due_at(tenant, url, at, n: int) -> list:
    ids = [make_schedule(tenant, f"{url}/{at.timestamp():.0f}/{i}", expression="rate(1 day)").id for i in range(n)]
    # rate() counts from its anchor: one period before the instant makes the instant the next one.
    Schedule.objects.filter(id__in=ids).update(next_run_at=at, anchor_at=at - timedelta(days=1))
    return ids


def made(ids) -> int:
    return Run.objects.filter(schedule_id__in=ids).count()


def test_behind_a_burst_a_pass_makes_what_is_due_after_it_too(tenant, other_tenant, target):
    now = db_now().replace(microsecond=0)
    burst = due_at(tenant, target.url, now - timedelta(seconds=30), 3 * BATCH)
    steady = due_at(other_tenant, target.url, now - timedelta(seconds=5), BATCH // 2)
    assert scan_step(batch=BATCH, horizon_seconds=0)
    assert (made(burst), made(steady)) == (BATCH // 2, BATCH // 2)
    # The burst goes on with the rest of each pass, and every due schedule is made once.
    while scan_step(batch=BATCH, horizon_seconds=0):
        pass
    assert (made(burst), made(steady)) == (3 * BATCH, BATCH // 2)
    assert Run.objects.count() == 3 * BATCH + BATCH // 2


def test_in_step_a_pass_takes_the_oldest_first(tenant, other_tenant, target):
    # A burst the look-ahead makes before its instant is not behind: it comes first, whole
    # batches of it, before the schedules due after it.
    now = db_now().replace(microsecond=0)
    burst = due_at(tenant, target.url, now + timedelta(seconds=30), 3 * BATCH)
    later = due_at(other_tenant, target.url, now + timedelta(seconds=40), BATCH // 2)
    assert scan_step(batch=BATCH, horizon_seconds=60)
    assert (made(burst), made(later)) == (BATCH, 0)


def test_two_scanners_behind_a_burst_make_each_occurrence_once(tenant, other_tenant, target):
    now = db_now().replace(microsecond=0)
    ids = (due_at(tenant, target.url, now - timedelta(seconds=30), 4 * BATCH)
           + due_at(other_tenant, target.url, now - timedelta(seconds=20), 2 * BATCH)
           + due_at(other_tenant, target.url, now - timedelta(seconds=10), 2 * BATCH))

    def one_scanner():
        passes = 0
        while scan_step(batch=BATCH, horizon_seconds=0):
            passes += 1
        return passes

    at_once(one_scanner)
    while scan_step(batch=BATCH, horizon_seconds=0):  # what either left when it found all locked
        pass
    per_schedule = dict(Run.objects.filter(schedule_id__in=ids).values("schedule_id").annotate(n=Count("id"))
                        .values_list("schedule_id", "n"))
    assert per_schedule == {i: 1 for i in ids}
