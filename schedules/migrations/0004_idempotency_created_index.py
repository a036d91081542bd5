"""The reconciler prunes expired Idempotency-Key records by age (see IdempotencyRecord.Meta);
built CONCURRENTLY on PostgreSQL so API writes are never blocked while it builds."""

from django.db import migrations, models

from scheduler_project.migration_ops import AddIndexConcurrently


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run inside a transaction

    dependencies = [
        ("schedules", "0003_version_grace_index"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="idempotencyrecord",
            index=models.Index(fields=["created_at"], name="idempotency_created_idx"),
        ),
    ]
