"""The schedule counts' statement triggers (0007) find each new or removed schedule's version by its
key, one probe per row, whatever the sizes the planner saw first.

A PL/pgSQL function plans each of its statements once per database session and keeps the plan; a
statement on a transition table is planned for the rows of its first call. A session whose first
schedule insert was a batch (a thousand rows) kept a hash join that reads the whole versions table,
and then read it again for every single create it made: the single create's database cost grew
with the number of schedules (30-70 ms each at 170,000 schedules, in bench/api_create.py). Written
as a lateral subquery that cannot be flattened (OFFSET 0), the version is found by its primary key
for each row, as cheap for one row as for a batch's thousand.

SQLite's triggers are row triggers that already read the version by key: nothing changes there.
"""

from django.db import migrations

SLOTS = 16  # as 0007

# How a schedule row ({rows}: new_schedules or old_schedules) finds its version's sub-minute flag.
PROBED = ("LEFT JOIN LATERAL (SELECT v0.sub_minute FROM schedules_scheduleversion v0 "
          "WHERE v0.id = {rows}.current_id OFFSET 0) v ON true")
JOINED = "LEFT JOIN schedules_scheduleversion v ON v.id = {rows}.current_id"  # 0007's
# The probe is planned once per session too, for the versions table as its statistics then were:
# planned when the table held a page or two, it read that table whole for each row, and kept doing
# so as the table grew until the next ANALYZE. No sequential scan is ever right here.
NO_SEQSCAN = "SET enable_seqscan = off"


def _functions(version: str, settings: str = "") -> str:
    return f"""
CREATE OR REPLACE FUNCTION schedules_count_inserted() RETURNS trigger LANGUAGE plpgsql {settings} AS $$
BEGIN
    -- One upsert per statement, whatever it inserts (a batch create is one COPY).
    INSERT INTO schedules_tenantschedulecount AS c (tenant_id, slot, live, sub_minute)
    SELECT n.tenant_id, mod(pg_backend_pid(), {SLOTS}), count(*), count(*) FILTER (WHERE v.sub_minute)
    FROM new_schedules n {version.format(rows="n")}
    WHERE n.status <> 'archived'
    GROUP BY n.tenant_id
    ON CONFLICT (tenant_id, slot)
    DO UPDATE SET live = c.live + EXCLUDED.live, sub_minute = c.sub_minute + EXCLUDED.sub_minute;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION schedules_count_deleted() RETURNS trigger LANGUAGE plpgsql {settings} AS $$
BEGIN
    -- Only rows that exist are changed: when a tenant's counts go with the tenant, nothing is left.
    UPDATE schedules_tenantschedulecount c SET live = c.live - d.live, sub_minute = c.sub_minute - d.sub_minute
    FROM (SELECT o.tenant_id, count(*) AS live, count(*) FILTER (WHERE v.sub_minute) AS sub_minute
          FROM old_schedules o {version.format(rows="o")}
          WHERE o.status <> 'archived' GROUP BY o.tenant_id) d
    WHERE c.tenant_id = d.tenant_id
      AND c.slot = (SELECT min(m.slot) FROM schedules_tenantschedulecount m WHERE m.tenant_id = d.tenant_id);
    RETURN NULL;
END $$;
"""


POSTGRES = _functions(PROBED, NO_SEQSCAN)
POSTGRES_REVERSE = _functions(JOINED)


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRES)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRES_REVERSE)


class Migration(migrations.Migration):

    dependencies = [
        ("schedules", "0013_schedule_lists_read_by_index"),
    ]

    operations = [migrations.RunPython(forward, backward)]
