"""The forecast's summary: the schedules in a forecast's scope counted per group key, kept as they
change (issue 28's incremental forecast).

A forecast groups the schedules by everything its buckets depend on (dispatch.forecast's group
key); grouping ten million of them joined to their versions on every read is most of a full
forecast's cost. Here that grouping is kept instead:

- ForecastGroup holds (tenant, key) -> how many schedules, as of its last fold;
- ForecastDelta holds what changed since: database triggers on schedules and versions (migration
  dispatch 0007) add -n for the key a schedule left and +n for the key it entered, in the
  transaction of the change, whoever makes it (the scanner's advance, an edit, a pause, an archive,
  a create, a delete, SQL by hand);
- a read is one statement over the summary and the deltas together, so it is exact at any moment
  and consistent with itself; no loop needs to run for it;
- a read folds the deltas into the summary when they have grown (one statement on PostgreSQL,
  under an advisory lock that a second reader does not wait for: it reads without folding).

`rebuild()` fills the summary from the schedules again, for stores loaded with the triggers off
(bench/common.py's fast loader) or after restoring a backup of the schedules alone.
"""

from __future__ import annotations

from datetime import datetime

from django.db import connection, transaction

from dispatch.models import ForecastGroup
from scheduler_project.foundation.dbclock import instant_from_db
from schedules.targets import origin_sql

COLS = ("tenant_id, expression, time_zone, dst_skipped, dst_repeated, end_at, anchored, next_run_at, "
        "spread_offset_seconds, misfire_grace_seconds, target_url")
# What a read returns per row, in dispatch.forecast's _GROUP_FIELDS order.
KEY = ("expression, time_zone, dst_skipped, dst_repeated, end_at, anchored, next_run_at, spread_offset_seconds, "
       "misfire_grace_seconds, target_url")
# Deltas are folded in once there are this many, or as many as a sixteenth of the summary's rows,
# whichever is more: a fold reads the whole summary once (and on SQLite rewrites it), so it is
# paid for by several reads, and a read, which adds the deltas not folded yet, stays near the
# summary's own size.
FOLD_AT = 2_000
FOLD_FRACTION = 16
# Another process folding at the same moment holds this (pg_try_advisory_xact_lock).
FOLD_LOCK = 0x46435354  # "FCST"

_ANCHORED = {
    "postgresql": "CASE WHEN strpos(upper(v.expression), 'RATE(') > 0 OR strpos(upper(v.expression), 'FREQ=') > 0 "
                  "THEN s.anchor_at END",
    "sqlite": "CASE WHEN instr(lower(v.expression), 'rate(') > 0 OR instr(lower(v.expression), 'freq=') > 0 "
              "THEN s.anchor_at END",
}


def _schedules_grouped() -> str:
    """The summary as computed from the schedules (what the triggers keep it equal to)."""
    return (f"SELECT s.tenant_id, v.expression, v.time_zone, v.dst_skipped, v.dst_repeated, v.end_at, "
            f"{_ANCHORED[connection.vendor]} AS anchored, s.next_run_at, v.spread_offset_seconds, "
            f"v.misfire_grace_seconds, v.target_url, count(*) AS n "
            f"FROM schedules_schedule s JOIN schedules_scheduleversion v ON v.id = s.current_id "
            f"WHERE s.enabled AND s.status = 'active' AND s.next_run_at IS NOT NULL "
            f"GROUP BY s.tenant_id, v.expression, v.time_zone, v.dst_skipped, v.dst_repeated, v.end_at, "
            f"{_ANCHORED[connection.vendor]}, s.next_run_at, v.spread_offset_seconds, v.misfire_grace_seconds, "
            f"v.target_url")


def _tenant_values(tenant_ids) -> list:
    field = ForecastGroup._meta.get_field("tenant_id")
    return [field.get_db_prep_value(t, connection) for t in tenant_ids]


def grouped(*, tenant_ids=None, until: datetime) -> list:
    """(expression, zone, dst_skipped, dst_repeated, end_at, anchor or None, next_run_at, offset,
    grace, target origin, count) of the schedules in scope with next_run_at before `until`, over
    every tenant or those of `tenant_ids`: what dispatch.forecast's grouped query returns, from
    the summary and the deltas not folded yet, in one statement."""
    fold_if_due()
    where, params = ["next_run_at < %s"], [until if connection.vendor == "postgresql"
                                           else ForecastGroup._meta.get_field("next_run_at")
                                           .get_db_prep_value(until, connection)]
    if tenant_ids is not None:
        values = _tenant_values(tenant_ids)
        if not values:
            return []
        where.append(f"tenant_id IN ({', '.join(['%s'] * len(values))})")
        params += values
    # Read by the target's origin, not its whole URL: the buckets need only its host, and a fleet
    # with an id in every URL would otherwise come back as a row per schedule.
    key = KEY.replace("target_url", origin_sql("target_url", connection.vendor))
    query = (f"-- name: ForecastGroupsRead\n"
             f"SELECT {key}, CAST(sum(n) AS bigint) FROM ("
             f"SELECT {COLS}, n FROM dispatch_forecastgroup UNION ALL SELECT {COLS}, n FROM dispatch_forecastdelta"
             f") x WHERE {' AND '.join(where)} GROUP BY {key} HAVING sum(n) > 0")
    with connection.cursor() as cur:
        cur.execute(query, params)
        rows = cur.fetchall()
    if connection.vendor == "postgresql":
        return rows
    return [(e, z, s, r, instant_from_db(end), instant_from_db(anchor), instant_from_db(nxt), off, grace, url, n)
            for e, z, s, r, end, anchor, nxt, off, grace, url, n in rows]


