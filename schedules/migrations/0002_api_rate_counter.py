import django.db.models.deletion
from django.db import migrations, models


def unlogged(apps, schema_editor):
    # Rate counters are rewritten on every API request and worthless after a minute: skip the WAL.
    # (An unlogged table may reference a logged one; the reverse is what PostgreSQL forbids.)
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE schedules_apiratecounter SET UNLOGGED")


class Migration(migrations.Migration):

    dependencies = [
        ("schedules", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="ApiRateCounter",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("window_start", models.DateTimeField()),
                ("count", models.PositiveIntegerField(default=0)),
                (
                    "key",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="+", to="schedules.apikey"
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("key", "window_start"), name="api_rate_counter_key_window_unique")
                ],
            },
        ),
        migrations.RunPython(unlogged, migrations.RunPython.noop),
    ]
