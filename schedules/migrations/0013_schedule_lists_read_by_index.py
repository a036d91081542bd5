"""The schedule lists' keyset order (-created_at, -id) backed whole by an index for each scope: the
operator's list across tenants had none (every schedule sorted per page), and the tenant's and the
owner's lacked the id (every tie of created_at sorted). The tenant foreign key's own index goes: the
tenant's list index leads with the tenant, and every index is one more entry written at each
advance of the scanner. Built and dropped concurrently, so a busy database stays writable meanwhile."""

import django.db.models.deletion
from django.db import migrations, models

from scheduler_project.foundation.migration_ops import AddIndexConcurrently, RemoveIndexConcurrently

# The name Django gave the foreign key's index (schedules 0001).
TENANT_FK_INDEX = "schedules_schedule_tenant_id_43ce440f"


def drop_tenant_fk_index(apps, schema_editor):
    concurrently = " CONCURRENTLY" if schema_editor.connection.vendor == "postgresql" else ""
    schema_editor.execute(f'DROP INDEX{concurrently} IF EXISTS "{TENANT_FK_INDEX}"')


def make_tenant_fk_index(apps, schema_editor):
    concurrently = " CONCURRENTLY" if schema_editor.connection.vendor == "postgresql" else ""
    schema_editor.execute(f'CREATE INDEX{concurrently} IF NOT EXISTS "{TENANT_FK_INDEX}" '
                          'ON "schedules_schedule" ("tenant_id")')


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("schedules", "0012_owner_quiet_hours"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="schedule",
            index=models.Index(fields=["-created_at", "-id"], name="schedule_list_idx"),
        ),
        AddIndexConcurrently(
            model_name="schedule",
            index=models.Index(fields=["tenant", "-created_at", "-id"], name="schedule_tenant_list_idx"),
        ),
        AddIndexConcurrently(
            model_name="schedule",
            index=models.Index(fields=["owner", "-created_at", "-id"], name="schedule_owner_list_idx",
                               condition=models.Q(owner__isnull=False)),
        ),
        RemoveIndexConcurrently(model_name="schedule", name="schedule_tenant_created_idx"),
        RemoveIndexConcurrently(model_name="schedule", name="schedule_owner_created_idx"),
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AlterField(
                model_name="schedule", name="tenant",
                field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT,
                                        related_name="schedules", to="schedules.tenant"),
            )],
            database_operations=[migrations.RunPython(drop_tenant_fk_index, make_tenant_fk_index)],
        ),
    ]
