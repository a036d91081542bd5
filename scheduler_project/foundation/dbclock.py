"""The database clock: leases, due times and misfire decisions use it, never a process's clock,
so a worker or scanner with a skewed clock cannot stretch a lease or fire early."""

from datetime import datetime, timezone

from django.db import connection
from django.utils.dateparse import parse_datetime


def db_now() -> datetime:
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            # statement time, not transaction start: a long transaction must not see a stale now.
            cur.execute("SELECT statement_timestamp()")
            return cur.fetchone()[0]
    # The embedded SQLite database lives on this machine, so its clock is this machine's.
    return datetime.now(timezone.utc)


def request_now(request) -> datetime:
    """The database clock at this API request's arrival, read by the API key lookup
    (scheduler_project.web.store.find_key) in its statement: one round trip fewer on a create."""
    return getattr(request, "db_now", None) or db_now()


def instant_from_db(value) -> datetime | None:
    """A timestamp read by hand-written SQL, aware: SQLite hands UTC instants back as text or
    naive datetimes."""
    if value is None:
        return None
    at = value if isinstance(value, datetime) else parse_datetime(value)
    return at if at.tzinfo else at.replace(tzinfo=timezone.utc)
