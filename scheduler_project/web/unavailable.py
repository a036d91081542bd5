"""A request the database could not serve (unreachable, restarting, failing over, out of
connections, or a lock or statement timeout) is answered 503 with Retry-After, not 500: the
client's retry is the right move and nothing is wrong with its request. The API answers JSON, the
portal a page of its own that does not touch the database; the error is logged as any other.

Only errors that say so: a connection error, operator intervention (shutdown, cannot connect now,
query canceled), insufficient resources, a serialization failure, a deadlock, a lock not
available; on SQLite a locked or busy database or a file that cannot be opened. Any other
database error (a bug, a limit a request went over) stays a 500, since retrying it would never
help."""

import sqlite3

from django.db import InterfaceError, OperationalError

RETRY_AFTER_SECONDS = 5

MESSAGE = (f"the database did not answer this request (unreachable, restarting, failing over or busy); "
           f"retry in {RETRY_AFTER_SECONDS} s")


def answer_body() -> dict:
    """The JSON of the API's 503 (sent with `Retry-After: RETRY_AFTER_SECONDS`)."""
    return {"error": MESSAGE, "retryAfter": RETRY_AFTER_SECONDS}


# SQLSTATE classes and codes of a database that cannot serve now but may in a moment.
_TRANSIENT_CLASSES = ("08", "53", "57")  # connection exception, insufficient resources, operator intervention
_TRANSIENT_CODES = frozenset({"40001", "40P01", "55P03"})  # serialization failure, deadlock, lock not available
_SQLITE_TRANSIENT = ("database is locked", "database is busy", "database table is locked",
                     "unable to open database file", "disk i/o error")


def database_unavailable(exc: BaseException | None) -> bool:
    """Whether `exc` (Django's wrapped database error) means the database cannot serve now."""
    if isinstance(exc, InterfaceError):
        return True  # the connection is already closed or broken
    if not isinstance(exc, OperationalError):
        return False
    cause = exc.__cause__
    if isinstance(cause, sqlite3.Error):
        text = str(cause).lower()
        return any(t in text for t in _SQLITE_TRANSIENT)
    code = getattr(cause, "sqlstate", None)
    if code:
        return code[:2] in _TRANSIENT_CLASSES or code in _TRANSIENT_CODES
    # psycopg's errors without a SQLSTATE are the client's: the server closed the connection,
    # the connection could not be made, the socket failed.
    return True
