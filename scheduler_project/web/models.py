"""The HTTP surface's own tables: Idempotency-Key records, the API's rate counters and the
sign-in throttle. They were made by the schedules app's migrations and keep those table names
(web migration 0001 moved them here without touching the database)."""

from django.db import models

from schedules.models import ApiKey, Tenant


class IdempotencyRecord(models.Model):
    """The first response to a request made with an Idempotency-Key, replayed on a retry."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    scope = models.CharField(max_length=200)  # e.g. "schedules.create", "schedules.trigger:<id>"
    key = models.CharField(max_length=200)
    request_hash = models.CharField(max_length=64)
    status_code = models.PositiveSmallIntegerField()
    response = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "schedules_idempotencyrecord"
        constraints = [
            models.UniqueConstraint(fields=["tenant", "scope", "key"], name="idempotency_unique_key"),
        ]
        indexes = [
            # The reconciler's pruning of expired keys (scheduler_project.web.api.idempotency.prune_expired).
            models.Index(fields=["created_at"], name="idempotency_created_idx"),
        ]


class ApiRateCounter(models.Model):
    """Requests made with one API key in one minute (fixed window), shared by every web worker.

    One row per key per minute, upserted by the web's store (scheduler_project.web.store); a key's
    older rows are deleted when its next window opens, so the table holds about one row per active
    key. The table is UNLOGGED on PostgreSQL (schedules migration 0002): losing counts in a crash
    only forgives a minute."""

    id = models.BigAutoField(primary_key=True)
    key = models.ForeignKey(ApiKey, on_delete=models.CASCADE, related_name="+")
    window_start = models.DateTimeField()
    count = models.PositiveIntegerField(default=0)

    class Meta:
        db_table = "schedules_apiratecounter"
        constraints = [
            models.UniqueConstraint(fields=["key", "window_start"], name="api_rate_counter_key_window_unique"),
        ]


class LoginThrottle(models.Model):
    """Failed sign-ins to the portal and the admin, counted in a fixed window per (username,
    address) and per address, shared by every web process (scheduler_project.web.loginthrottle).
    `key` is a SHA-256 of what is counted, so no username (often a mistyped password) is stored;
    rows are deleted once `expires_at` has passed."""

    key = models.CharField(max_length=64, unique=True)
    failures = models.PositiveIntegerField(default=0)
    window_start = models.DateTimeField()
    locked_until = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField()

    class Meta:
        db_table = "schedules_loginthrottle"
        indexes = [
            # The pruning of expired rows on each counted failure.
            models.Index(fields=["expires_at"], name="login_throttle_expires_idx"),
        ]
