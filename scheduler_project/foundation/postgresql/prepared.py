"""The cursor for statements PostgreSQL may keep prepared (see scheduler_project/foundation/postgresql/base.py):
the backend's own on PostgreSQL, Django's plain cursor elsewhere. A statement sent through it
must be one statement (the server binds its parameters) whose plan cannot go stale as tables
grow or empty."""


def prepared_cursor(conn):
    make = getattr(conn, "prepared_cursor", None)
    return make() if make is not None else conn.cursor()
