"""Two workers (separate connections) over 1,000 ready runs: each run claimed exactly once per
generation, none lost."""

import threading

import pytest
from django.db import connection

from dispatch.loops import drain, scan_step
from runs import queue
from runs.models import Attempt, Run
from tests.helpers import make_due, make_schedule

pytestmark = pytest.mark.django_db(transaction=True)


def _ready_runs(tenant, target, n):
    from datetime import timedelta

    from scheduler_project.foundation.dbclock import db_now
    from schedules.models import Schedule

    now = db_now().replace(microsecond=0)
    for i in range(n // 10):
        s = make_schedule(tenant, target.url + f"/c{i}", misfire_policy="catch_up", catchup_limit=100)
        # ten occurrences each, all inside the catch-up limit
        Schedule.objects.filter(id=s.id).update(next_run_at=now - timedelta(minutes=9), anchor_at=now - timedelta(minutes=10))
    drain(scan_step)
    assert Run.objects.filter(state="ready").count() == n


@pytest.mark.postgresql_only("FOR UPDATE SKIP LOCKED between two workers' connections")
def test_two_workers_claim_every_run_exactly_once(tenant, target):
    _ready_runs(tenant, target, 1000)
    claimed = {"a": [], "b": []}
    barrier = threading.Barrier(2)

    def worker(name):
        try:
            barrier.wait()
            while True:
                got = queue.claim(f"w-{name}", 37)
                if not got:
                    break
                claimed[name].extend((c.run_id, c.generation) for c in got)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(n,)) for n in claimed]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    both = claimed["a"] + claimed["b"]
    assert len(both) == len(set(both)) == 1000
    assert claimed["a"] and claimed["b"], "both workers should have won some claims"
    assert Run.objects.filter(state="leased", generation=1).count() == 1000
    assert Attempt.objects.filter(generation=1, outcome__isnull=True).count() == 1000
    owners = dict(Run.objects.values_list("id", "lease_owner"))
    for rid, _ in claimed["a"]:
        assert owners[rid] == "w-a"
