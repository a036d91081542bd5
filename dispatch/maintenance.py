"""The `maintain` loop: keeps the history tables' partitions ahead of time, seals the quiet ones,
and removes history past its retention (runs.partitions, runs.retention; docs/scaling.md "What an
operator runs and watches"), and folds the forecast's kept counts (dispatch.forecast_store). It
runs in `manage.py scheduler` beside the reconciler and as its own command, `manage.py maintain`;
any number of copies may run, one does the work at a time (an advisory lock on PostgreSQL).

Each step does at most one partition removal and one batch per tenant rule, then reports whether
more is due, so the runner's shutdown and failure handling apply between units as in every loop.
A part whose locks were not granted in time (the tables were busy; runs.partitions, "Lock order")
changed nothing and is tried again after BUSY_RETRY_SECONDS; it never fails the step.
"""

import logging

from django.db import DatabaseError

from dispatch import forecast_store
from runs import partitions, retention
from runs.history_settings import get as setting
from runs.store import store
from scheduler_project.foundation.dbclock import db_now

log = logging.getLogger("scheduler.maintain")

# After a part's locks were not granted in time (a long reader was in the way), try again this soon.
BUSY_RETRY_SECONDS = 5.0


class Maintenance:
    name = "maintain"

    def __init__(self, *, export_dir: str | None = None):
        self.export_dir = export_dir
        self.busy = False
        self.last: retention.PassResult | None = None

    def idle_seconds(self) -> float:
        return BUSY_RETRY_SECONDS if self.busy else setting("SCHEDULER_MAINTENANCE_SECONDS")

    def step(self) -> bool:
        # The forecast's kept counts gain delta rows with every scanner advance; readers fold them,
        # and this folds them when nobody reads the forecast, so they never pile up.
        forecast_store.fold_if_due()
        s = store()
        if not s.partitioned:
            self.last = retention.run_pass(export_dir=self.export_dir)
            self.busy = False
            return self.last.more
        if not partitions.try_advisory_lock():
            return False  # another copy is at it
        busy = []
        try:
            now = db_now()
            # Three independent parts, each of short transactions that give way to dispatch when
            # their locks are not granted in time (runs.partitions, "Lock order"): one that gave
            # way does not hold back the others (when making partitions ahead was refused all
            # along on a loaded host, nothing was removed either and the disk grew).
            try:
                made = s.history_ensure_partitions(now)
                if made and made.created:
                    log.info("partitions made ahead: %s", ", ".join(made.created))
            except partitions.PartitionLockBusy:
                busy.append("making partitions ahead")
            s.history_seal_partitions(now)
            self.last = retention.run_pass(now=now, export_dir=self.export_dir)
            busy += [f"removing {g} history" for g in self.last.busy]
        finally:
            partitions.advisory_unlock()
        self.busy = bool(busy)
        if busy:
            log.info("%s: the tables were busy%s; trying again in %.0f s", ", ".join(busy), held_by(),
                     BUSY_RETRY_SECONDS)
        if self.last.held_back:
            for name, survivors, limit in self.last.held_back:
                log.warning("retention held back: %s would keep %d rows (limit %s)", name, survivors, limit)
        return self.last.more and not self.busy


def held_by() -> str:
    """Who the tables were busy with, for the log: the oldest transactions holding them (a
    maintenance that keeps giving way to one kind of reader tells the operator which)."""
    try:
        holders = partitions.lock_holders()
    except DatabaseError:  # only a diagnosis: never a reason for the step to fail
        return ""
    return " (held by " + "; ".join(str(h) for h in holders) + ")" if holders else ""


def maintain_step(**kwargs) -> bool:
    """One maintenance step (for tests and `--once`)."""
    return Maintenance(**kwargs).step()
