"""The forecast's summary (dispatch.models.ForecastGroup) and the triggers that keep it: every change
of a schedule or a version that moves a schedule in or out of a forecast group key writes the change
(ForecastDelta) in the same transaction. The scanner's advance of next_run_at is one such change;
on PostgreSQL it costs one grouped insert per statement, not per row.

The summary is filled from the schedules already stored while schedules and versions are locked
against writes (reads go on), in the migration's transaction, as schedules 0007 fills its counts.
"""

from django.db import migrations, models

# The group key of a schedule row `s` with its current version `v` (dispatch.forecast's
# _GROUP_FIELDS, and the tenant), and the forecast's scope.
COLS = ("tenant_id, expression, time_zone, dst_skipped, dst_repeated, end_at, anchored, next_run_at, "
        "spread_offset_seconds, misfire_grace_seconds, target_url")
# (as the forecast's `icontains` reads them; no % here: the schema editor formats the SQL)
PG_ANCHORED = ("CASE WHEN strpos(upper(v.expression), 'RATE(') > 0 OR strpos(upper(v.expression), 'FREQ=') > 0 "
               "THEN s.anchor_at END")
KEY = ("s.tenant_id, v.expression, v.time_zone, v.dst_skipped, v.dst_repeated, v.end_at, {anchored}, s.next_run_at, "
       "v.spread_offset_seconds, v.misfire_grace_seconds, v.target_url")
SCOPE = "s.enabled AND s.status = 'active' AND s.next_run_at IS NOT NULL"


def _pg_delta(rows_sql: str) -> str:
    """One grouped insert of the deltas of `rows_sql` (rows of KEY and a sign)."""
    return (f"INSERT INTO dispatch_forecastdelta ({COLS}, n) SELECT {COLS}, sum(sign) FROM ({rows_sql}) d "
            f"GROUP BY {COLS} HAVING sum(sign) <> 0;")


_ALIASED = ("s.tenant_id, v.expression, v.time_zone, v.dst_skipped, v.dst_repeated, v.end_at, "
            f"{PG_ANCHORED} AS anchored, s.next_run_at, v.spread_offset_seconds, v.misfire_grace_seconds, v.target_url")


def _pg_select(schedules: str, versions: str, sign: int) -> str:
    return (f"SELECT {_ALIASED}, {sign} AS sign FROM {schedules} s JOIN {versions} v ON v.id = s.current_id "
            f"WHERE {SCOPE}")


POSTGRES = f"""
LOCK TABLE schedules_schedule, schedules_scheduleversion IN SHARE ROW EXCLUSIVE MODE;

CREATE FUNCTION forecast_schedules_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        {_pg_delta(_pg_select("new_rows", "schedules_scheduleversion", 1))}
    ELSIF TG_OP = 'DELETE' THEN
        {_pg_delta(_pg_select("old_rows", "schedules_scheduleversion", -1))}
    ELSE
        {_pg_delta(_pg_select("old_rows", "schedules_scheduleversion", -1) + " UNION ALL "
                   + _pg_select("new_rows", "schedules_scheduleversion", 1))}
    END IF;
    RETURN NULL;
END $$;

-- A version changed or deleted in place changes the schedules whose current version it is. A new
-- version counts for none: a schedule is counted when its own row is inserted or pointed at a
-- version (every writer makes the version first, or in the same statement, whose statement
-- triggers then see both rows: counting the insert of the version too would count it twice).
CREATE FUNCTION forecast_versions_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        {_pg_delta(_pg_select("schedules_schedule", "old_rows", -1))}
    ELSE
        {_pg_delta(_pg_select("schedules_schedule", "old_rows", -1) + " UNION ALL "
                   + _pg_select("schedules_schedule", "new_rows", 1))}
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER forecast_schedule_inserted AFTER INSERT ON schedules_schedule
REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION forecast_schedules_changed();
CREATE TRIGGER forecast_schedule_updated AFTER UPDATE ON schedules_schedule
REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION forecast_schedules_changed();
CREATE TRIGGER forecast_schedule_deleted AFTER DELETE ON schedules_schedule
REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION forecast_schedules_changed();
CREATE TRIGGER forecast_version_updated AFTER UPDATE ON schedules_scheduleversion
REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION forecast_versions_changed();
CREATE TRIGGER forecast_version_deleted AFTER DELETE ON schedules_scheduleversion
REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION forecast_versions_changed();

INSERT INTO dispatch_forecastgroup ({COLS}, n)
SELECT {COLS}, count(*) FROM ({_pg_select("schedules_schedule", "schedules_scheduleversion", 1)}) x GROUP BY {COLS};
"""

POSTGRES_REVERSE = """
DROP TRIGGER forecast_schedule_inserted ON schedules_schedule;
DROP TRIGGER forecast_schedule_updated ON schedules_schedule;
DROP TRIGGER forecast_schedule_deleted ON schedules_schedule;
DROP TRIGGER forecast_version_updated ON schedules_scheduleversion;
DROP TRIGGER forecast_version_deleted ON schedules_scheduleversion;
DROP FUNCTION forecast_schedules_changed();
DROP FUNCTION forecast_versions_changed();
"""

