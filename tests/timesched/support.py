"""What the time-semantics tests share: schedules placed in the past, and views of their runs."""

from datetime import timedelta

from runs.models import Run
from runs.queue import ScanResult, materialise_due
from scheduler_project.foundation.dbclock import db_now
from schedules.models import Schedule, ScheduleVersion
from tests.helpers import make_schedule


def every_15_minutes_after_outage(tenant, url, *, outage=timedelta(hours=3, minutes=5), **fields) -> Schedule:
    """A rate(15 minutes) schedule whose scanner has been away for `outage`: the anchor and
    next_run_at sit that far back, so 13 occurrences (outage/15 min, rounded down, plus one) are
    due and all past the 60 s grace, the latest 5 minutes ago."""
    schedule = make_schedule(tenant, url, expression="rate(15 minutes)", **fields)
    start = (db_now() - outage).replace(microsecond=0)
    Schedule.objects.filter(id=schedule.id).update(anchor_at=start, next_run_at=start)
    schedule.refresh_from_db()
    return schedule


def scan_until_idle(**kwargs) -> ScanResult:
    """Scanner passes until one makes nothing, summed. (Not "until nothing is due": with a
    horizon, an overlap-policy schedule is due within the horizon but only made when due.)"""
    total = ScanResult()
    batch = kwargs.pop("batch", 500)
    while True:
        r = materialise_due(batch=batch, **kwargs)
        if not (r.runs or r.skipped or r.errors):
            return total
        total.schedules += r.schedules
        total.runs += r.runs
        total.skipped += r.skipped
        total.errors += r.errors


def states(schedule) -> list[tuple]:
    """(scheduled_time, state, reason) of every run of a schedule, oldest first."""
    return list(
        Run.objects.filter(schedule_id=schedule.id).order_by("scheduled_time").values_list("scheduled_time", "state", "reason")
    )


def times(schedule, **filters) -> list:
    return list(
        Run.objects.filter(schedule_id=schedule.id, **filters).order_by("scheduled_time").values_list("scheduled_time", flat=True)
    )


def unsaved(expression, *, tz="UTC", anchor, next_run_at=None, **version_fields):
    """An unsaved schedule and version, enough for runs.queue.plan_schedule (which reads fields
    and the rule, and nothing else from the database)."""
    version = ScheduleVersion(expression=expression, time_zone=tz, target_url="http://x.invalid/", **version_fields)
    schedule = Schedule(anchor_at=anchor, next_run_at=next_run_at or anchor)
    schedule.current = version
    return schedule, version
