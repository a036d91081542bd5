"""PostgreSQL NOTIFY for wake-ups (dispatch.wakeup listens). Sent inside the transaction that
made the work, so it is delivered only if that transaction commits."""

from django.db import connection

RUNS_CHANNEL = "scheduler_runs"  # runs became ready now: wakes idle workers
SCHEDULES_CHANNEL = "scheduler_schedules"  # a schedule may be due sooner: wakes idle scanners


def notify(channel: str) -> None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("SELECT pg_notify(%s, '')", [channel])
