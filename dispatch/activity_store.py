"""The activity loop's writes (dispatch.activity, dispatch.retry_cost): what one pass counted,
added to the rows the portal reads, one statement per table.

- `add_schedule_batches`: each schedule's summary (ScheduleActivity): its totals, its last result
  and last success, its newest outcomes (the sparkline);
- `add_target_minutes`: attempts and failures per target URL and minute (TargetMinute);
- `add_retry_cost_hours`: what retries cost per schedule, owner and target host and hour
  (RetryCostHour).

A pass touches about a row of each per attempt it counts (every schedule that ran, often every
target URL too). On PostgreSQL each is one upsert that adds the pass's increments to the row in
place (`ON CONFLICT ... DO UPDATE`), its input one JSON document: the rows are never read back into
Python. Read, changed as model instances and written back through the ORM's bulk upsert (its
PostgreSQL form sends each column as an array, and a JSON column's text is escaped per character),
they cost the loop about five times a run's whole dispatch in CPU, at the steady rate. On SQLite
(one writer, the quickstart's scale) the ORM does the same read-modify-write.
`tests/dispatch/test_activity_store.py` holds both engines' ways to the same rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime

from django.db import connection

from dispatch.models import RetryCostHour, ScheduleActivity, TargetMinute

# What retry cost counts (dispatch.retry_cost), per row.
RETRY_COUNTERS = ("attempts", "successes", "retries", "retried_runs", "failed", "failed_us", "backoff_us")


def add_counts(into, counts) -> None:
    """Adds the RETRY_COUNTERS of `counts` to those of `into` (a Counts, RetryCost or RetryCostHour)."""
    for name in RETRY_COUNTERS:
        setattr(into, name, (getattr(into, name) or 0) + getattr(counts, name))


@dataclass
class ScheduleBatch:
    """One schedule's attempts of one pass, summed: what its summary row gets added."""

    tenant_id: object
    succeeded: int = 0
    failed: int = 0
    # The pass's last attempt by (finished at, id): it replaces the row's last result if it did not
    # end before the one the row holds.
    last_finished_at: datetime | None = None
    last_outcome: str = ""
    last_http_status: int | None = None
    last_error: str = ""
    last_run_id: object = None
    last_success_at: datetime | None = None
    # The pass's newest outcomes, oldest first, at most ScheduleActivity.RECENT:
    # [finished at (epoch s), outcome code, latency ms or None].
    recent: list = field(default_factory=list)


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


def _str(value) -> str | None:
    return str(value) if value is not None else None


# --- schedule summaries -----------------------------------------------------------------------

# Adds a pass's per-schedule batches (%(rows)s) to their summary rows, made if missing. The last
# result is taken from the batch when it did not end before the row's; the sparkline is the row's
# entries and the batch's, ordered by their end (the row's first among equals, as a stable sort
# of the two lists puts them), the newest RECENT kept. A batch's entries are never empty.
SCHEDULE_FOLD_SQL = """-- name: ActivityScheduleFold
INSERT INTO dispatch_scheduleactivity AS a
    (schedule_id, tenant_id, succeeded, failed, last_finished_at, last_outcome, last_http_status, last_error,
     last_run_id, last_success_at, recent)
SELECT v.s, v.t, v.ok, v.bad, v.lf, v.lo, v.lh, v.le, v.lr, v.ls, v.rc
FROM json_to_recordset(%(rows)s::json) AS v(s uuid, t uuid, ok bigint, bad bigint, lf timestamptz, lo text, lh int,
                                            le text, lr uuid, ls timestamptz, rc jsonb)
ON CONFLICT (schedule_id) DO UPDATE SET
    succeeded = a.succeeded + EXCLUDED.succeeded,
    failed = a.failed + EXCLUDED.failed,
    last_finished_at = CASE WHEN a.last_finished_at IS NULL OR EXCLUDED.last_finished_at >= a.last_finished_at
                            THEN EXCLUDED.last_finished_at ELSE a.last_finished_at END,
    last_outcome = CASE WHEN a.last_finished_at IS NULL OR EXCLUDED.last_finished_at >= a.last_finished_at
                        THEN EXCLUDED.last_outcome ELSE a.last_outcome END,
    last_http_status = CASE WHEN a.last_finished_at IS NULL OR EXCLUDED.last_finished_at >= a.last_finished_at
                            THEN EXCLUDED.last_http_status ELSE a.last_http_status END,
    last_error = CASE WHEN a.last_finished_at IS NULL OR EXCLUDED.last_finished_at >= a.last_finished_at
                      THEN EXCLUDED.last_error ELSE a.last_error END,
    last_run_id = CASE WHEN a.last_finished_at IS NULL OR EXCLUDED.last_finished_at >= a.last_finished_at
                       THEN EXCLUDED.last_run_id ELSE a.last_run_id END,
    last_success_at = GREATEST(a.last_success_at, EXCLUDED.last_success_at),
    -- Attempts mostly end in order: then the two lists joined are in order already, and only
    -- the oldest entries are cut (a JSON path slice); sorting every row's entries costs
    -- PostgreSQL several times that.
    recent = CASE WHEN (EXCLUDED.recent -> 0 ->> 0)::float8 >= coalesce((a.recent -> -1 ->> 0)::float8, '-infinity')
                  THEN jsonb_path_query_array(a.recent || EXCLUDED.recent, %(window)s::jsonpath)
                  ELSE (SELECT coalesce(jsonb_agg(k.e ORDER BY k.at, k.n), '[]'::jsonb)
                        FROM (SELECT x.e, (x.e ->> 0)::float8 AS at, x.n
                              FROM jsonb_array_elements(a.recent || EXCLUDED.recent) WITH ORDINALITY AS x(e, n)
                              ORDER BY at DESC, x.n DESC LIMIT %(recent)s) k) END
"""


