"""The reconciler's misfire check (see ScheduleVersion.Meta). Built CONCURRENTLY on PostgreSQL so
that creating and editing schedules is never blocked while it builds."""

from django.db import migrations, models

from scheduler_project.migration_ops import AddIndexConcurrently


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run inside a transaction

    dependencies = [
        ("schedules", "0002_api_rate_counter"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="scheduleversion",
            index=models.Index(fields=["misfire_grace_seconds"], name="version_grace_idx"),
        ),
    ]
