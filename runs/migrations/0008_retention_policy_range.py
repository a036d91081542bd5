"""A tenant's own retention is between 1 day and runs.models.MAX_RETENTION_DAYS: a period beyond what a
datetime can hold made every retention pass, /metrics and the dashboard fail for every tenant.
Periods already stored outside the range are brought to its nearest end first (a period beyond
it could not have been applied)."""

from django.db import migrations, models

MAX_RETENTION_DAYS = 36_500  # runs.models.MAX_RETENTION_DAYS when this was written


def clamp(apps, schema_editor):
    RetentionPolicy = apps.get_model("runs", "RetentionPolicy")
    for field in ("finished_days", "dead_days"):
        RetentionPolicy.objects.filter(**{f"{field}__gt": MAX_RETENTION_DAYS}).update(**{field: MAX_RETENTION_DAYS})
        RetentionPolicy.objects.filter(**{f"{field}__lt": 1}).update(**{field: 1})


class Migration(migrations.Migration):

    dependencies = [
        ("runs", "0007_history_partitioning"),
    ]

    operations = [
        migrations.RunPython(clamp, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="retentionpolicy",
            constraint=models.CheckConstraint(
                condition=models.Q(("finished_days__isnull", True),
                                   models.Q(("finished_days__gte", 1), ("finished_days__lte", 36500)), _connector="OR"),
                name="retention_finished_days_range"),
        ),
        migrations.AddConstraint(
            model_name="retentionpolicy",
            constraint=models.CheckConstraint(
                condition=models.Q(("dead_days__isnull", True),
                                   models.Q(("dead_days__gte", 1), ("dead_days__lte", 36500)), _connector="OR"),
                name="retention_dead_days_range"),
        ),
    ]