# How many deltas, and about how many summary rows: on PostgreSQL the planner's estimate (the
# threshold needs no exact figure, and counting the whole summary on every read cost more than
# the read of the deltas).
_COUNTS = {
    "postgresql": "-- name: ForecastCounts\nSELECT (SELECT count(*) FROM dispatch_forecastdelta), "
                  "(SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = 'dispatch_forecastgroup'::regclass)",
    "sqlite": "SELECT (SELECT count(*) FROM dispatch_forecastdelta), (SELECT count(*) FROM dispatch_forecastgroup)",
}


def fold_if_due() -> bool:
    """Fold the deltas into the summary when there are enough of them; whether it folded."""
    with connection.cursor() as cur:
        cur.execute(_COUNTS[connection.vendor])
        deltas, groups = cur.fetchone()
    if deltas < max(FOLD_AT, (groups or 0) // FOLD_FRACTION):
        return False
    return fold()


def _matched(a: str, b: str) -> str:
    """Rows of `a` and `b` with the same key, as a condition the planner can hash (the two
    nullable columns compared through a value no schedule has, so that null matches null)."""
    cols = [c.strip() for c in COLS.split(",")]
    nullable = {"end_at", "anchored"}

    def side(t):
        return ", ".join(f"coalesce({t}.{c}, '-infinity'::timestamptz)" if c in nullable else f"{t}.{c}" for c in cols)
    return f"({side(a)}) = ({side(b)})"


# The deltas' keys only: their summary rows are taken out and put back with the deltas added (a
# key at zero is left out; a key whose deltas cancel out, a schedule paused and resumed, is not
# touched). The summary's other rows are not written: a fold costs what changed
# and one read of the summary, where rewriting the whole of it cost a write (and its WAL) of every
# row, and a fleet of rate() schedules with their own anchors keeps about a row per schedule.
_FOLD_POSTGRES = f"""-- name: ForecastFold
WITH d AS (DELETE FROM dispatch_forecastdelta RETURNING {COLS}, n),
     s AS (SELECT {COLS}, sum(n) AS n FROM d GROUP BY {COLS} HAVING sum(n) <> 0),
     g AS (DELETE FROM dispatch_forecastgroup f USING s WHERE {_matched("f", "s")}
           RETURNING {", ".join(f"f.{c.strip()}" for c in COLS.split(","))}, f.n)
INSERT INTO dispatch_forecastgroup ({COLS}, n)
SELECT {COLS}, sum(n) FROM (SELECT {COLS}, n FROM s UNION ALL SELECT {COLS}, n FROM g) x
GROUP BY {COLS} HAVING sum(n) <> 0
"""


def fold() -> bool:
    """The deltas into the summary. PostgreSQL: one statement (it folds exactly the deltas it
    deletes, so a delta committed meanwhile stays for the next fold), under an advisory lock; a
    reader that finds it taken reads without folding (False). SQLite has one writer at a time: the
    first statement takes the write lock, so nothing changes between the read and the rewrite."""
    with transaction.atomic(), connection.cursor() as cur:
        if connection.vendor == "postgresql":
            cur.execute("SELECT pg_try_advisory_xact_lock(%s)", [FOLD_LOCK])
            if not cur.fetchone()[0]:
                return False
            cur.execute(_FOLD_POSTGRES)
            return True
        cur.execute("UPDATE dispatch_forecastdelta SET n = n WHERE id = (SELECT min(id) FROM dispatch_forecastdelta)")
        cur.execute(f"SELECT {COLS}, sum(n) FROM (SELECT {COLS}, n FROM dispatch_forecastgroup UNION ALL "
                    f"SELECT {COLS}, n FROM dispatch_forecastdelta) x GROUP BY {COLS} HAVING sum(n) <> 0")
        rows = cur.fetchall()
        cur.execute("DELETE FROM dispatch_forecastdelta")
        cur.execute("DELETE FROM dispatch_forecastgroup")
        cur.executemany(f"INSERT INTO dispatch_forecastgroup ({COLS}, n) VALUES ({', '.join(['%s'] * 12)})", rows)
        return True


def rebuild() -> None:
    """The summary computed again from the schedules, the deltas dropped: with schedules and
    versions locked against writes meanwhile (reads go on), so no change is missed or counted twice."""
    with transaction.atomic(), connection.cursor() as cur:
        if connection.vendor == "postgresql":
            cur.execute("LOCK TABLE schedules_schedule, schedules_scheduleversion IN SHARE ROW EXCLUSIVE MODE")
            cur.execute("SELECT pg_advisory_xact_lock(%s)", [FOLD_LOCK])
        cur.execute("DELETE FROM dispatch_forecastdelta")
        cur.execute("DELETE FROM dispatch_forecastgroup")
        cur.execute(f"INSERT INTO dispatch_forecastgroup ({COLS}, n) {_schedules_grouped()}")


def differences() -> list:
    """Keys whose count in the summary (with the deltas) differs from the schedules' own, as
    (tenant, key..., kept, actual): empty when the summary is right. For tests and checks."""
    with connection.cursor() as cur:
        cur.execute(f"SELECT {COLS}, sum(kept), sum(actual) FROM ("
                    f"SELECT {COLS}, n AS kept, 0 AS actual FROM dispatch_forecastgroup UNION ALL "
                    f"SELECT {COLS}, n, 0 FROM dispatch_forecastdelta UNION ALL "
                    f"SELECT {COLS}, 0, n FROM ({_schedules_grouped()}) s) x "
                    f"GROUP BY {COLS} HAVING sum(kept) <> sum(actual)")
        return cur.fetchall()