def add_schedule_batches(batches: dict) -> None:
    """Add {schedule id: ScheduleBatch} to the schedules' summary rows."""
    if batches:
        (_schedule_batches_sql if connection.vendor == "postgresql" else _schedule_batches_orm)(batches)


def _schedule_batches_sql(batches: dict) -> None:
    rows = [{"s": str(sid), "t": str(b.tenant_id), "ok": b.succeeded, "bad": b.failed, "lf": _iso(b.last_finished_at),
             "lo": b.last_outcome, "lh": b.last_http_status, "le": b.last_error, "lr": _str(b.last_run_id),
             "ls": _iso(b.last_success_at), "rc": b.recent}
            for sid, b in batches.items()]
    with connection.cursor() as cur:
        cur.execute(SCHEDULE_FOLD_SQL, {"rows": json.dumps(rows), "recent": ScheduleActivity.RECENT,
                                        "window": f"$[last - {ScheduleActivity.RECENT - 1} to last]"})


def _schedule_batches_orm(batches: dict) -> None:
    existing = ScheduleActivity.objects.in_bulk(list(batches))
    out = []
    for sid, b in batches.items():
        row = existing.get(sid) or ScheduleActivity(schedule_id=sid, tenant_id=b.tenant_id)
        row.succeeded += b.succeeded
        row.failed += b.failed
        if row.last_finished_at is None or b.last_finished_at >= row.last_finished_at:
            row.last_finished_at, row.last_outcome, row.last_http_status = b.last_finished_at, b.last_outcome, b.last_http_status
            row.last_error, row.last_run_id = b.last_error, b.last_run_id
        if b.last_success_at is not None and (row.last_success_at is None or b.last_success_at > row.last_success_at):
            row.last_success_at = b.last_success_at
        row.recent = sorted(list(row.recent) + b.recent, key=lambda r: r[0])[-ScheduleActivity.RECENT:]
        out.append(row)
    upsert_summed(ScheduleActivity, out, ["schedule_id"], ["succeeded", "failed", "last_finished_at", "last_outcome",
                                                            "last_http_status", "last_error", "last_run_id",
                                                            "last_success_at", "recent"])


# --- target minutes ---------------------------------------------------------------------------

TARGET_MINUTES_SQL = """-- name: ActivityTargetMinutesAdd
INSERT INTO dispatch_targetminute AS m (tenant_id, minute, url_key, target_url, attempts, failed, last_failed_at)
SELECT v.t, v.m, v.k, v.u, v.n, v.f, v.lf
FROM json_to_recordset(%(rows)s::json) AS v(t uuid, m timestamptz, k text, u text, n int, f int, lf timestamptz)
ON CONFLICT (tenant_id, minute, url_key) DO UPDATE SET
    attempts = m.attempts + EXCLUDED.attempts,
    failed = m.failed + EXCLUDED.failed,
    last_failed_at = GREATEST(m.last_failed_at, EXCLUDED.last_failed_at)
"""


def add_target_minutes(increments: dict) -> None:
    """Add {(tenant id, minute, url key): {"url", "attempts", "failed", "last_failed_at"}} to the
    target minute rows."""
    if increments:
        (_target_minutes_sql if connection.vendor == "postgresql" else _target_minutes_orm)(increments)


