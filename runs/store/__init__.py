"""The storage seam of the run queue: the statements that apply what `runs.decisions` decided.

One class per engine with the same methods and the same return shapes:

- `runs.store.portable.PortableStore`: every statement through the ORM. It is the whole store on
  the embedded SQLite database (the quickstart), and the part of PostgreSQL's store that is not
  on the dispatch hot path (manual transitions, the reconciler, releases).
- `runs.store.postgres.PostgresStore`: the same class with the hot statements (materialise, claim,
  heartbeat, complete, events) each rewritten as one round trip.

Which one applies is chosen once, from the configured database engine, the first time `store()`
is called; the contract suite (tests/core/test_store_contract.py) runs the same tests against both.
The writes of the changes people and clients ask for (retry, cancel, pause, ...) are one class,
`runs.store.requested.RequestedChanges`, composed into both.

Methods are named for the entity they read or write, then what they do, River's `Job*`/`Queue*`
way, and each class lists them grouped by entity under a header comment:

- `run_...`: runs (`run_insert_many` materialises, `run_claim_due` / `run_claim` lease,
  `run_extend_leases`, `run_complete`, `run_release_unstarted`, the reconciler's
  `run_lock_expired_leases`, `run_skip_unclaimed`, ..., the requested `run_set_retried`,
  `run_set_canceled`);
- `schedule_...`: schedules (`schedule_insert`, the scanner's `schedule_lock_due` and
  `schedule_advance_many`, the requested `schedule_set_paused`, `schedule_set_resumed`, ...);
- `version_...`, `tenant_...`, `attempt_...`, `event_...` (`event_insert_many`: every outbox event
  is written there), `counter_...` (the portal's kept counts), `rows_insert_new` (new rows of any
  model in bulk), and `history_...` (partitions and retention, `runs.store.history`).

The PostgreSQL statements carry the same names in their first line (`-- name: RunClaimDue` for
`run_claim_due`), as pg_stat_statements and the logs show them.

Every statement runs in the caller's transaction; the caller (`runs.queue` for the loops,
`runs.actions` for the changes people and clients ask for) opens it and decides what to write.
"""

from functools import cache

from django.db import connections


@cache
def store():
    """The store for the default database's engine."""
    if connections["default"].vendor == "postgresql":
        from runs.store.postgres import PostgresStore

        return PostgresStore()
    from runs.store.portable import PortableStore

    return PortableStore()
