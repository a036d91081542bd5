"""Small helpers the tests share: making schedules and runs directly through the services."""

import threading
from datetime import datetime, timedelta, timezone

from django.db import connection

from runs.actions import create_schedule
from runs.models import Run
from scheduler_project.foundation.dbclock import db_now
from schedules.models import Schedule
from schedules.services import Actor

ACTOR = Actor("user:tests")


def make_schedule(tenant, target_url, *, expression="rate(1 minute)", tz="UTC", now=None, **fields) -> Schedule:
    given = {"expression": expression, "time_zone": tz, "target_url": target_url, **fields}
    return create_schedule(tenant, given, by=ACTOR, now=now or db_now())


def make_due(schedule: Schedule, when=None) -> None:
    """Pretend the schedule's next instant has come: move next_run_at to `when` (default: now).
    Rules are computed from their anchor, so the rule is re-anchored for rate() schedules."""
    when = (when or db_now()).replace(microsecond=0)  # rules fire on whole seconds
    Schedule.objects.filter(id=schedule.id).update(next_run_at=when, anchor_at=when - timedelta(minutes=1) if schedule.current.expression.startswith("rate(") else schedule.anchor_at)


def expire_lease(run_id) -> None:
    """Move a lease into the past, as if the lease time had gone by (the database clock decides
    expiry, so the test moves the row, not a clock)."""
    Run.objects.filter(id=run_id).update(lease_until=datetime(2000, 1, 1, tzinfo=timezone.utc))


def utc(*args) -> datetime:
    return datetime(*args, tzinfo=timezone.utc)


def count_queries():
    return len(connection.queries)


def at_once(fn, n: int = 2, *, timeout: float = 120) -> list:
    """Run `fn()` in `n` threads released together (each on its own database connection, closed
    after), and return what each returned; the first error any of them raised is raised here."""
    barrier = threading.Barrier(n)
    results, errors = [], []

    def one():
        try:
            barrier.wait()
            results.append(fn())
        except Exception as exc:  # raised below, in the test's thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    if errors:
        raise errors[0]
    assert len(results) == n, "a thread did not finish in time"
    return results
