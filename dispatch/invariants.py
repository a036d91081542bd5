"""The invariants of the run model (docs/failure-model.md, "What the invariant checker checks"),
checked against the database (`manage.py check_invariants`, also `manage.py audit`).

Each check is one SQL statement, so on PostgreSQL it reads one consistent snapshot: a transition
writes its run, attempt and outbox rows in one transaction, and a single statement sees all of
them or none, so a check never reports a transition that was half-visible while it read. Each
check returns at most `limit` ids (ordered, so two checks of one state agree) and the total count
(`COUNT(*) OVER ()` before the limit), so the output stays small however broken the data is.

Cost: invariants 1 and 2 scan the occurrence, run and attempt history (they are about every row;
every join between them names the partition key too, so on PostgreSQL's partitioned tables each
partition is joined with its own counterpart);
3 and 4 use the partial indexes on leased runs and open attempts; 5 and 6 look only at the
outbox's retention window (pruned events cannot be checked, see `_outbox_horizon`); 7 reads
enabled active schedules. Run it off-peak or on a replica on a large database.

The checks are plain functions so the fault-injection suite and the tests can call them
(`run_all()`, or one check by name through `CHECKS`).
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from django.conf import settings
from django.db import connection

from runs.models import TERMINAL_STATES, Attempt, AttemptOutcome, EventKind, Occurrence, OutboxEvent, Run
from scheduler_project.foundation.dbclock import db_now
from schedules.models import Schedule, ScheduleVersion, Tenant

DEFAULT_LIMIT = 100
# Slack on top of the reconcile interval (inv. 4) and the scan interval (inv. 7): a loop's step
# takes time, and a busy database delays it; a few seconds late is not a stuck loop.
LOOP_MARGIN_SECONDS = 30.0
# Transitions this close to the retention cut-off are not checked for their events (inv. 5, 6):
# `created_at` comes from the writing process's clock, `published_at` from the database's.
RETENTION_MARGIN = timedelta(hours=1)

CREATION_KINDS = (EventKind.CREATED, EventKind.SKIPPED)
# Events that record an attempt's end, by the attempt's outcome.
RESULT_KINDS = {
    AttemptOutcome.SUCCEEDED: (EventKind.SUCCEEDED,),
    AttemptOutcome.FAILED: (EventKind.RETRY_SCHEDULED, EventKind.DEAD),
    # unknown: the reconciler saw the lease expire, or the worker got no answer after sending
    # (timeout, dropped connection) and reported it like a failure.
    AttemptOutcome.UNKNOWN: (EventKind.LEASE_EXPIRED, EventKind.RETRY_SCHEDULED, EventKind.DEAD),
    AttemptOutcome.ABANDONED: (EventKind.RELEASED, EventKind.CANCELED),
}


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"  # late, not wrong (an unpublished event)


@dataclass
class Violation:
    invariant: int
    check: str  # a stable name, e.g. "occurrence_without_run"
    message: str
    ids: list[str] = field(default_factory=list)  # the first `limit` ids involved
    count: int = 0  # how many in all
    severity: str = Severity.ERROR

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Context:
    """What the checks compare against, taken once per check run from the database clock."""

    now: datetime
    limit: int = DEFAULT_LIMIT

    @property
    def outbox_horizon(self) -> datetime:
        return _outbox_horizon(self.now)


def outbox_alert_seconds() -> float:
    return float(getattr(settings, "SCHEDULER_OUTBOX_ALERT_SECONDS", 300))


def _outbox_horizon(now: datetime) -> datetime:
    """The relay prunes published events older than the retention; anything that happened before
    this instant may have lost its events legitimately, so event checks start here."""
    hours = settings.SCHEDULER_OUTBOX_RETENTION_HOURS
    return now - timedelta(hours=hours) + RETENTION_MARGIN


T = {
    "occ": Occurrence._meta.db_table,
    "run": Run._meta.db_table,
    "att": Attempt._meta.db_table,
    "out": OutboxEvent._meta.db_table,
    "sch": Schedule._meta.db_table,
    "ver": ScheduleVersion._meta.db_table,
    "ten": Tenant._meta.db_table,
}


def _json_text(column: str, key: str) -> str:
    if connection.vendor == "postgresql":
        return f"({column} ->> '{key}')"
    return f"json_extract({column}, '$.{key}')"  # SQLite, the embedded development database


def _json_int(column: str, key: str) -> str:
    if connection.vendor == "postgresql":
        return f"CAST({column} ->> '{key}' AS integer)"
    return f"json_extract({column}, '$.{key}')"


def _in(values) -> str:
    return "(" + ", ".join(f"'{v}'" for v in values) + ")"  # only our own constants, never input


def _query(ctx: Context, sql: str, params: list) -> tuple[list[str], int]:
    """Run a check's SQL (one `id` column) and return (first `limit` ids, total)."""
    wrapped = f"SELECT id, COUNT(*) OVER () FROM ({sql}) v ORDER BY id LIMIT %s"
    with connection.cursor() as cur:
        cur.execute(wrapped, [*params, ctx.limit])
        rows = cur.fetchall()
    return [_id_text(r[0]) for r in rows], (rows[0][1] if rows else 0)


