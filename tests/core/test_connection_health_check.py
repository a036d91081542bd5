"""The PostgreSQL connection health check (scheduler_project/foundation/postgresql): a connection whose
socket has nothing to read is kept without a statement; one the server closed while idle is
replaced before the first query, so the request or step that meets it does not fail; anything
else waiting on the socket gets Django's `SELECT 1`. Real sessions, terminated and notified from
another connection."""

import select
import time

import psycopg
import pytest
from django.db import InterfaceError, OperationalError, connection, connections

from schedules.models import Tenant

pytestmark = [
    pytest.mark.postgresql_only("the health check of the PostgreSQL backend; SQLite has no server to lose"),
    pytest.mark.django_db(transaction=True),
]


def backend_pid() -> int:
    return connection.connection.info.backend_pid


def wait_readable(timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not select.select([connection.connection.fileno()], [], [], 0.05)[0]:
        assert time.monotonic() < deadline, "the server sent nothing"


def a_new_request():
    """What Django does at the start of each request (close_old_connections): the next query's
    cursor runs the health check once."""
    connection.health_check_done = False


@pytest.fixture
def other():
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as conn:
        yield conn


@pytest.fixture
def server_asked(monkeypatch):
    calls = []
    real = connection.is_usable

    def spy():
        calls.append(True)
        return real()

    monkeypatch.setattr(connection, "is_usable", spy)
    return calls


def test_the_backend_is_the_one_with_the_socket_check():
    assert type(connections["default"]).__module__ == "scheduler_project.foundation.postgresql.base"
    assert connection.health_check_enabled


def test_a_healthy_idle_connection_is_kept_without_a_statement(server_asked):
    Tenant.objects.count()
    pid = backend_pid()
    a_new_request()
    Tenant.objects.count()
    assert server_asked == [] and backend_pid() == pid


def test_a_session_the_server_terminated_while_idle_is_replaced_before_the_first_query(other, server_asked):
    Tenant.objects.count()
    pid = backend_pid()
    other.execute("SELECT pg_terminate_backend(%s)", [pid])
    wait_readable()
    a_new_request()
    assert Tenant.objects.count() == 0  # no error: replaced before the query
    assert backend_pid() != pid


def test_a_notification_waiting_on_the_socket_gets_the_servers_answer_and_the_connection_stays(other, server_asked):
    with connection.cursor() as cur:
        cur.execute("LISTEN health_check_test")
    pid = backend_pid()
    other.execute("NOTIFY health_check_test")
    wait_readable()
    a_new_request()
    Tenant.objects.count()
    assert server_asked == [True] and backend_pid() == pid
    with connection.cursor() as cur:
        cur.execute("UNLISTEN *")


def test_the_check_runs_once_per_request(other, server_asked):
    Tenant.objects.count()
    pid = backend_pid()
    a_new_request()
    Tenant.objects.count()
    # Terminated after the request's check: its next query meets the closed session, as it would
    # have after a SELECT 1, and Django replaces the connection at the end of the request.
    other.execute("SELECT pg_terminate_backend(%s)", [pid])
    wait_readable()
    with pytest.raises((OperationalError, InterfaceError)):
        Tenant.objects.count()
    connection.close()
    a_new_request()
    assert Tenant.objects.count() == 0


def test_a_socket_numbered_past_select_s_limit_is_checked_the_same(other, server_asked):
    """select() cannot watch a descriptor past 1024, which a busy worker can hold; the check polls."""
    import os
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.fail(f"the test needs 1,200 descriptors; the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    connection.close()  # its descriptor is free now, and the lowest free one is the next one used
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        Tenant.objects.count()
        assert connection.connection.fileno() > 1024
        pid = backend_pid()
        a_new_request()
        Tenant.objects.count()
        assert server_asked == [] and backend_pid() == pid  # kept without a statement
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
        deadline = time.monotonic() + 5
        while not connection.connection.pgconn.socket or not _readable(connection.connection.fileno()):
            assert time.monotonic() < deadline, "the server sent nothing"
        a_new_request()
        assert Tenant.objects.count() == 0 and backend_pid() != pid  # replaced before the query
    finally:
        connection.close()
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _readable(fd) -> bool:
    p = select.poll()
    p.register(fd, select.POLLIN)
    return bool(p.poll(50))