# SQLite has row triggers only (and one writer at a time): a row each way.
SQLITE_ANCHORED = ("CASE WHEN instr(lower(v.expression), 'rate(') > 0 OR instr(lower(v.expression), 'freq=') > 0 "
                   "THEN s.anchor_at END")


def _sqlite_row(s: str, v: str, sign: int, where: str) -> str:
    key = KEY.format(anchored=SQLITE_ANCHORED).replace("s.", f"{s}.").replace("v.", f"{v}.")
    scope = SCOPE.replace("s.", f"{s}.")
    return f"INSERT INTO dispatch_forecastdelta ({COLS}, n) SELECT {key}, {sign} FROM {where} AND {scope};"


_S_COLS = "enabled, status, next_run_at, current_id, anchor_at"
SQLITE = [
    f"""CREATE TRIGGER forecast_schedule_inserted AFTER INSERT ON schedules_schedule BEGIN
        {_sqlite_row("NEW", "v", 1, "schedules_scheduleversion v WHERE v.id = NEW.current_id")}
    END""",
    f"""CREATE TRIGGER forecast_schedule_updated AFTER UPDATE OF {_S_COLS} ON schedules_schedule BEGIN
        {_sqlite_row("OLD", "v", -1, "schedules_scheduleversion v WHERE v.id = OLD.current_id")}
        {_sqlite_row("NEW", "v", 1, "schedules_scheduleversion v WHERE v.id = NEW.current_id")}
    END""",
    f"""CREATE TRIGGER forecast_schedule_deleted AFTER DELETE ON schedules_schedule BEGIN
        {_sqlite_row("OLD", "v", -1, "schedules_scheduleversion v WHERE v.id = OLD.current_id")}
    END""",
    f"""CREATE TRIGGER forecast_version_updated AFTER UPDATE ON schedules_scheduleversion BEGIN
        {_sqlite_row("s", "OLD", -1, "schedules_schedule s WHERE s.current_id = OLD.id")}
        {_sqlite_row("s", "NEW", 1, "schedules_schedule s WHERE s.current_id = NEW.id")}
    END""",
    f"""CREATE TRIGGER forecast_version_deleted AFTER DELETE ON schedules_scheduleversion BEGIN
        {_sqlite_row("s", "OLD", -1, "schedules_schedule s WHERE s.current_id = OLD.id")}
    END""",
    f"""INSERT INTO dispatch_forecastgroup ({COLS}, n)
    SELECT {KEY.format(anchored=SQLITE_ANCHORED)}, count(*) FROM schedules_schedule s
    JOIN schedules_scheduleversion v ON v.id = s.current_id WHERE {SCOPE} GROUP BY {KEY.format(anchored=SQLITE_ANCHORED)}""",
]

SQLITE_REVERSE = [f"DROP TRIGGER forecast_{t}" for t in ("schedule_inserted", "schedule_updated", "schedule_deleted",
                                                         "version_updated", "version_deleted")]


def keep_the_summary(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRES)
    else:
        for statement in SQLITE:
            schema_editor.execute(statement)


def stop_keeping_it(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRES_REVERSE)
    else:
        for statement in SQLITE_REVERSE:
            schema_editor.execute(statement)



class Migration(migrations.Migration):

    dependencies = [
        ('dispatch', '0006_retry_cost_and_held_notifications'),
        ('schedules', '0012_owner_quiet_hours'),
    ]

    operations = [
        migrations.CreateModel(
            name='ForecastDelta',
            fields=[
                ('tenant_id', models.UUIDField()),
                ('expression', models.CharField(max_length=2000)),
                ('time_zone', models.CharField(max_length=64)),
                ('dst_skipped', models.CharField(max_length=16)),
                ('dst_repeated', models.CharField(max_length=16)),
                ('end_at', models.DateTimeField(null=True)),
                ('anchored', models.DateTimeField(null=True)),
                ('next_run_at', models.DateTimeField()),
                ('spread_offset_seconds', models.IntegerField()),
                ('misfire_grace_seconds', models.IntegerField()),
                ('target_url', models.CharField(max_length=2000)),
                ('n', models.BigIntegerField()),
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
            ],
            options={
                'abstract': False,
            },
        ),
        migrations.CreateModel(
            name='ForecastGroup',
            fields=[
                ('tenant_id', models.UUIDField()),
                ('expression', models.CharField(max_length=2000)),
                ('time_zone', models.CharField(max_length=64)),
                ('dst_skipped', models.CharField(max_length=16)),
                ('dst_repeated', models.CharField(max_length=16)),
                ('end_at', models.DateTimeField(null=True)),
                ('anchored', models.DateTimeField(null=True)),
                ('next_run_at', models.DateTimeField()),
                ('spread_offset_seconds', models.IntegerField()),
                ('misfire_grace_seconds', models.IntegerField()),
                ('target_url', models.CharField(max_length=2000)),
                ('n', models.BigIntegerField()),
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
            ],
            options={
                'abstract': False,
            },
        ),
        migrations.RunPython(keep_the_summary, stop_keeping_it),
    ]
