"""The web takes over its three tables from the schedules app: Idempotency-Key records, the API's
rate counters and the sign-in throttle. State only: the tables keep their names (schedules_*) and
are neither created nor altered here; schedules migration 0011 drops them from that app's state.
Their content types move with them, so any permission given on them stays given."""

import django.db.models.deletion
from django.db import migrations, models

MODELS = ("idempotencyrecord", "apiratecounter", "loginthrottle")


def _move_content_types(apps, source: str, target: str) -> None:
    content_type = apps.get_model("contenttypes", "ContentType")
    for model in MODELS:
        if not content_type.objects.filter(app_label=target, model=model).exists():
            content_type.objects.filter(app_label=source, model=model).update(app_label=target)


def forwards(apps, schema_editor):
    _move_content_types(apps, "schedules", "web")


def backwards(apps, schema_editor):
    _move_content_types(apps, "web", "schedules")


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("schedules", "0010_owners"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[
                migrations.CreateModel(
                    name="LoginThrottle",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        ("key", models.CharField(max_length=64, unique=True)),
                        ("failures", models.PositiveIntegerField(default=0)),
                        ("window_start", models.DateTimeField()),
                        ("locked_until", models.DateTimeField(blank=True, null=True)),
                        ("expires_at", models.DateTimeField()),
                    ],
                    options={
                        "db_table": "schedules_loginthrottle",
                        "indexes": [models.Index(fields=["expires_at"], name="login_throttle_expires_idx")],
                    },
                ),
                migrations.CreateModel(
                    name="ApiRateCounter",
                    fields=[
                        ("id", models.BigAutoField(primary_key=True, serialize=False)),
                        ("window_start", models.DateTimeField()),
                        ("count", models.PositiveIntegerField(default=0)),
                        ("key", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="+",
                                                  to="schedules.apikey")),
                    ],
                    options={
                        "db_table": "schedules_apiratecounter",
                        "constraints": [models.UniqueConstraint(fields=("key", "window_start"),
                                                                name="api_rate_counter_key_window_unique")],
                    },
                ),
                migrations.CreateModel(
                    name="IdempotencyRecord",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        ("scope", models.CharField(max_length=200)),
                        ("key", models.CharField(max_length=200)),
                        ("request_hash", models.CharField(max_length=64)),
                        ("status_code", models.PositiveSmallIntegerField()),
                        ("response", models.JSONField()),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        ("tenant", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="+",
                                                     to="schedules.tenant")),
                    ],
                    options={
                        "db_table": "schedules_idempotencyrecord",
                        "indexes": [models.Index(fields=["created_at"], name="idempotency_created_idx")],
                        "constraints": [models.UniqueConstraint(fields=("tenant", "scope", "key"),
                                                                name="idempotency_unique_key")],
                    },
                ),
            ],
        ),
        migrations.RunPython(forwards, backwards),
    ]
