"""Per-target budgets need each run's target host; tenant-fair claiming needs ready runs by
(tenant, eligibility). The column has a constant default (instant on PostgreSQL 11+); the index
is built concurrently."""

from django.db import migrations, models

from scheduler_project.foundation.migration_ops import AddIndexConcurrently


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("runs", "0002_relay_due_index")]

    operations = [
        migrations.AddField(
            model_name="run", name="target_host", field=models.CharField(blank=True, default="", max_length=300)
        ),
        AddIndexConcurrently(
            model_name="run",
            index=models.Index(
                condition=models.Q(("state", "ready")), fields=["tenant", "next_eligible_at"], name="run_ready_tenant_idx"
            ),
        ),
    ]