def _target_minutes_sql(increments: dict) -> None:
    rows = [{"t": str(t), "m": _iso(m), "k": k, "u": inc["url"], "n": inc["attempts"], "f": inc["failed"],
             "lf": _iso(inc["last_failed_at"])}
            for (t, m, k), inc in increments.items()]
    with connection.cursor() as cur:
        cur.execute(TARGET_MINUTES_SQL, {"rows": json.dumps(rows)})


def _target_minutes_orm(increments: dict) -> None:
    existing = {(r.tenant_id, r.minute, r.url_key): r for r in TargetMinute.objects.filter(
        tenant_id__in={k[0] for k in increments}, minute__in={k[1] for k in increments},
        url_key__in={k[2] for k in increments})}
    out = []
    for (tenant, minute, key), inc in increments.items():
        row = existing.get((tenant, minute, key)) or TargetMinute(tenant_id=tenant, minute=minute, url_key=key,
                                                                  target_url=inc["url"])
        row.attempts += inc["attempts"]
        row.failed += inc["failed"]
        if inc["last_failed_at"] and (row.last_failed_at is None or inc["last_failed_at"] > row.last_failed_at):
            row.last_failed_at = inc["last_failed_at"]
        out.append(row)
    upsert_summed(TargetMinute, out, ["tenant_id", "minute", "url_key"], ["attempts", "failed", "last_failed_at"])


# --- retry cost hours -------------------------------------------------------------------------

RETRY_COST_SQL = """-- name: RetryCostHoursAdd
INSERT INTO dispatch_retrycosthour AS h (tenant_id, dimension, key, hour, attempts, successes, retries,
                                         retried_runs, failed, failed_us, backoff_us)
SELECT v.t, v.d, v.k, v.h, v.a, v.s, v.r, v.rr, v.f, v.fu, v.b
FROM json_to_recordset(%(rows)s::json) AS v(t uuid, d text, k text, h timestamptz, a int, s int, r int, rr int,
                                            f int, fu bigint, b bigint)
ON CONFLICT (tenant_id, dimension, key, hour) DO UPDATE SET
    attempts = h.attempts + EXCLUDED.attempts,
    successes = h.successes + EXCLUDED.successes,
    retries = h.retries + EXCLUDED.retries,
    retried_runs = h.retried_runs + EXCLUDED.retried_runs,
    failed = h.failed + EXCLUDED.failed,
    failed_us = h.failed_us + EXCLUDED.failed_us,
    backoff_us = h.backoff_us + EXCLUDED.backoff_us
"""


def add_retry_cost_hours(increments: dict) -> None:
    """Add {(tenant id, dimension, key, hour): counts (with RETRY_COUNTERS)} to the hourly rows."""
    if increments:
        (_retry_cost_hours_sql if connection.vendor == "postgresql" else _retry_cost_hours_orm)(increments)


def _retry_cost_hours_sql(increments: dict) -> None:
    rows = [{"t": str(t), "d": d, "k": k, "h": _iso(h), "a": c.attempts, "s": c.successes, "r": c.retries,
             "rr": c.retried_runs, "f": c.failed, "fu": c.failed_us, "b": c.backoff_us}
            for (t, d, k, h), c in increments.items()]
    with connection.cursor() as cur:
        cur.execute(RETRY_COST_SQL, {"rows": json.dumps(rows)})


def _retry_cost_hours_orm(increments: dict) -> None:
    existing = {(r.tenant_id, r.dimension, r.key, r.hour): r for r in RetryCostHour.objects.filter(
        tenant_id__in={k[0] for k in increments}, dimension__in={k[1] for k in increments},
        key__in={k[2] for k in increments}, hour__in={k[3] for k in increments})}
    out = []
    for k, c in increments.items():
        row = existing.get(k) or RetryCostHour(tenant_id=k[0], dimension=k[1], key=k[2], hour=k[3])
        add_counts(row, c)
        out.append(row)
    upsert_summed(RetryCostHour, out, ["tenant_id", "dimension", "key", "hour"], list(RETRY_COUNTERS))


def upsert_summed(model, rows, unique_fields, update_fields) -> None:
    """Rows new and old, their totals already added up, in one upsert per batch: the activity
    cursor's lock keeps other passes away meanwhile, and an upsert costs the same per row however
    many rows a batch has (bulk_update's CASE per field grows with the batch on both sides)."""
    if rows:
        model.objects.bulk_create(rows, batch_size=500, update_conflicts=True, unique_fields=unique_fields,
                                  update_fields=update_fields)
