"""Two indexes for the reconciler, built CONCURRENTLY on PostgreSQL so that creating and editing
schedules and API writes are never blocked while they build:

- version_grace_idx: the misfire pass reads the smallest grace of any version in one probe (see
  ScheduleVersion.Meta);
- idempotency_created_idx: expired Idempotency-Key records are pruned by age (see
  IdempotencyRecord.Meta)."""

from django.db import migrations, models

from scheduler_project.foundation.migration_ops import AddIndexConcurrently


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
        AddIndexConcurrently(
            model_name="idempotencyrecord",
            index=models.Index(fields=["created_at"], name="idempotency_created_idx"),
        ),
    ]
