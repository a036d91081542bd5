"""Tenants, what they may call, their keys, and schedules with immutable versions.

A schedule row is the mutable head the scanner works from (`next_run_at`, `enabled`); each edit
writes a new `ScheduleVersion` row that is never changed again, and every occurrence and run
points at the version that made it.
"""

import hashlib
import secrets
import uuid
import zlib
from enum import StrEnum

from django.conf import settings
from django.db import models
from django.db.models import Q

from schedules.timeexpr.types import REPEATED_CHOICES, SKIPPED_CHOICES, DstRepeated, DstSkipped

# Schedules are spread over this many stable buckets; `scan --shards N` takes buckets with
# `bucket % N == I`. A fixed bucket count keeps the hash stable when N changes.
SHARD_BUCKETS = 4096


def shard_bucket(schedule_id: uuid.UUID) -> int:
    return zlib.crc32(schedule_id.bytes) % SHARD_BUCKETS


def new_signing_secret() -> str:
    return "whsec_" + secrets.token_urlsafe(32)


class Tenant(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    # HMAC secret for the X-Scheduler-Signature header on target calls and webhooks.
    signing_secret = models.CharField(max_length=100, default=new_signing_secret)
    notification_url = models.URLField(max_length=2000, blank=True, default="")
    # None = no per-tenant cap on concurrently leased runs.
    max_in_flight = models.PositiveIntegerField(null=True, blank=True)
    # Quotas on schedules that are not archived; None = the deployment's default
    # (SCHEDULER_MAX_SCHEDULES_PER_TENANT, SCHEDULER_MAX_SUBMINUTE_SCHEDULES_PER_TENANT).
    max_schedules = models.PositiveIntegerField(null=True, blank=True)
    max_subminute_schedules = models.PositiveIntegerField(null=True, blank=True)
    # The spread window (seconds) a new schedule gets when its request gives none (schedules.spread).
    default_spread_seconds = models.PositiveIntegerField(default=0)
    # The owner of schedules created without one (and of tenant-wide incidents); None = unowned.
    default_owner = models.ForeignKey("Owner", on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]
        # What operators may do, across tenants (scheduler_project/web/access.py decides with
        # these; the "Operator" and "Read-only operator" groups carry them, migration 0005).
        # Tenant members act on their own tenants through their membership instead.
        permissions = [
            ("view_all_tenants", "Can see every tenant's schedules, runs, keys and settings"),
            ("operate_runs", "Can retry and cancel any tenant's runs"),
            ("operate_schedules", "Can pause, resume, trigger and backfill any tenant's schedules"),
            ("manage_api_keys", "Can create and revoke any tenant's API keys"),
            ("manage_tenants", "Can change tenants' allowlists, webhooks, limits, quotas and members"),
        ]

    def __str__(self):
        return self.slug

    # Set when the allowlist was read with the tenant (the API's key lookup, in the same
    # statement); otherwise it is read on use.
    known_prefixes: list[str] | None = None

    # (schedules not archived, of which sub-minute) read earlier in this request (the API's key
    # lookup, in the same statement, or services.quota_locks); the next quota check takes it and
    # clears it, so a later check reads the counts again (schedules.services._counted).
    known_schedule_counts: tuple[int, int] | None = None

    def allowed_prefixes(self) -> list[str]:
        if self.known_prefixes is not None:
            return list(self.known_prefixes)
        return [t.prefix for t in self.targets.all()]


class TargetPrefix(models.Model):
    """A URL prefix a tenant may call (operator-managed allowlist)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="targets")
    prefix = models.CharField(max_length=2000)
    # Per-target concurrency budget (runs in flight to this prefix's host); None = unlimited.
    max_concurrency = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "prefix"], name="target_prefix_unique_per_tenant")
        ]
        ordering = ["prefix"]

    def __str__(self):
        return self.prefix


class MemberRole(models.TextChoices):
    VIEWER = "viewer"  # sees the tenant's schedules, runs, keys and settings
    ADMIN = "admin"  # also acts on its schedules, runs, keys, members and signing secret


class TenantMembership(models.Model):
    """A portal user who belongs to a tenant sees only that tenant's data; what they may do there
    is their role's (scheduler_project/web/access.py decides)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="members")
    # Admin by default: memberships made before roles existed could act, and keep doing so.
    role = models.CharField(max_length=16, choices=MemberRole.choices, default=MemberRole.ADMIN)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant"], name="membership_unique"),
            models.CheckConstraint(condition=Q(role__in=["viewer", "admin"]), name="membership_role_valid"),
        ]

    def __str__(self):
        return f"{self.user.get_username()} in {self.tenant.slug} ({self.role})"


