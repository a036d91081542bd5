"""Drop the single-column foreign-key indexes that composite indexes already serve: every index is
written on each of a run's four or five updates.

Not a plain AlterField(db_index=False): on PostgreSQL that drops *every* non-unique-looking index
on the column, including the partial unique index `attempt_one_open_per_run` (invariant 3).
Only Django's auto-named FK indexes (`<table>_<column>_<hash>`) are dropped here."""

import django.db.models.deletion
from django.db import migrations, models

FK_INDEXES = [("runs_attempt", "run_id"), ("runs_occurrence", "schedule_id"), ("runs_run", "schedule_id"),
              ("runs_run", "tenant_id")]


def drop_fk_indexes(apps, schema_editor):
    conn = schema_editor.connection
    with conn.cursor() as cur:
        for table, column in FK_INDEXES:
            constraints = conn.introspection.get_constraints(cur, table)
            for name, info in constraints.items():
                if (info["index"] and not info["unique"] and not info["primary_key"] and info["columns"] == [column]
                        and name.startswith(f"{table}_{column}_")):
                    schema_editor.execute(schema_editor.sql_delete_index % {"table": schema_editor.quote_name(table),
                                                                              "name": schema_editor.quote_name(name)})


def fk(**kw):
    return models.ForeignKey(db_index=False, **kw)


class Migration(migrations.Migration):
    dependencies = [("runs", "0003_fair_claiming")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField("attempt", "run", fk(on_delete=django.db.models.deletion.CASCADE,
                                                           related_name="attempts", to="runs.run")),
                migrations.AlterField("occurrence", "schedule", fk(on_delete=django.db.models.deletion.CASCADE,
                                                                   related_name="occurrences", to="schedules.schedule")),
                migrations.AlterField("run", "schedule", fk(on_delete=django.db.models.deletion.CASCADE,
                                                            related_name="runs", to="schedules.schedule")),
                migrations.AlterField("run", "tenant", fk(on_delete=django.db.models.deletion.PROTECT,
                                                          related_name="+", to="schedules.tenant")),
            ],
            database_operations=[migrations.RunPython(drop_fk_indexes, migrations.RunPython.noop)],
        ),
    ]
