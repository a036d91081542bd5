"""Per-tenant counts of schedules that are not archived (and of those with a sub-minute rule), kept
by triggers on schedules_schedule, for the quotas (schedules.models.TenantScheduleCount).

The counts are filled from the schedules already stored while the schedule table is locked
against writes (reads go on), in the migration's transaction, so no schedule made or archived
meanwhile is missed or counted twice. That count reads every schedule once, and schedule writes
(creates, edits, archiving, the scanners' updates) wait for it; docs/scaling.md has how long it
took per million schedules.

A schedule's tenant never changes (nothing changes it), so the triggers follow its status (archived
or not), its current version (whose rule may or may not be sub-minute), and inserts and deletes.
"""

import django.db.models.deletion
from django.db import migrations, models

# PostgreSQL: each connection adds to slot mod(pg_backend_pid(), SLOTS) of the tenant's count, so
# concurrent creates of one tenant (several web workers) do not wait on one row.
SLOTS = 16

POSTGRES = f"""
LOCK TABLE schedules_schedule IN SHARE ROW EXCLUSIVE MODE;

CREATE FUNCTION schedules_count_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- One upsert per statement, whatever it inserts (a batch create is one COPY).
    INSERT INTO schedules_tenantschedulecount AS c (tenant_id, slot, live, sub_minute)
    SELECT n.tenant_id, mod(pg_backend_pid(), {SLOTS}), count(*), count(*) FILTER (WHERE v.sub_minute)
    FROM new_schedules n LEFT JOIN schedules_scheduleversion v ON v.id = n.current_id
    WHERE n.status <> 'archived'
    GROUP BY n.tenant_id
    ON CONFLICT (tenant_id, slot)
    DO UPDATE SET live = c.live + EXCLUDED.live, sub_minute = c.sub_minute + EXCLUDED.sub_minute;
    RETURN NULL;
END $$;

CREATE TRIGGER schedule_count_inserted AFTER INSERT ON schedules_schedule
REFERENCING NEW TABLE AS new_schedules FOR EACH STATEMENT EXECUTE FUNCTION schedules_count_inserted();

CREATE FUNCTION schedules_count_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    was_live int := (OLD.status <> 'archived')::int;
    is_live int := (NEW.status <> 'archived')::int;
    was_sub int := was_live * coalesce(
        (SELECT v.sub_minute::int FROM schedules_scheduleversion v WHERE v.id = OLD.current_id), 0);
    is_sub int := is_live * coalesce(
        (SELECT v.sub_minute::int FROM schedules_scheduleversion v WHERE v.id = NEW.current_id), 0);
BEGIN
    IF is_live <> was_live OR is_sub <> was_sub THEN
        INSERT INTO schedules_tenantschedulecount AS c (tenant_id, slot, live, sub_minute)
        VALUES (NEW.tenant_id, mod(pg_backend_pid(), {SLOTS}), is_live - was_live, is_sub - was_sub)
        ON CONFLICT (tenant_id, slot)
        DO UPDATE SET live = c.live + EXCLUDED.live, sub_minute = c.sub_minute + EXCLUDED.sub_minute;
    END IF;
    RETURN NULL;
END $$;

-- Row by row, but only for rows whose status or version changed: the WHEN is tested without
-- calling the function, so the scanners' updates of next_run_at cost nothing here.
CREATE TRIGGER schedule_count_changed AFTER UPDATE OF status, current_id ON schedules_schedule
FOR EACH ROW WHEN ((OLD.status = 'archived') IS DISTINCT FROM (NEW.status = 'archived')
                   OR OLD.current_id IS DISTINCT FROM NEW.current_id)
EXECUTE FUNCTION schedules_count_changed();

CREATE FUNCTION schedules_count_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Only rows that exist are changed: when a tenant's counts go with the tenant, nothing is left.
    UPDATE schedules_tenantschedulecount c SET live = c.live - d.live, sub_minute = c.sub_minute - d.sub_minute
    FROM (SELECT o.tenant_id, count(*) AS live, count(*) FILTER (WHERE v.sub_minute) AS sub_minute
          FROM old_schedules o LEFT JOIN schedules_scheduleversion v ON v.id = o.current_id
          WHERE o.status <> 'archived' GROUP BY o.tenant_id) d
    WHERE c.tenant_id = d.tenant_id
      AND c.slot = (SELECT min(m.slot) FROM schedules_tenantschedulecount m WHERE m.tenant_id = d.tenant_id);
    RETURN NULL;
END $$;

CREATE TRIGGER schedule_count_deleted AFTER DELETE ON schedules_schedule
REFERENCING OLD TABLE AS old_schedules FOR EACH STATEMENT EXECUTE FUNCTION schedules_count_deleted();

INSERT INTO schedules_tenantschedulecount (tenant_id, slot, live, sub_minute)
SELECT s.tenant_id, 0, count(*), count(*) FILTER (WHERE v.sub_minute)
FROM schedules_schedule s LEFT JOIN schedules_scheduleversion v ON v.id = s.current_id
WHERE s.status <> 'archived'
GROUP BY s.tenant_id;
"""