def _id_text(value) -> str:
    """An id as the API and the portal show it: SQLite stores UUIDs as 32 hex digits."""
    text = str(value)
    if len(text) == 32:
        try:
            return str(uuid.UUID(hex=text))
        except ValueError:
            pass
    return text


def _check(ctx, invariant, name, message, sql, params=(), severity=Severity.ERROR) -> list[Violation]:
    ids, count = _query(ctx, sql, list(params))
    if not count:
        return []
    return [Violation(invariant, name, message, ids, count, severity)]


# --- 1: one occurrence per (schedule, version, instant), one run per occurrence ---------------


def duplicate_occurrences(ctx: Context) -> list[Violation]:
    return _check(
        ctx, 1, "duplicate_occurrence",
        "more than one occurrence for one (schedule, version, scheduled time); ids are occurrences",
        f"""SELECT CAST(o.id AS TEXT) AS id FROM {T['occ']} o JOIN (
                SELECT schedule_id, schedule_version, scheduled_time FROM {T['occ']}
                GROUP BY schedule_id, schedule_version, scheduled_time HAVING COUNT(*) > 1
            ) d ON d.schedule_id = o.schedule_id AND d.schedule_version = o.schedule_version
               AND d.scheduled_time = o.scheduled_time""",
    )


def occurrences_without_one_run(ctx: Context) -> list[Violation]:
    # A run belongs to its occurrence and has its scheduled time: a run with another time does not
    # count (and shows under runs_without_occurrence).
    return _check(
        ctx, 1, "occurrence_run_count",
        "an occurrence without exactly one run; ids are occurrences",
        f"""SELECT CAST(o.id AS TEXT) AS id FROM {T['occ']} o
            LEFT JOIN {T['run']} r ON r.occurrence_id = o.id AND r.scheduled_time = o.scheduled_time
            GROUP BY o.id HAVING COUNT(r.id) <> 1""",
    )


def runs_without_occurrence(ctx: Context) -> list[Violation]:
    # In place of the run -> occurrence foreign key, which the time-partitioned tables do not have
    # (runs.models): every run's occurrence exists, with the run's scheduled time.
    return _check(
        ctx, 1, "run_without_occurrence",
        "a run whose occurrence does not exist (or has another scheduled time); ids are runs",
        f"""SELECT CAST(r.id AS TEXT) AS id FROM {T['run']} r
            WHERE NOT EXISTS (SELECT 1 FROM {T['occ']} o
                              WHERE o.id = r.occurrence_id AND o.scheduled_time = r.scheduled_time)""",
    )


