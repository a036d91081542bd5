"""An edit cancels the old version's runs that have not started and the new version takes over
from the moment of the edit. A worker may claim one of those runs while the edit is under way
(claims do not take the schedule's lock): that run goes ahead under the old version, so the new
version must not make its instant again. The edit read its clock before cancelling, and a run
claimed in between, for an instant after that reading, was made a second time by the new version:
two deliveries for one instant (bench/soak.py counted such pairs as duplicate runs)."""

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction

from dispatch.loops import drain, scan_step
from runs import actions, queue
from runs.models import Reason, Run, RunState
from scheduler_project.foundation.dbclock import db_now
from tests.helpers import ACTOR, make_schedule

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgresql_only("a claim on one connection while an edit is under way on another"),
]

WAIT = 60.0


class Thread(threading.Thread):
    def __init__(self, fn):
        super().__init__(daemon=True)
        self.fn, self.error, self.pid = fn, None, None
        self.ready = threading.Event()

    def run(self):
        try:
            connection.ensure_connection()
            self.pid = connection.connection.info.backend_pid
            self.ready.set()
            self.fn()
        except BaseException as exc:  # kept for the assertion
            self.error = exc
        finally:
            self.ready.set()
            connection.close()


def waiting(pid) -> bool:
    with connection.cursor() as cur:
        cur.execute("SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = %s AND NOT granted)", [pid])
        return cur.fetchone()[0]


def test_a_run_claimed_while_its_schedule_is_edited_is_the_only_run_of_its_instant(tenant, target):
    at = (db_now() + timedelta(seconds=3)).replace(microsecond=0)
    s = make_schedule(tenant, target.url + "/edited", expression="rate(1 minute)", start_at=at)
    drain(scan_step)  # made ahead (within the scanner's horizon), ready at `at`
    (old,) = Run.objects.filter(schedule=s)
    assert (old.scheduled_time, old.state) == (at, RunState.READY)

    # The edit is held up by the audit table (locked here) after it has begun and before it
    # cancels, while the instant comes and a worker claims the old version's run.
    release, locked = threading.Event(), threading.Event()

    def lock_audit():
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute("LOCK TABLE schedules_auditentry IN SHARE MODE")
            locked.set()
            assert release.wait(WAIT)

    locker = Thread(lock_audit)
    locker.start()
    assert locked.wait(WAIT)
    edit = Thread(lambda: actions.edit_schedule(s, expected_version=1, changes={"payload": {"v": 2}}, by=ACTOR))
    edit.start()
    assert edit.ready.wait(WAIT)
    deadline = time.monotonic() + WAIT
    while not waiting(edit.pid):
        assert time.monotonic() < deadline and edit.is_alive(), f"the edit never waited: {edit.error!r}"
        time.sleep(0.01)
    while db_now() <= at:
        time.sleep(0.05)
    during = [c for c in queue.claim("w-1", 10) if c.schedule_id == s.id]
    release.set()
    for t in (locker, edit):
        t.join(WAIT)
        assert not t.is_alive() and t.error is None, t.error
    drain(scan_step)
    after = [c for c in queue.claim("w-2", 10) if c.schedule_id == s.id]

    # The instant is delivered once: by the old version's run if the worker got to it first
    # (claimed during the edit), else by the new version's.
    assert [(c.scheduled_time, c.schedule_version) for c in during + after] in (
        [(at, 1)], [(at, 2)])
    live = [r.schedule_version for r in Run.objects.filter(schedule=s, scheduled_time=at)
            if not (r.state == RunState.CANCELED and r.reason == Reason.SUPERSEDED)]
    assert len(live) == 1
    s.refresh_from_db()
    assert s.version == 2
