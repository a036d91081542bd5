"""The schedule lists' keyset order (-created_at, -id) backed whole by an index for each scope: the
operator's list across tenants had none (every schedule sorted per page), and the tenant's and the
owner's lacked the id (every tie of created_at sorted). Built and dropped concurrently, so a busy
database stays writable meanwhile."""

from django.db import migrations, models

from scheduler_project.foundation.migration_ops import AddIndexConcurrently, RemoveIndexConcurrently


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
    ]