# --- 2: attempts are generations 1..generation, one each --------------------------------------


def attempt_generations(ctx: Context) -> list[Violation]:
    # count == max == generation and distinct == count (and min 1) is exactly "1..generation".
    return _check(
        ctx, 2, "attempt_generations",
        "a run's attempts are not exactly generations 1..generation (missing, duplicated or beyond); ids are runs",
        f"""SELECT CAST(r.id AS TEXT) AS id FROM {T['run']} r
            LEFT JOIN (
                SELECT run_id, scheduled_time, COUNT(*) AS n, COUNT(DISTINCT generation) AS d,
                       MIN(generation) AS lo, MAX(generation) AS hi
                FROM {T['att']} GROUP BY run_id, scheduled_time
            ) a ON a.run_id = r.id AND a.scheduled_time = r.scheduled_time
            WHERE COALESCE(a.n, 0) <> r.generation OR COALESCE(a.d, 0) <> COALESCE(a.n, 0)
               OR COALESCE(a.hi, 0) <> r.generation OR (a.n > 0 AND a.lo <> 1)""",
    )


def attempts_without_run(ctx: Context) -> list[Violation]:
    # In place of the attempt -> run foreign key (runs.models): every attempt's run exists, and the
    # attempt carries the run's scheduled time (its partition key).
    return _check(
        ctx, 2, "attempt_without_run",
        "an attempt whose run does not exist (or has another scheduled time); ids are attempts",
        f"""SELECT CAST(a.id AS TEXT) AS id FROM {T['att']} a
            WHERE NOT EXISTS (SELECT 1 FROM {T['run']} r WHERE r.id = a.run_id AND r.scheduled_time = a.scheduled_time)""",
    )


# --- 3: a leased run has exactly one open attempt, of its generation; nothing else has one ----


def leased_without_open_attempt(ctx: Context) -> list[Violation]:
    return _check(
        ctx, 3, "leased_without_open_attempt",
        "a leased run has no open attempt of its current generation; ids are runs",
        f"""SELECT CAST(r.id AS TEXT) AS id FROM {T['run']} r
            WHERE r.state = 'leased' AND NOT EXISTS (
                SELECT 1 FROM {T['att']} a
                WHERE a.run_id = r.id AND a.scheduled_time = r.scheduled_time AND a.generation = r.generation
                  AND a.outcome IS NULL)""",
    )


def misplaced_open_attempts(ctx: Context) -> list[Violation]:
    return _check(
        ctx, 3, "misplaced_open_attempt",
        "an open attempt on a run that is not leased, or not of the run's current generation, or a "
        "second open attempt on one run; ids are runs",
        f"""SELECT CAST(r.id AS TEXT) AS id FROM {T['att']} a
            JOIN {T['run']} r ON r.id = a.run_id AND r.scheduled_time = a.scheduled_time
            WHERE a.outcome IS NULL
            GROUP BY r.id, r.state, r.generation
            HAVING COUNT(*) > 1 OR r.state <> 'leased' OR MAX(a.generation) <> r.generation""",
    )


# --- 4: no lease outlives its end by more than one reconcile interval -------------------------


def stale_leases(ctx: Context) -> list[Violation]:
    cutoff = ctx.now - timedelta(seconds=settings.SCHEDULER_RECONCILE_SECONDS + LOOP_MARGIN_SECONDS)
    return _check(
        ctx, 4, "stale_lease",
        "a run is still leased more than one reconcile interval after its lease ended: is the "
        "reconciler running? ids are runs",
        f"SELECT CAST(id AS TEXT) AS id FROM {T['run']} WHERE state = 'leased' AND lease_until < %s",
        [cutoff],
    )


# --- 5: a terminal run changes only through a manual retry ------------------------------------


