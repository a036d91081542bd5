"""The relay's claim index (see OutboxEvent.Meta). Built CONCURRENTLY on PostgreSQL: every run
transition writes to the outbox, and a plain CREATE INDEX would block those writes (so every
loop) for as long as the build takes on a full retention window of events."""

from django.db import migrations, models

INDEX = models.Index(
    condition=models.Q(("published_at__isnull", True)), fields=["next_attempt_at", "id"], name="outbox_relay_due_idx"
)


def create(apps, schema_editor):
    model = apps.get_model("runs", "OutboxEvent")
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(INDEX.create_sql(model, schema_editor, concurrently=True))
    else:
        schema_editor.add_index(model, INDEX)


def drop(apps, schema_editor):
    model = apps.get_model("runs", "OutboxEvent")
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(INDEX.remove_sql(model, schema_editor, concurrently=True))
    else:
        schema_editor.remove_index(model, INDEX)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run inside a transaction

    dependencies = [
        ("runs", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name="outboxevent", index=INDEX)],
            database_operations=[migrations.RunPython(create, drop)],
        ),
    ]
