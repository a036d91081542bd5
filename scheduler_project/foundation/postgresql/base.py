"""Django's PostgreSQL backend, with a connection health check that costs no round trip, and a
cursor for the few statements every API request runs, which PostgreSQL keeps prepared.

Django's check (CONN_HEALTH_CHECKS) sends `SELECT 1` before the first query of every request:
a third of a single create's round trips, paid by every request and every loop step to catch the
rare connection the server has closed (a restart, a failover, a terminated session). A server
that closes a session says so on its socket: a FATAL message, then the end of the stream; and a
peer that vanished without a word is found by the TCP keepalives `DATABASE_URL` sets, which turn
into an error on the socket. So the socket is asked first, without waiting: nothing to read means
the session is as it was left, and the request goes on. Something to read on an idle connection is
read; a closed or failed connection is replaced, and anything else (a notice, a notification) gets
Django's own `SELECT 1`.

What this cannot see is what `SELECT 1` could not either until the keepalives fire: a peer gone
silent in the last seconds. Its first query then fails (a 503 for a request, a failed step for a
loop), and Django replaces the connection at the end of that request, as with `SELECT 1`
(which would have waited on the same dead socket).

Django binds parameters on the client (its default since psycopg 3), so PostgreSQL parses and
plans every statement each time it comes. For the API's key lookup and a create's inserts that
was most of their cost in the server; `prepared_cursor` binds on the server instead, so psycopg
prepares a statement once the connection has run it more than `prepare_threshold` times. Django
sets that threshold to None (never) unless OPTIONS names it; this backend keeps psycopg's own
default instead, which changes nothing else: Django's cursors bind on the client, which never
prepares, and the dispatch statements bind on the server with `prepare=False` (a plan cached while
a queue table was nearly empty is the trap they avoid, runs/store/postgres.py). Only statements
whose plan cannot go stale go through `prepared_cursor`. `?prepare_threshold=none` in DATABASE_URL
turns preparing off, as a PgBouncer older than 1.21 in transaction mode needs.
"""

import inspect
import select

import psycopg
from django.db.backends.postgresql import base
from psycopg import OperationalError, pq

# What psycopg.connect() uses when not told.
PSYCOPG_PREPARE_THRESHOLD = inspect.signature(psycopg.Connection.connect).parameters["prepare_threshold"].default


class DatabaseWrapper(base.DatabaseWrapper):
    def get_connection_params(self):
        params = super().get_connection_params()
        if "prepare_threshold" not in self.settings_dict["OPTIONS"]:
            params["prepare_threshold"] = PSYCOPG_PREPARE_THRESHOLD
        return params

    def prepared_cursor(self):
        """A cursor like `cursor()` (the same transaction, health check, query log and execute
        wrappers) whose parameters are bound on the server, so its statements are prepared."""
        self.close_if_health_check_failed()
        self.ensure_connection()
        with self.wrap_database_errors:
            conn = self.connection
            client_binding, conn.cursor_factory = conn.cursor_factory, base.ServerBindingCursor
            try:
                cursor = self.create_cursor()
            finally:
                conn.cursor_factory = client_binding
            return self._prepare_cursor(cursor)

    def close_if_health_check_failed(self):
        if self.pool or self.connection is None or not self.health_check_enabled or self.health_check_done:
            return
        if not self._idle_and_unread() and not self.is_usable():
            self.close()
        self.health_check_done = True

    def _idle_and_unread(self) -> bool:
        """True when the connection is open, idle, and the server has sent nothing since the last
        result; False means "ask the server" (Django's SELECT 1), which fails on a closed one."""
        conn = self.connection
        if conn.closed or conn.broken or conn.info.transaction_status != pq.TransactionStatus.IDLE:
            return False
        try:
            # poll, not select: a worker with many sockets open can hold descriptors past select's 1024.
            waiting = select.poll()
            waiting.register(conn.fileno(), select.POLLIN)
            if waiting.poll(0):  # readable, or the socket failed or hung up
                conn.pgconn.consume_input()  # reads what came; raises if the server closed the socket
                return False
        except (OSError, ValueError, OperationalError):
            return False
        return True
