"""Planner settings for a few statements of a transaction: rows looked up by key are read
through their indexes whatever PostgreSQL's statistics say.

A loop that reads a batch's rows by key sends one IN list of a few thousand keys; PostgreSQL
reads the whole table (or a whole day's run partition) instead whenever it judges that cheaper
than probing, which it does until the table is large enough, so such a read grows with the
table up to that point rather than with the batch. The run store fences its completions the
same way (runs/store/postgres.py, _BY_PRIMARY_KEY)."""

from contextlib import contextmanager

from django.db import connection

_SETTINGS = ("enable_seqscan", "enable_bitmapscan")
# The same, as select-list items to append to a statement the caller sends anyway (no round trip
# of its own); for the rest of the transaction, as the run store's completions want it.
BY_KEY_FOR_THE_TRANSACTION = "".join(f", set_config('{s}', 'off', true)" for s in _SETTINGS)


@contextmanager
def by_key():
    """Within the block (in a transaction), index scans only where an index serves the
    statement; the settings as they were afterwards. Nothing on SQLite, whose planner probes an
    IN list by key anyway. Left alone on an error: the transaction's end undoes them."""
    if connection.vendor != "postgresql":
        yield
        return
    with connection.cursor() as cur:
        cur.execute("SELECT " + ", ".join(f"current_setting('{s}'), set_config('{s}', 'off', true)" for s in _SETTINGS))
        row = cur.fetchone()
    yield
    with connection.cursor() as cur:
        cur.execute("SELECT " + ", ".join(f"set_config('{s}', %s, true)" for s in _SETTINGS), [row[0], row[2]])
