"""Idempotency-Key records, the API's rate counters and the sign-in throttle belong to the HTTP
surface (scheduler_project.web, its migration 0001): they leave this app's state. State only: the
tables stay, with their names and rows."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("schedules", "0010_owners"),
        ("web", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[
                migrations.RemoveField(model_name="apiratecounter", name="key"),
                migrations.RemoveField(model_name="idempotencyrecord", name="tenant"),
                migrations.DeleteModel(name="LoginThrottle"),
                migrations.DeleteModel(name="ApiRateCounter"),
                migrations.DeleteModel(name="IdempotencyRecord"),
            ],
        ),
    ]
