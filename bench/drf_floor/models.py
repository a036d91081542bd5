from django.db import models


class FloorItem(models.Model):
    """One row of 10 columns, shaped like a schedule's essentials. The table is made by
    bench/api_create.py (drf_floor.table.TABLE_SQL), not by migrations."""

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=200)
    expression = models.CharField(max_length=200)
    time_zone = models.CharField(max_length=64, default="UTC")
    target = models.JSONField()
    payload = models.JSONField(default=dict)
    enabled = models.BooleanField(default=True)
    version = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "bench_drf_floor_item"
        managed = False