def changes_after_terminal(ctx: Context) -> list[Violation]:
    """Within the outbox window, per run in event order: a terminal event followed by anything
    other than `run.retried`; or a run whose latest event is terminal while the run itself is in
    another state (it changed without an event, which can only be a write around the services)."""
    state = _json_text("e.payload", "state")
    terminal = _in(TERMINAL_STATES)
    return _check(
        ctx, 5, "changed_after_terminal",
        "a terminal run changed without a manual retry; ids are runs",
        f"""SELECT CAST(run_id AS TEXT) AS id FROM (
                SELECT e.run_id, {state} AS state,
                       LEAD(e.kind) OVER (PARTITION BY e.run_id ORDER BY e.id) AS next_kind,
                       ROW_NUMBER() OVER (PARTITION BY e.run_id ORDER BY e.id DESC) AS from_end
                FROM {T['out']} e WHERE e.run_id IS NOT NULL AND e.created_at >= %s
            ) s JOIN {T['run']} r ON r.id = s.run_id
            WHERE s.state IN {terminal}
              AND ((s.next_kind IS NOT NULL AND s.next_kind <> 'run.retried')
                   OR (s.from_end = 1 AND r.state <> s.state))
            GROUP BY run_id""",
        [ctx.outbox_horizon],
    )


# --- 6: every transition has its event; every event is published ------------------------------


def runs_without_creation_event(ctx: Context) -> list[Violation]:
    return _check(
        ctx, 6, "run_without_creation_event",
        f"a run's first event is not its creation ({' or '.join(CREATION_KINDS)}); ids are runs",
        f"""SELECT CAST(r.id AS TEXT) AS id FROM {T['run']} r
            LEFT JOIN (SELECT run_id, MIN(id) AS first_id FROM {T['out']}
                       WHERE run_id IS NOT NULL GROUP BY run_id) f ON f.run_id = r.id
            LEFT JOIN {T['out']} e ON e.id = f.first_id
            WHERE r.created_at >= %s AND (e.id IS NULL OR e.kind NOT IN {_in(CREATION_KINDS)})""",
        [ctx.outbox_horizon],
    )


def attempts_without_lease_event(ctx: Context) -> list[Violation]:
    gen = _json_int("e.payload", "generation")
    return _check(
        ctx, 6, "attempt_without_leased_event",
        "an attempt has no run.leased event for its generation; ids are runs",
        f"""SELECT CAST(a.run_id AS TEXT) AS id FROM {T['att']} a
            WHERE a.started_at >= %s AND NOT EXISTS (
                SELECT 1 FROM {T['out']} e
                WHERE e.run_id = a.run_id AND e.kind = 'run.leased' AND {gen} = a.generation)
            GROUP BY a.run_id""",
        [ctx.outbox_horizon],
    )


def results_without_event(ctx: Context) -> list[Violation]:
    gen = _json_int("e.payload", "generation")
    cases = " OR ".join(
        f"(a.outcome = '{outcome}' AND e.kind IN {_in(kinds)})" for outcome, kinds in RESULT_KINDS.items()
    )
    # cancel_run's event carries no generation (it is about the run); it stands for the attempt it
    # abandoned in flight.
    return _check(
        ctx, 6, "result_without_event",
        "a finished attempt's result has no event; ids are runs",
        f"""SELECT CAST(a.run_id AS TEXT) AS id FROM {T['att']} a
            WHERE a.outcome IS NOT NULL AND a.finished_at >= %s AND NOT EXISTS (
                SELECT 1 FROM {T['out']} e
                WHERE e.run_id = a.run_id AND ({cases})
                  AND ({gen} = a.generation OR (e.kind = 'run.canceled' AND a.canceled_in_flight)))
            GROUP BY a.run_id""",
        [ctx.outbox_horizon],
    )


