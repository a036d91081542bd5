"""The settings of partitioning and retention, read from Django's settings when it defines them and
from the environment otherwise (the same names), with these defaults. (They live here rather than
in scheduler_project/settings.py so that the history feature carries its own configuration; tests
override them with Django's `settings` fixture like any other setting.)"""

import environ
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

_env = environ.Env()

# name: (type, default)
DEFAULTS = {
    # Width of one partition of the history tables (seconds). Retention removes whole partitions,
    # so a run is kept between N days and N days + this.
    "SCHEDULER_PARTITION_SECONDS": (int, 86_400),
    # Partitions exist at least this far beyond now (besides one partition width); the scanner's
    # look-ahead never makes runs further ahead than SCHEDULER_LOOKAHEAD_SECONDS.
    "SCHEDULER_PARTITION_AHEAD_SECONDS": (int, 3_600),
    # How long partition DDL waits for the tables' lock before giving up until the next pass (at most
    # half of PostgreSQL's deadlock_timeout: runs.partitions, "Lock order").
    "SCHEDULER_PARTITION_LOCK_TIMEOUT_MS": (int, 200),
    # How long partition DDL waits for the scanner pass in progress to end (new passes step aside
    # meanwhile: runs.partitions, "The scanner's gate") before giving up until the next pass.
    "SCHEDULER_PARTITION_GATE_TIMEOUT_MS": (int, 3_000),
    # Succeeded, canceled and skipped runs are kept this many days after their scheduled time.
    "SCHEDULER_RETENTION_DAYS": (float, 14.0),
    # Dead runs (the dead-letter queue) are kept this many days after they went dead.
    "SCHEDULER_DEAD_RETENTION_DAYS": (float, 30.0),
    # Where removals write what they remove first (JSON Lines, gzip); empty: no export.
    "SCHEDULER_RETENTION_EXPORT_DIR": (str, ""),
    # A removal holding more survivors than this waits (and says so) instead of copying them.
    "SCHEDULER_RETENTION_MAX_SURVIVORS": (int, 2_000_000),
    # Runs removed per batch where removal is by batches (SQLite; tenants keeping less than the default).
    "SCHEDULER_RETENTION_BATCH": (int, 1_000),
    # Interval of the maintenance loop (partitions ahead, sealing, retention).
    "SCHEDULER_MAINTENANCE_SECONDS": (float, 60.0),
}


# The smallest value each number may take (and all are finite): 0 partition seconds would divide by
# zero, a lock timeout of 0 is no timeout at all (dispatch would queue behind the DDL), a negative
# or NaN retention would remove every finished run or make each pass fail. The retention periods
# stop at runs.models.MAX_RETENTION_DAYS, as a tenant's own policy does.
MINIMUM = {
    "SCHEDULER_PARTITION_SECONDS": 1, "SCHEDULER_PARTITION_AHEAD_SECONDS": 0,
    "SCHEDULER_PARTITION_LOCK_TIMEOUT_MS": 1, "SCHEDULER_PARTITION_GATE_TIMEOUT_MS": 1,
    "SCHEDULER_RETENTION_DAYS": 0, "SCHEDULER_DEAD_RETENTION_DAYS": 0,
    "SCHEDULER_RETENTION_MAX_SURVIVORS": 0, "SCHEDULER_RETENTION_BATCH": 1, "SCHEDULER_MAINTENANCE_SECONDS": 0.1,
}


def get(name: str):
    kind, default = DEFAULTS[name]
    value = getattr(settings, name, None)
    try:
        value = kind(value) if value is not None else _env.get_value(name, cast=kind, default=default)
    except (TypeError, ValueError):
        raise ImproperlyConfigured(f"{name} = {value if value is not None else _env.str(name)!r}: it must be "
                                   f"a {'whole ' if kind is int else ''}number") from None
    if name in MINIMUM:
        from runs.models import MAX_RETENTION_DAYS

        # PostgreSQL takes a lock timeout of at most 2^31 - 1 ms.
        top = (MAX_RETENTION_DAYS if name.endswith("RETENTION_DAYS")
               else 2**31 - 1 if name.endswith("_MS") else float("inf"))
        if not (MINIMUM[name] <= value <= top) or value != value:
            raise ImproperlyConfigured(f"{name} = {value!r}: it must be a number from {MINIMUM[name]}"
                                       + (f" to {top}" if top != float("inf") else ""))
    return value
