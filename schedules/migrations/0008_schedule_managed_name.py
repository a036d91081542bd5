"""A schedule's stable name in a schedule set (runs.schedule_apply), unique among a tenant's live
schedules. The partial unique index is empty when it is made (no schedule is managed yet), so it
is built in one pass over the table."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('schedules', '0007_tenant_schedule_count'),
    ]

    operations = [
        migrations.AddField(
            model_name='schedule',
            name='managed_name',
            field=models.CharField(blank=True, default=None, max_length=200, null=True),
        ),
        migrations.AddConstraint(
            model_name='schedule',
            constraint=models.UniqueConstraint(condition=models.Q(('managed_name__isnull', False), models.Q(('status', 'archived'), _negated=True)), fields=('tenant', 'managed_name'), name='schedule_managed_name_unique_per_tenant'),
        ),
    ]
