"""Spread (schedules.spread): the window and this schedule's offset on each version, and a
tenant's default window for new schedules.

On SQLite, adding these columns rebuilds schedules_scheduleversion (a copy under a new name, then
a rename), which the schedule-count triggers of 0007 read: SQLite refuses the rename while a
trigger names the table, so the triggers are dropped for the rebuild and made again after it
(the counts they keep do not change: no schedule is written meanwhile). PostgreSQL adds the
columns with their defaults without rewriting the table."""

import importlib

from django.db import migrations, models

_COUNTS = importlib.import_module("schedules.migrations.0007_tenant_schedule_count")
_TRIGGERS = _COUNTS.SQLITE[:3]  # the CREATE TRIGGER statements, without 0007's first count


def _drop_sqlite_count_triggers(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        # IF EXISTS: a later migration's rebuild of schedules_schedule, run backwards, may have
        # dropped them already.
        for statement in _COUNTS.SQLITE_REVERSE:
            schema_editor.execute(statement.replace("DROP TRIGGER ", "DROP TRIGGER IF EXISTS ", 1))


def _make_sqlite_count_triggers(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        for statement in _TRIGGERS:
            schema_editor.execute(statement)


class Migration(migrations.Migration):

    dependencies = [
        ('schedules', '0008_schedule_managed_name'),
    ]

    operations = [
        migrations.RunPython(_drop_sqlite_count_triggers, _make_sqlite_count_triggers),
        migrations.AddField(
            model_name='scheduleversion',
            name='spread_offset_seconds',
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name='scheduleversion',
            name='spread_seconds',
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name='tenant',
            name='default_spread_seconds',
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddConstraint(
            model_name='scheduleversion',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('spread_offset_seconds', 0), ('spread_seconds', 0)), ('spread_offset_seconds__lt', models.F('spread_seconds')), _connector='OR'), name='schedule_version_spread_offset_within'),
        ),
        migrations.RunPython(_make_sqlite_count_triggers, _drop_sqlite_count_triggers),
    ]
