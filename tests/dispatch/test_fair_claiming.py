"""Tenant-fair claiming, per-tenant in-flight caps, per-target budgets, shard leases, wake-ups."""

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction

from dispatch.loops import Scanner, drain, scan_step
from dispatch.models import ShardLease
from runs import queue
from runs.models import Run
from runs.store import store
from scheduler_project.foundation.dbclock import db_now
from schedules.models import Schedule, TargetPrefix
from schedules.tenants import create_tenant
from tests.helpers import make_schedule

pytestmark = pytest.mark.django_db(transaction=True)


def backlog(tenant, url, schedules, per_schedule):
    now = db_now().replace(microsecond=0)
    ids = []
    for i in range(schedules):
        s = make_schedule(tenant, f"{url}/b{i}", misfire_policy="catch_up", catchup_limit=10_000)
        ids.append(s.id)
    start = now - timedelta(minutes=per_schedule - 1)
    Schedule.objects.filter(id__in=ids).update(next_run_at=start, anchor_at=start)
    drain(scan_step)


@pytest.fixture(autouse=True)
def fresh_limits():
    queue._limits.loaded_at = -1e9  # caps and budgets are cached for a few seconds per process


def test_a_small_tenant_is_served_in_the_first_batch_beside_a_huge_backlog(tenant, other_tenant, target):
    backlog(tenant, target.url, 20, 50)  # 1,000 runs, all older than the small tenant's
    backlog(other_tenant, target.url, 1, 3)
    claimed = queue.claim("w", 20)
    by_tenant = {}
    for c in claimed:
        by_tenant[c.tenant_id] = by_tenant.get(c.tenant_id, 0) + 1
    assert by_tenant[other_tenant.id] == 3  # all of it, though the big tenant's runs are older
    assert by_tenant[tenant.id] == 17  # capacity the small tenant cannot use goes to the other


def test_each_tenant_gets_an_equal_share_when_both_have_plenty(tenant, other_tenant, target):
    backlog(tenant, target.url, 5, 40)
    backlog(other_tenant, target.url, 5, 40)
    claimed = queue.claim("w", 50)
    counts = {tenant.id: 0, other_tenant.id: 0}
    for c in claimed:
        counts[c.tenant_id] += 1
    assert counts == {tenant.id: 25, other_tenant.id: 25}


def test_runs_made_ahead_of_their_time_are_neither_claimed_nor_in_the_way(tenant, other_tenant, target):
    # The look-ahead makes runs ready before their time; a tenant with only such runs must not
    # take a share of the batch, and another tenant's due runs behind them are all claimed
    # (with and without caps in play: the two claim statements).
    backlog(tenant, target.url, 2, 10)
    backlog(other_tenant, target.url, 1, 5)
    Run.objects.filter(tenant=tenant).update(next_eligible_at=db_now() + timedelta(minutes=2))
    claimed = queue.claim("w", 50)
    assert {c.tenant_id for c in claimed} == {other_tenant.id} and len(claimed) == 5
    Run.objects.filter(tenant=other_tenant, state="ready").delete()
    backlog(other_tenant, target.url, 1, 5)
    type(tenant).objects.filter(id=tenant.id).update(max_in_flight=3)
    queue._limits.loaded_at = -1e9
    claimed = queue.claim("w", 50)
    assert {c.tenant_id for c in claimed} == {other_tenant.id} and len(claimed) == 5
    assert Run.objects.filter(tenant=tenant, state="ready").count() == 20


def claims_beside_a_capped_backlog(tenant, other_tenant, url, *, cap: int, batch: int) -> dict:
    """`tenant` capped at `cap` with 60 due runs, `other_tenant` with 30, two workers' claims of
    `batch`: how many each tenant got."""
    type(tenant).objects.filter(id=tenant.id).update(max_in_flight=cap)
    backlog(tenant, url, 2, 30)
    backlog(other_tenant, url, 1, 30)
    got = queue.claim("w1", batch) + queue.claim("w2", batch)
    return {t.id: sum(1 for c in got if c.tenant_id == t.id) for t in (tenant, other_tenant)}


def test_a_tenants_in_flight_cap_holds_across_claims_and_the_rest_stays_ready(tenant, other_tenant, target):
    got = claims_beside_a_capped_backlog(tenant, other_tenant, target.url, cap=7, batch=100)
    leased = Run.objects.filter(state="leased", tenant=tenant).count()
    assert leased == 7
    assert got[tenant.id] == 7
    assert Run.objects.filter(state="leased", tenant=other_tenant).count() == 30
    assert Run.objects.filter(state="ready", tenant=tenant).count() == 60 - 7


def test_a_target_budget_limits_concurrent_calls_to_that_host(tenant, target):
    TargetPrefix.objects.filter(tenant=tenant).update(max_concurrency=4)
    backlog(tenant, target.url, 3, 10)
    assert len(queue.claim("w", 100)) == 4
    assert queue.claim("w", 100) == []
    assert Run.objects.filter(state="leased").count() == 4