def state_without_event(ctx: Context) -> list[Violation]:
    """A run's state must be the state its latest event announced; a terminal run must have the
    event that ended it. Runs whose events are all older than the window are not judged."""
    state = _json_text("e.payload", "state")
    return _check(
        ctx, 6, "state_without_event",
        "a run's state is not the one its latest event announced (a transition without its event); "
        "ids are runs",
        f"""SELECT CAST(r.id AS TEXT) AS id FROM {T['run']} r
            LEFT JOIN (
                SELECT e.run_id, {state} AS state,
                       ROW_NUMBER() OVER (PARTITION BY e.run_id ORDER BY e.id DESC) AS from_end
                FROM {T['out']} e WHERE e.run_id IS NOT NULL AND e.created_at >= %s
            ) s ON s.run_id = r.id AND s.from_end = 1
            WHERE (s.run_id IS NOT NULL AND s.state <> r.state)
               OR (s.run_id IS NULL AND r.state IN {_in(TERMINAL_STATES)} AND r.finished_at >= %s)""",
        [ctx.outbox_horizon, ctx.outbox_horizon],
    )


def unpublished_events(ctx: Context) -> list[Violation]:
    # Only tenants with a webhook: the relay marks the others' events published without a call,
    # so for them an old unpublished event would mean no relay runs at all, which the webhook
    # tenants' events show as well.
    alert = outbox_alert_seconds()
    cutoff = ctx.now - timedelta(seconds=alert)
    return _check(
        ctx, 6, "unpublished_event",
        f"outbox events unpublished for more than {alert:g}s for a "
        "tenant with a notification webhook (relay down, or the webhook failing: see last_error); "
        "ids are event ids",
        f"""SELECT CAST(e.event_id AS TEXT) AS id FROM {T['out']} e JOIN {T['ten']} t ON t.id = e.tenant_id
            WHERE e.published_at IS NULL AND e.created_at < %s AND t.notification_url <> ''""",
        [cutoff],
        severity=Severity.WARNING,
    )


# --- 7: an enabled schedule's next occurrence is never left behind ----------------------------


def schedules_left_behind(ctx: Context) -> list[Violation]:
    # Grace + one scan interval: after that, occurrences are being skipped as misfires because
    # the scanner is not keeping up (or a schedule's next instant was lost).
    margin = settings.SCHEDULER_POLL_SECONDS + LOOP_MARGIN_SECONDS
    if connection.vendor == "postgresql":
        late = "s.next_run_at < %s - (v.misfire_grace_seconds * interval '1 second')"
        param = ctx.now - timedelta(seconds=margin)
    else:
        late = "julianday(s.next_run_at) < julianday(%s) - v.misfire_grace_seconds / 86400.0"
        param = (ctx.now - timedelta(seconds=margin)).strftime("%Y-%m-%d %H:%M:%f")
    return _check(
        ctx, 7, "schedule_left_behind",
        "an enabled, active schedule has no next occurrence, or its next occurrence is older than its "
        "misfire grace plus a scan interval (is the scanner running?); ids are schedules",
        f"""SELECT CAST(s.id AS TEXT) AS id FROM {T['sch']} s JOIN {T['ver']} v ON v.id = s.current_id
            WHERE s.enabled AND s.status = 'active' AND (s.next_run_at IS NULL OR {late})""",
        [param],
    )


CHECKS = {
    f.__name__: f
    for f in (
        duplicate_occurrences,
        occurrences_without_one_run,
        runs_without_occurrence,
        attempt_generations,
        attempts_without_run,
        leased_without_open_attempt,
        misplaced_open_attempts,
        stale_leases,
        changes_after_terminal,
        runs_without_creation_event,
        attempts_without_lease_event,
        results_without_event,
        state_without_event,
        unpublished_events,
        schedules_left_behind,
    )
}


def run_all(*, limit: int = DEFAULT_LIMIT, now: datetime | None = None) -> list[Violation]:
    ctx = Context(now=now or db_now(), limit=limit)
    found: list[Violation] = []
    for check in CHECKS.values():
        found.extend(check(ctx))
    return found