def hash_api_key(raw: str) -> str:
    # API keys are 256-bit random tokens, so a fast hash is enough (no password stretching needed)
    # and lets every request be authenticated with one indexed lookup.
    return hashlib.sha256(raw.encode()).hexdigest()


class ApiKey(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    label = models.CharField(max_length=200, blank=True, default="")
    prefix = models.CharField(max_length=16)  # shown in lists so a key can be recognised
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.CharField(max_length=200, blank=True, default="")
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return f"{self.prefix}… ({self.label or 'no label'})"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class WebhookFormat(models.TextChoices):
    JSON = "json"  # the signed JSON event, as run events
    SLACK = "slack"  # {"text": ...}: Slack's and Teams' incoming webhooks accept it
    TEAMS = "teams"  # {"text": ...} with a title, for Teams' incoming webhooks


class Owner(models.Model):
    """A team or contact of one tenant that owns schedules and hears about their incidents:
    through its webhook (signed like run events) and its e-mail address (dispatch.notifications)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="owners")
    slug = models.SlugField(max_length=64)
    name = models.CharField(max_length=200)
    email = models.EmailField(max_length=254, blank=True, default="")
    webhook_url = models.URLField(max_length=2000, blank=True, default="")
    webhook_format = models.CharField(max_length=16, choices=WebhookFormat.choices, default=WebhookFormat.JSON)
    # Quiet hours (dispatch.notifications): notifications due from quiet_start to quiet_end, wall
    # times in time_zone, are held and sent when they end. Both null: none.
    time_zone = models.CharField(max_length=64, default="UTC")
    quiet_start = models.TimeField(null=True, blank=True)
    quiet_end = models.TimeField(null=True, blank=True)
    # At most this many messages an hour on each channel; more are held and sent as one summary
    # when the hour allows. Null: no limit.
    max_per_hour = models.PositiveIntegerField(null=True, blank=True, default=30)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "slug"], name="owner_slug_unique_per_tenant"),
            models.CheckConstraint(condition=Q(webhook_format__in=["json", "slack", "teams"]),
                                   name="owner_webhook_format_valid"),
            models.CheckConstraint(condition=Q(quiet_start__isnull=True, quiet_end__isnull=True)
                                   | Q(quiet_start__isnull=False, quiet_end__isnull=False),
                                   name="owner_quiet_hours_both_or_neither"),
            models.CheckConstraint(condition=Q(max_per_hour__isnull=True) | Q(max_per_hour__gte=1),
                                   name="owner_max_per_hour_positive"),
        ]

    def __str__(self):
        return self.slug


class MisfirePolicy(models.TextChoices):
    SKIP = "skip"
    RUN_ONCE = "run_once"
    CATCH_UP = "catch_up"


class OverlapPolicy(models.TextChoices):
    ALLOW = "allow"
    SKIP = "skip"
    BUFFER_ONE = "buffer_one"


class ScheduleStatus(models.TextChoices):
    ACTIVE = "active"  # makes occurrences while enabled
    COMPLETED = "completed"  # past endAt, or a one-time schedule that fired
    ARCHIVED = "archived"  # deleted through the API: no new occurrences, history kept


class Schedule(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of its own: schedule_tenant_list_idx leads with the tenant and serves every lookup by
    # it (one index fewer for the scanner's advance, which rewrites every index entry of the row).
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="schedules", db_index=False)
    name = models.CharField(max_length=200, blank=True, default="")
    # The stable name a schedule set (POST /api/v1/schedules/apply, `manage.py apply_schedules`)
    # knows it by; None: not managed by a set, which then never touches it (runs.schedule_apply).
    managed_name = models.CharField(max_length=200, null=True, blank=True, default=None)
    version = models.PositiveIntegerField(default=1)
    current = models.ForeignKey(
        "ScheduleVersion", on_delete=models.PROTECT, related_name="+", null=True, blank=True
    )
    enabled = models.BooleanField(default=True)
    # Metadata, not a versioned field: a change is audited (schedule.owner), makes no version.
    owner = models.ForeignKey(Owner, on_delete=models.PROTECT, null=True, blank=True, related_name="schedules",
                              db_index=False)
    status = models.CharField(max_length=16, choices=ScheduleStatus.choices, default=ScheduleStatus.ACTIVE)
    # The next instant to materialise; None when nothing more will ever be due.
    next_run_at = models.DateTimeField(null=True, blank=True)
    shard = models.PositiveSmallIntegerField(default=0)
    # Where the rule is computed from: startAt, else creation. A resume keeps it (a rate()
    # schedule keeps its phase); the next occurrence is computed from the moment of resume.
    anchor_at = models.DateTimeField()
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    paused_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    archived_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            # The scanner's due query: only active, enabled schedules with a next instant, by time,
            # so a pass costs what is due, not how many schedules exist.
            models.Index(
                fields=["next_run_at"],
                name="schedule_due_idx",
                condition=Q(enabled=True, status="active", next_run_at__isnull=False),
            ),
            # The schedule lists' keyset order (web.pagination.SCHEDULE_PAGES: -created_at, -id),
            # read as an index range from the cursor: the operator's list across tenants, one
            # tenant's (API and portal), one owner's (owned schedules only). Without the id a
            # page sorted every tie of created_at (a bulk create shares one), and without the
            # first an operator's page sorted every schedule (found by bench/soak.py at ten million).
            models.Index(fields=["-created_at", "-id"], name="schedule_list_idx"),
            models.Index(fields=["tenant", "-created_at", "-id"], name="schedule_tenant_list_idx"),
            models.Index(fields=["owner", "-created_at", "-id"], name="schedule_owner_list_idx",
                         condition=Q(owner__isnull=False)),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=["active", "completed", "archived"]), name="schedule_status_valid"
            ),
            models.CheckConstraint(condition=Q(version__gte=1), name="schedule_version_positive"),
            models.CheckConstraint(
                condition=~Q(status="archived") | Q(archived_at__isnull=False),
                name="schedule_archived_has_time",
            ),
            # One live schedule per managed name in a tenant: two applies racing cannot both create
            # it. Archived ones keep their name for the history, and a set that names it again
            # makes a new one. Also the index apply reads a tenant's managed schedules by.
            models.UniqueConstraint(
                fields=["tenant", "managed_name"],
                condition=Q(managed_name__isnull=False) & ~Q(status="archived"),
                name="schedule_managed_name_unique_per_tenant",
            ),
        ]

    def __str__(self):
        return self.name or str(self.id)

    @property
    def owner_slug(self) -> str | None:
        return self.owner.slug if self.owner_id else None


class ScheduleVersion(models.Model):
    """One immutable row per edit: what the schedule meant from that version on."""

    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    name = models.CharField(max_length=200, blank=True, default="")
    expression = models.CharField(max_length=2000)
    time_zone = models.CharField(max_length=64)
    payload = models.JSONField(default=dict, blank=True)
    target_url = models.CharField(max_length=2000)
    target_method = models.CharField(max_length=8, default="POST")
    target_headers = models.JSONField(default=dict, blank=True)
    target_timeout_seconds = models.PositiveIntegerField(default=30)
    misfire_policy = models.CharField(max_length=16, choices=MisfirePolicy.choices, default=MisfirePolicy.RUN_ONCE)
    catchup_limit = models.PositiveIntegerField(default=10)
    misfire_grace_seconds = models.PositiveIntegerField(default=60)
    overlap_policy = models.CharField(max_length=16, choices=OverlapPolicy.choices, default=OverlapPolicy.ALLOW)
    max_attempts = models.PositiveIntegerField(default=5)
    backoff_base_seconds = models.FloatField(default=1.0)
    backoff_max_seconds = models.FloatField(default=300.0)
    dst_skipped = models.CharField(max_length=16, default=DstSkipped.NEXT_VALID.value)
    dst_repeated = models.CharField(max_length=16, default=DstRepeated.EARLIER.value)
    start_at = models.DateTimeField(null=True, blank=True)
    end_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.CharField(max_length=200, blank=True, default="")
    # Which fields changed from the previous version, {field: [before, after]}.
    changes = models.JSONField(default=dict, blank=True)
    # The rule fires twice less than a minute apart: counts against the sub-minute quota.
    sub_minute = models.BooleanField(default=False)
    # Spread (schedules.spread): a scheduled occurrence becomes eligible spread_offset_seconds after
    # its nominal instant, an offset in [0, spread_seconds) derived from the schedule's id. Kept on
    # the version, so a change of window is an edit like any other and every run says what it had.
    spread_seconds = models.PositiveIntegerField(default=0)
    spread_offset_seconds = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["schedule", "-version"]
        indexes = [
            # The reconciler's misfire pass (runs.queue.skip_unclaimed_misfires): the smallest
            # grace of any version, read in one probe, says whether any unclaimed run can have
            # been missed yet, so a backlog still within its grace costs nothing to check.
            models.Index(fields=["misfire_grace_seconds"], name="version_grace_idx"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["schedule", "version"], name="schedule_version_unique"),
            models.CheckConstraint(condition=Q(max_attempts__gte=1), name="schedule_version_max_attempts_positive"),
            models.CheckConstraint(
                condition=Q(misfire_policy__in=MisfirePolicy.values), name="schedule_version_misfire_valid"
            ),
            models.CheckConstraint(
                condition=Q(overlap_policy__in=OverlapPolicy.values), name="schedule_version_overlap_valid"
            ),
            models.CheckConstraint(
                condition=Q(dst_skipped__in=list(SKIPPED_CHOICES))
                & Q(dst_repeated__in=list(REPEATED_CHOICES)),
                name="schedule_version_dst_valid",
            ),
            models.CheckConstraint(
                condition=Q(end_at__isnull=True) | Q(start_at__isnull=True) | Q(end_at__gt=models.F("start_at")),
                name="schedule_version_bounds_ordered",
            ),
            models.CheckConstraint(
                condition=Q(spread_seconds=0, spread_offset_seconds=0)
                | Q(spread_offset_seconds__lt=models.F("spread_seconds")),
                name="schedule_version_spread_offset_within",
            ),
        ]

    def __str__(self):
        return f"{self.schedule_id} v{self.version}"


class AuditAction(StrEnum):
    """What an audit entry records (AuditEntry.action). A tenant's field changes are recorded as
    `tenant.set_<field>` (tenant_set)."""

    APIKEY_CREATE = "apikey.create"
    APIKEY_REVOKE = "apikey.revoke"
    HISTORY_REMOVE = "history.remove"
    INCIDENT_ACKNOWLEDGE = "incident.acknowledge"
    INCIDENT_OPEN = "incident.open"
    INCIDENT_RESOLVE = "incident.resolve"
    INCIDENT_RULE_SET = "incident_rule.set"
    OWNER_CREATE = "owner.create"
    OWNER_EDIT = "owner.edit"
    OWNER_TEST_NOTIFICATION = "owner.test_notification"
    RUN_CANCEL = "run.cancel"
    RUN_RETRY = "run.retry"
    SCHEDULE_APPLY = "schedule.apply"
    SCHEDULE_ARCHIVE = "schedule.archive"
    SCHEDULE_BACKFILL = "schedule.backfill"
    SCHEDULE_BULK_SPREAD = "schedule.bulk_spread"
    SCHEDULE_CREATE = "schedule.create"
    SCHEDULE_EDIT = "schedule.edit"
    SCHEDULE_OWNER = "schedule.owner"
    SCHEDULE_PAUSE = "schedule.pause"
    SCHEDULE_RESUME = "schedule.resume"
    SCHEDULE_TRIGGER = "schedule.trigger"
    TENANT_ADD_MEMBER = "tenant.add_member"
    TENANT_ALLOW_TARGET = "tenant.allow_target"
    TENANT_CREATE = "tenant.create"
    TENANT_DEFAULT_OWNER = "tenant.default_owner"
    TENANT_REMOVE_MEMBER = "tenant.remove_member"
    TENANT_REMOVE_TARGET = "tenant.remove_target"
    TENANT_RETENTION = "tenant.retention"
    TENANT_ROTATE_SECRET = "tenant.rotate_secret"
    TENANT_SET_MEMBER_ROLE = "tenant.set_member_role"


def tenant_set(field_name: str) -> str:
    """The action recording a change of one tenant field (schedules.tenants.update_tenant)."""
    return f"tenant.set_{field_name}"


class AuditEntry(models.Model):
    """Who did what, when, from where, to which object: every API and portal change."""

    id = models.BigAutoField(primary_key=True)
    at = models.DateTimeField(auto_now_add=True, db_index=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    actor = models.CharField(max_length=200)  # "key:<prefix>", "user:<username>", "system:<command>"
    action = models.CharField(max_length=64)  # e.g. schedule.create, schedule.pause, run.retry
    object_type = models.CharField(max_length=32)
    object_id = models.CharField(max_length=64, db_index=True)
    remote_addr = models.CharField(max_length=64, blank=True, default="")
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name_plural = "audit entries"
        indexes = [models.Index(fields=["tenant", "-at"], name="audit_tenant_at_idx")]

    def __str__(self):
        return f"{self.action} of {self.object_type} {self.object_id} by {self.actor}"


class TenantScheduleCount(models.Model):
    """How many of a tenant's schedules are not archived, and how many of those have a sub-minute
    rule: what its quotas count (schedules.services), read in one small query however many
    schedules the tenant has. Counting the schedules themselves cost a create time in proportion
    to the tenant's size.

    Written only by the database: triggers on schedules_schedule (migration 0007) add what each
    statement inserts, archives or changes the rule of, in the same transaction, so no code path
    can miss one. A tenant's count is the sum of its rows: on PostgreSQL each connection adds to
    one of several slots, so concurrent creates of one tenant do not queue on one row."""

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    slot = models.PositiveSmallIntegerField()
    # Either may be negative in one slot (a schedule archived through another connection's slot).
    live = models.BigIntegerField(default=0)
    sub_minute = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "slot"], name="tenant_schedule_count_slot_unique"),
        ]