def test_sharded_scanners_split_the_shards_and_take_over_a_dead_ones(tenant, target):
    now = db_now().replace(microsecond=0)
    ids = [make_schedule(tenant, f"{target.url}/s{i}").id for i in range(40)]
    Schedule.objects.filter(id__in=ids).update(next_run_at=now, anchor_at=now - timedelta(minutes=1))
    a = Scanner(shards=2, prefer=0, holder="scan-a")
    drain(a.step)
    assert a.held == [0, 1]  # nobody held shard 1 yet, so copy A borrowed it
    b = Scanner(shards=2, prefer=1, holder="scan-b")
    b.step()
    assert b.held == [1]  # B takes its preferred shard back
    a.renewed_at = -1e9
    a.step()
    assert a.held == [0]
    assert Run.objects.count() == 40  # every due schedule made its run exactly once
    # B dies: once its lease runs out, A borrows shard 1 again.
    ShardLease.objects.filter(shard=1).update(lease_until=now - timedelta(seconds=1))
    a.renewed_at = -1e9
    a.step()
    assert a.held == [0, 1]
    lease = ShardLease.objects.get(shards=2, shard=1)
    assert lease.holder == "scan-a" and lease.borrowed


@pytest.mark.postgresql_only("LISTEN/NOTIFY")
def test_a_notify_wakes_an_idle_worker_before_its_poll_interval(tenant, target):
    from dispatch.worker import run_worker

    stop = threading.Event()
    t = threading.Thread(target=run_worker, args=("w-idle",), kwargs={"stop": stop, "poll_seconds": 30})
    t.start()
    try:
        time.sleep(1.5)  # the worker has polled once, found nothing, and sleeps for 30 s
        s = make_schedule(tenant, target.url + "/wake")
        from runs.actions import trigger_schedule
        from tests.helpers import ACTOR

        run = trigger_schedule(s, by=ACTOR)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            run.refresh_from_db()
            if run.state == "succeeded":
                break
            time.sleep(0.1)
        assert run.state == "succeeded"  # well before the 30 s poll: the NOTIFY woke it
    finally:
        stop.set()
        t.join(15)


def test_the_candidates_read_takes_no_more_of_a_tenant_than_its_room(tenant, other_tenant, target):
    # The store's contract, on both engines: a tenant's share, or its room where that is less;
    # a tenant with no room reads nothing.
    backlog(tenant, target.url, 1, 20)
    backlog(other_tenant, target.url, 1, 20)
    with transaction.atomic():
        rows = store().run_due_candidates([tenant.id, other_tenant.id], db_now(), per_tenant=10,
                                          room={tenant.id: 0, other_tenant.id: 3})
    assert [r[1] for r in rows] == [other_tenant.id] * 3
    with transaction.atomic():
        rows = store().run_due_candidates([tenant.id, other_tenant.id], db_now(), per_tenant=4, room={tenant.id: 9})
    assert sorted(str(r[1]) for r in rows) == sorted([str(tenant.id)] * 4 + [str(other_tenant.id)] * 4)


@pytest.mark.postgresql_only("a row lock leaves its locker in the row's xmax after commit")
def test_claims_do_not_lock_the_backlog_of_a_tenant_at_its_cap(tenant, other_tenant, target):
    # A noisy tenant with a cap of 2 and a deep backlog: each claim used to lock a share of its
    # oldest runs (the candidates read, FOR UPDATE) only to leave them, a write to every row read,
    # on every claim, for as long as the backlog lasted. At its cap it is now left out of the read,
    # and below it only its room is read.
    got = claims_beside_a_capped_backlog(tenant, other_tenant, target.url, cap=2, batch=10)
    assert got == {tenant.id: 2, other_tenant.id: 18}
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM runs_run WHERE tenant_id = %s AND state = 'ready' AND xmax <> '0'",
                    [tenant.id])
        assert cur.fetchone()[0] == 0
    assert Run.objects.filter(tenant=tenant, state="ready").count() == 58


def test_the_leased_counts_a_claim_reads_are_the_runs_leased(tenant, other_tenant, target):
    # The store's contract for the counts caps and budgets are held to (on PostgreSQL a statement
    # of its own, planned over the live partitions only).
    got = claims_beside_a_capped_backlog(tenant, other_tenant, target.url, cap=3, batch=10)
    assert store().run_leased_per_tenant([tenant.id, other_tenant.id]) == {tenant.id: 3, other_tenant.id: got[other_tenant.id]}
    host = Run.objects.filter(tenant=tenant).values_list("target_host", flat=True).first()
    per_host = store().run_leased_per_host({(tenant.id, host), (other_tenant.id, "elsewhere:1")})
    assert per_host[(tenant.id, host)] == 3 and per_host.get((other_tenant.id, "elsewhere:1"), 0) == 0
    assert store().run_leased_per_tenant([]) == {}


def test_two_workers_claiming_at_once_hold_a_tenants_cap_between_them(tenant, other_tenant, target):
    # The cap counts across the fleet. Two claims that both read the leased count before either
    # committed both filled the room: 4 leased against a cap of 2 in every round, before each
    # claim held its capped tenants until it commits.
    type(tenant).objects.filter(id=tenant.id).update(max_in_flight=2)
    backlog(tenant, target.url, 2, 30)
    backlog(other_tenant, target.url, 1, 30)
    TargetPrefix.objects.filter(tenant=other_tenant).update(max_concurrency=5)
    for _ in range(3):
        barrier, got, errors = threading.Barrier(2), [], []

        def worker(name):
            try:
                barrier.wait(10)
                got.extend(queue.claim(name, 10))
            except Exception as exc:  # reported below
                errors.append(exc)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert errors == []
        assert Run.objects.filter(tenant=tenant, state="leased").count() == 2
        # The target budget of the other tenant is held the same way.
        assert Run.objects.filter(tenant=other_tenant, state="leased").count() == 5
        Run.objects.filter(state="leased").update(state="ready", lease_until=None, lease_owner="",
                                                  next_eligible_at=db_now() - timedelta(seconds=1))