POSTGRES_REVERSE = """
DROP TRIGGER schedule_count_inserted ON schedules_schedule;
DROP TRIGGER schedule_count_changed ON schedules_schedule;
DROP TRIGGER schedule_count_deleted ON schedules_schedule;
DROP FUNCTION schedules_count_inserted();
DROP FUNCTION schedules_count_changed();
DROP FUNCTION schedules_count_deleted();
"""

# SQLite has row triggers only, and one writer at a time: one slot.
_SUB_MINUTE = "coalesce((SELECT v.sub_minute FROM schedules_scheduleversion v WHERE v.id = {row}.current_id), 0)"
_ADD = ("ON CONFLICT (tenant_id, slot) "
        "DO UPDATE SET live = live + excluded.live, sub_minute = sub_minute + excluded.sub_minute")

SQLITE = [
    f"""CREATE TRIGGER schedule_count_inserted AFTER INSERT ON schedules_schedule
    WHEN NEW.status <> 'archived' BEGIN
        INSERT INTO schedules_tenantschedulecount (tenant_id, slot, live, sub_minute)
        VALUES (NEW.tenant_id, 0, 1, {_SUB_MINUTE.format(row="NEW")}) {_ADD};
    END""",
    f"""CREATE TRIGGER schedule_count_changed AFTER UPDATE OF status, current_id ON schedules_schedule
    WHEN (OLD.status = 'archived') IS NOT (NEW.status = 'archived') OR OLD.current_id IS NOT NEW.current_id BEGIN
        INSERT INTO schedules_tenantschedulecount (tenant_id, slot, live, sub_minute)
        SELECT NEW.tenant_id, 0, d.live, d.sub_minute FROM (
            SELECT (NEW.status <> 'archived') - (OLD.status <> 'archived') AS live,
                   (NEW.status <> 'archived') * {_SUB_MINUTE.format(row="NEW")}
                   - (OLD.status <> 'archived') * {_SUB_MINUTE.format(row="OLD")} AS sub_minute) d
        WHERE d.live <> 0 OR d.sub_minute <> 0 {_ADD};
    END""",
    f"""CREATE TRIGGER schedule_count_deleted AFTER DELETE ON schedules_schedule
    WHEN OLD.status <> 'archived' BEGIN
        UPDATE schedules_tenantschedulecount
        SET live = live - 1, sub_minute = sub_minute - {_SUB_MINUTE.format(row="OLD")}
        WHERE tenant_id = OLD.tenant_id AND slot = (
            SELECT min(m.slot) FROM schedules_tenantschedulecount m WHERE m.tenant_id = OLD.tenant_id);
    END""",
    """INSERT INTO schedules_tenantschedulecount (tenant_id, slot, live, sub_minute)
    SELECT s.tenant_id, 0, count(*), coalesce(sum(v.sub_minute), 0)
    FROM schedules_schedule s LEFT JOIN schedules_scheduleversion v ON v.id = s.current_id
    WHERE s.status <> 'archived'
    GROUP BY s.tenant_id""",
]

SQLITE_REVERSE = [f"DROP TRIGGER schedule_count_{event}" for event in ("inserted", "changed", "deleted")]


def count_and_keep_counting(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRES)
    else:
        for statement in SQLITE:
            schema_editor.execute(statement)


def stop_counting(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRES_REVERSE)
    else:
        for statement in SQLITE_REVERSE:
            schema_editor.execute(statement)


class Migration(migrations.Migration):

    dependencies = [
        ("schedules", "0006_membership_role"),
    ]

    operations = [
        migrations.CreateModel(
            name="TenantScheduleCount",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("slot", models.PositiveSmallIntegerField()),
                ("live", models.BigIntegerField(default=0)),
                ("sub_minute", models.BigIntegerField(default=0)),
                (
                    "tenant",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="+", to="schedules.tenant"
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("tenant", "slot"), name="tenant_schedule_count_slot_unique")
                ],
            },
        ),
        migrations.RunPython(count_and_keep_counting, stop_counting),
    ]
