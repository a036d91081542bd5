"""The forecast summary's statement triggers (0007) join each changed schedule to its version (and
each changed version to its schedules) by key, one probe per row, whatever the sizes the planner
saw first.

A PL/pgSQL function plans each of its statements once per database session and keeps the plan; a
statement on a transition table is planned for the rows of its first call. A session whose first
schedule insert was a batch kept a hash join that reads the whole versions table, and read it
again on every later single create or edit (schedules 0014 has the figures). A lateral subquery
that cannot be flattened (OFFSET 0) is an index probe per row, for one row as for a thousand.

SQLite's triggers are row triggers: nothing changes there.
"""

import importlib

from django.db import migrations

_0007 = importlib.import_module("dispatch.migrations.0007_forecast_summary")
_0014 = importlib.import_module("schedules.migrations.0014_count_triggers_probe_versions_by_key")


def _probed(rows: str, sign: int, *, versions_changed: bool) -> str:
    """0007's _pg_select, with the side that is a whole table read by key for each row of `rows`."""
    if versions_changed:
        joined = (f"FROM {rows} v CROSS JOIN LATERAL (SELECT * FROM schedules_schedule s0 "
                  "WHERE s0.current_id = v.id OFFSET 0) s")
    else:
        joined = (f"FROM {rows} s CROSS JOIN LATERAL (SELECT * FROM schedules_scheduleversion v0 "
                  "WHERE v0.id = s.current_id OFFSET 0) v")
    return f"SELECT {_0007._ALIASED}, {sign} AS sign {joined} WHERE {_0007.SCOPE}"


def _functions(select, settings: str = "") -> str:
    delta = _0007._pg_delta
    return f"""
CREATE OR REPLACE FUNCTION forecast_schedules_changed() RETURNS trigger LANGUAGE plpgsql {settings} AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        {delta(select("new_rows", 1, False))}
    ELSIF TG_OP = 'DELETE' THEN
        {delta(select("old_rows", -1, False))}
    ELSE
        {delta(select("old_rows", -1, False) + " UNION ALL " + select("new_rows", 1, False))}
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION forecast_versions_changed() RETURNS trigger LANGUAGE plpgsql {settings} AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        {delta(select("old_rows", -1, True))}
    ELSE
        {delta(select("old_rows", -1, True) + " UNION ALL " + select("new_rows", 1, True))}
    END IF;
    RETURN NULL;
END $$;
"""


# Planned for a table of a page or two, a probe would be a whole read per row until the next ANALYZE.
POSTGRES = _functions(lambda rows, sign, versions_changed: _probed(rows, sign, versions_changed=versions_changed),
                      _0014.NO_SEQSCAN)
POSTGRES_REVERSE = _functions(
    lambda rows, sign, versions_changed: _0007._pg_select("schedules_schedule", rows, sign) if versions_changed
    else _0007._pg_select(rows, "schedules_scheduleversion", sign))


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRES)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRES_REVERSE)


class Migration(migrations.Migration):

    dependencies = [
        ("dispatch", "0007_forecast_summary"),
        ("schedules", "0014_count_triggers_probe_versions_by_key"),
    ]

    operations = [migrations.RunPython(forward, backward)]
