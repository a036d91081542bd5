"""The relay's claim index (see OutboxEvent.Meta). Built CONCURRENTLY on PostgreSQL: every run
transition writes to the outbox, and a plain CREATE INDEX would block those writes (so every
loop) for as long as the build takes on a full retention window of events."""

from django.db import migrations, models

from scheduler_project.foundation.migration_ops import AddIndexConcurrently


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run inside a transaction

    dependencies = [
        ("runs", "0001_initial"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="outboxevent",
            index=models.Index(
                condition=models.Q(("published_at__isnull", True)), fields=["next_attempt_at", "id"],
                name="outbox_relay_due_idx",
            ),
        ),
    ]
