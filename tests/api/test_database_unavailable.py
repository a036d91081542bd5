"""A request the database could not serve is a 503 with Retry-After (the API's JSON, the portal's
own page, /metrics), not a 500; a database error that retrying would not cure stays a 500.

The errors are the drivers' own, raised where a query runs, as Django wraps them: a session
terminated by the server (PostgreSQL's 57P01), a closed connection (no SQLSTATE), a lock timeout,
SQLite's locked database, each on its own engine; on PostgreSQL also for real, a session terminated while idle between
requests."""

import sqlite3
from contextlib import contextmanager

import psycopg
import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

from scheduler_project.web.unavailable import RETRY_AFTER_SECONDS, database_unavailable
from tests.api.conftest import schedule_body
from tests.conftest import ON_SQLITE


def pg_error(sqlstate: str | None, message: str) -> psycopg.Error:
    """The psycopg error class for `sqlstate` (psycopg.OperationalError without one), as the driver raises it."""
    if sqlstate is None:
        return psycopg.OperationalError(message)
    err = psycopg.errors.lookup(sqlstate)(message)
    assert err.sqlstate == sqlstate
    return err


@contextmanager
def every_query_fails_with(driver_error):
    """Each query raises `driver_error` where the driver would, wrapped by Django as the driver's
    errors are (django.db.OperationalError and so on, with the driver's error as the cause)."""

    def fail(execute, sql, params, many, context):
        with connection.wrap_database_errors:
            raise driver_error

    with connection.execute_wrapper(fail):
        yield


# The engine's own driver raises them (Django wraps only its engine's driver errors).
if ON_SQLITE:
    TRANSIENT = [
        pytest.param(sqlite3.OperationalError("database is locked"), id="locked"),
        pytest.param(sqlite3.OperationalError("database table is locked"), id="table-locked"),
        pytest.param(sqlite3.OperationalError("disk I/O error"), id="disk-io"),
    ]
    PERMANENT = [pytest.param(sqlite3.OperationalError("too many SQL variables"), id="too-many-variables")]
else:
    TRANSIENT = [
        pytest.param(pg_error("57P01", "terminating connection due to administrator command"), id="admin-shutdown"),
        pytest.param(pg_error(None, "consuming input failed: server closed the connection unexpectedly"), id="closed"),
        pytest.param(pg_error("55P03", "canceling statement due to lock timeout"), id="lock-timeout"),
        pytest.param(pg_error("53300", "sorry, too many clients already"), id="too-many-clients"),
    ]
    PERMANENT = [pytest.param(pg_error("54000", "index row size exceeds btree maximum"), id="program-limit")]


@pytest.mark.parametrize("driver_error", TRANSIENT)
def test_an_api_request_the_database_cannot_serve_is_a_503_with_retry_after(api, target, driver_error):
    with every_query_fails_with(driver_error):
        resp = api.post("/api/v1/schedules", schedule_body(target), format="json")
    assert resp.status_code == 503, resp.content
    assert resp["Retry-After"] == str(RETRY_AFTER_SECONDS)
    body = resp.json()
    assert body["retryAfter"] == RETRY_AFTER_SECONDS and "database" in body["error"]
    assert str(driver_error) not in resp.content.decode()  # the driver's words stay in the log


@pytest.mark.parametrize("driver_error", PERMANENT)
def test_a_database_error_retrying_would_not_cure_stays_a_500(api, target, driver_error):
    with every_query_fails_with(driver_error):
        resp = api.post("/api/v1/schedules", schedule_body(target), format="json")
    assert resp.status_code == 500 and "Retry-After" not in resp
    assert resp.json() == {"error": "internal error; it has been logged"}


@pytest.mark.parametrize("path", ["/", "/schedules/", "/runs/", "/metrics"])
def test_a_portal_page_the_database_cannot_serve_is_the_503_page(db, path):
    user = User.objects.create_user("olga", password="pw-olga-123", is_staff=True, is_superuser=True)
    client = Client(raise_request_exception=False)
    client.force_login(user)
    with every_query_fails_with(TRANSIENT[0].values[0]):
        resp = client.get(path)
    assert resp.status_code == 503
    assert resp["Retry-After"] == str(RETRY_AFTER_SECONDS)
    text = resp.content.decode()
    assert "The database is unavailable" in text and str(TRANSIENT[0].values[0]) not in text


def test_a_portal_page_with_another_database_error_is_still_a_500(db):
    user = User.objects.create_user("olga", password="pw-olga-123", is_staff=True, is_superuser=True)
    client = Client(raise_request_exception=False)
    client.force_login(user)
    with every_query_fails_with(PERMANENT[0].values[0]):
        resp = client.get("/")
    assert resp.status_code == 500 and "Retry-After" not in resp


def test_only_the_drivers_words_for_an_unavailable_database_count():
    from django.db import DatabaseError, IntegrityError, InterfaceError, OperationalError

    def wrapped(cls, cause):
        exc = cls(str(cause))
        exc.__cause__ = cause
        return exc

    assert database_unavailable(InterfaceError("connection already closed"))
    assert database_unavailable(wrapped(OperationalError, pg_error("08006", "connection failure")))
    assert database_unavailable(wrapped(OperationalError, pg_error("57014", "canceling statement due to statement timeout")))
    assert database_unavailable(wrapped(OperationalError, pg_error("40P01", "deadlock detected")))
    assert database_unavailable(wrapped(OperationalError, sqlite3.OperationalError("unable to open database file")))
    assert not database_unavailable(wrapped(IntegrityError, pg_error("23505", "duplicate key")))
    assert not database_unavailable(wrapped(DatabaseError, pg_error("XX000", "internal error")))
    assert not database_unavailable(wrapped(OperationalError, sqlite3.OperationalError("no such table: x")))
    assert not database_unavailable(RuntimeError("database is locked"))
    assert not database_unavailable(None)


@pytest.mark.postgresql_only("terminates the request's PostgreSQL session from another connection")
@pytest.mark.django_db(transaction=True)
def test_a_session_the_server_terminated_is_a_503_then_the_next_request_reconnects(api, target):
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as other:
        connection.ensure_connection()
        other.execute("SELECT pg_terminate_backend(%s)", [connection.connection.info.backend_pid])
    try:
        # The test client does not run Django's per-request connection checks (production does, and
        # would reconnect first): the request meets the terminated session.
        resp = api.post("/api/v1/schedules", schedule_body(target), format="json")
        assert resp.status_code == 503, resp.content
        assert resp["Retry-After"] == str(RETRY_AFTER_SECONDS)
    finally:
        connection.close()
    again = api.post("/api/v1/schedules", schedule_body(target), format="json")
    assert again.status_code == 201, again.content
