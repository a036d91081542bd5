"""The web's store: the statements the HTTP surface runs itself, with its one engine switch.

The key lookup: what every API request needs from the database before its view runs, read in one
round trip on PostgreSQL: the key (by its hash) with its tenant, the tenant's target allowlist and
the counts its quotas read, the request counted against the key's rate limit, and the database
clock. A single create is a handful of round trips in all, so these three reads (key, rate counter,
clock) and the allowlist read of the create were a large share of its cost. On SQLite (one machine,
no network between the web process and the database) the same answer comes from the ORM and `hit`,
step by step, and the allowlist is read when a create asks for it.

Rate counting (the limit itself is api/ratelimit.py): a fixed one-minute window per key, one upsert
per request: insert the (key, minute) row or add one to it, returning the new count and the seconds
left in the window. On PostgreSQL that upsert is part of the key lookup, on the database clock so
every worker agrees on where a minute starts; on the embedded database `hit` runs it on its own.

tests/api/test_web_store.py holds both engines to one contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from django.db import DEFAULT_DB_ALIAS, connection, connections

from scheduler_project.foundation.postgresql.prepared import prepared_cursor
from schedules.models import ApiKey, Tenant


@dataclass
class Found:
    key: ApiKey  # key.tenant is set; on PostgreSQL with its allowlist read (Tenant.known_prefixes)
    # (requests in this window, seconds until it ends) when the request was counted: the key is
    # not revoked and a limit applies; else None.
    counted: tuple[int, float] | None
    now: datetime  # the database clock as the request arrived


def find_key(key_hash: str, *, count: bool) -> Found | None:
    """The key with this hash (revoked or not), or None; with `count`, a key that is not revoked
    has this request counted in its rate-limit window."""
    conn = connections[DEFAULT_DB_ALIAS]
    if conn.vendor == "postgresql":
        return _find_key_postgres(conn, key_hash, count)
    key = ApiKey.objects.select_related("tenant").filter(key_hash=key_hash).first()
    if key is None:
        return None
    if count and key.revoked_at is None:
        n, left, now = hit(key.id)
        return Found(key, (n, left), now)
    return Found(key, None, datetime.now(timezone.utc))


def _columns(model, alias: str, tag: str, conn) -> tuple[str, list]:
    fields = list(model._meta.concrete_fields)
    quote = conn.ops.quote_name
    return ", ".join(f'{alias}.{quote(f.column)} AS "{tag}{i}"' for i, f in enumerate(fields)), fields


def _statement(conn) -> tuple[str, list, list]:
    key_cols, key_fields = _columns(ApiKey, "k", "k", conn)
    tenant_cols, tenant_fields = _columns(Tenant, "t", "t", conn)
    sql = f"""
WITH found AS (
    SELECT {key_cols}, {tenant_cols}, k.id AS key_id, k.revoked_at IS NULL AS active,
           ARRAY(SELECT p.prefix FROM schedules_targetprefix p WHERE p.tenant_id = t.id ORDER BY p.prefix) AS prefixes,
           counts.live, counts.sub_minute
    FROM schedules_apikey k JOIN schedules_tenant t ON t.id = k.tenant_id
    -- What the quotas count (a few rows per tenant, kept by the database: TenantScheduleCount).
    CROSS JOIN LATERAL (SELECT coalesce(sum(c.live), 0) AS live, coalesce(sum(c.sub_minute), 0) AS sub_minute
                        FROM schedules_tenantschedulecount c WHERE c.tenant_id = t.id) counts
    WHERE k.key_hash = %(hash)s
), counted AS (
    -- The rate limit's count (as `hit` counts it), on the database clock.
    INSERT INTO schedules_apiratecounter (key_id, window_start, count)
    SELECT found.key_id, date_trunc('minute', statement_timestamp()), 1 FROM found WHERE %(count)s AND found.active
    ON CONFLICT (key_id, window_start) DO UPDATE SET count = schedules_apiratecounter.count + 1
    RETURNING count, EXTRACT(EPOCH FROM (window_start + interval '1 minute' - statement_timestamp())) AS left_seconds
)
SELECT found.*, counted.count, counted.left_seconds, statement_timestamp()
FROM found LEFT JOIN counted ON TRUE
"""
    return sql, key_fields, tenant_fields


_STATEMENT: dict = {}


def _instance(model, fields, values, conn):
    converted = []
    for field, value in zip(fields, values):
        for convert in field.get_db_converters(conn):
            value = convert(value, field, conn)
        converted.append(value)
    return model.from_db(DEFAULT_DB_ALIAS, [f.attname for f in fields], converted)


def _find_key_postgres(conn, key_hash: str, count: bool) -> Found | None:
    if "sql" not in _STATEMENT:
        _STATEMENT["sql"] = _statement(conn)
    sql, key_fields, tenant_fields = _STATEMENT["sql"]
    # Prepared: planning this statement cost PostgreSQL more than running it, on every request.
    with prepared_cursor(conn) as cur:
        cur.execute(sql, {"hash": key_hash, "count": count})
        row = cur.fetchone()
    if row is None:
        return None
    nk, nt = len(key_fields), len(tenant_fields)
    key = _instance(ApiKey, key_fields, row[:nk], conn)
    key.tenant = _instance(Tenant, tenant_fields, row[nk:nk + nt], conn)
    _key_id, _active, prefixes, live, sub_minute, n, left, now = row[nk + nt:]
    key.tenant.known_prefixes = list(prefixes)
    key.tenant.known_schedule_counts = (int(live), int(sub_minute))
    if n == 1:
        prune(key.id)
    return Found(key, (n, float(left)) if n is not None else None, now)


# --- rate counting -----------------------------------------------------------------------------

_PG_PRUNE = """
DELETE FROM schedules_apiratecounter
WHERE key_id = %s AND window_start < date_trunc('minute', statement_timestamp())
"""

# The embedded database has one machine, so its clock is the process's clock.
_HIT = """
INSERT INTO schedules_apiratecounter (key_id, window_start, count) VALUES (%s, %s, 1)
ON CONFLICT (key_id, window_start) DO UPDATE SET count = schedules_apiratecounter.count + 1
RETURNING count
"""
_PRUNE = "DELETE FROM schedules_apiratecounter WHERE key_id = %s AND window_start < %s"


def hit(key_id) -> tuple[int, float, datetime]:
    """Count one request for the key in a statement of its own, on this process's clock (the
    embedded database); returns (requests in this window, seconds until it ends, the time)."""
    now = datetime.now(timezone.utc)
    window = now.replace(second=0, microsecond=0)
    key = ApiKey._meta.pk.get_db_prep_value(key_id, connection)  # as the engine stores a UUID
    with connection.cursor() as cur:
        cur.execute(_HIT, [key, window])
        (count,) = cur.fetchone()
        if count == 1:
            # First request of a new window: the key's older windows are dead weight.
            cur.execute(_PRUNE, [key, window])
    return count, 60 - (now - window).total_seconds(), now


def prune(key_id) -> None:
    """On PostgreSQL, after the first request of a new window: the key's older windows are dead
    weight."""
    with connection.cursor() as cur:
        cur.execute(_PG_PRUNE, [key_id])
