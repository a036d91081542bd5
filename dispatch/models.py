"""What the dispatch loops record about themselves: shard ownership, worker counters, and the
pre-aggregated activity (per-minute outcomes and start lags, per-schedule summaries) the portal's
charts read instead of the attempts table.

All live in the database so that any number of copies on any number of machines coordinate
without talking to each other, and so that every web process reports the same figures."""

import uuid
from importlib import metadata
from pathlib import Path

from django.db import models
from django.db.models import Q

from schedules.models import WebhookFormat


class ShardLease(models.Model):
    """Ownership of one scanner shard (of `shards`), leased like a run. A copy started with
    `--shard I` prefers shard I and takes it back from a copy that borrowed it; a shard whose
    holder died is borrowed by another copy once its lease has expired. Ownership is for
    efficiency only: two scanners on one shard are safe (SKIP LOCKED and the occurrence
    unique constraint), just wasteful."""

    shards = models.PositiveSmallIntegerField()
    shard = models.PositiveSmallIntegerField()
    holder = models.CharField(max_length=200, blank=True, default="")
    borrowed = models.BooleanField(default=False)
    lease_until = models.DateTimeField()
    last_pass_at = models.DateTimeField(null=True, blank=True)
    # How far behind the shard was after its last pass: now - the oldest due next_run_at left.
    behind_seconds = models.FloatField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["shards", "shard"], name="shard_lease_unique"),
            models.CheckConstraint(condition=Q(shard__lt=models.F("shards")), name="shard_lease_in_range"),
        ]


def software_version() -> str:
    """The code a process runs: the package version and, in a git checkout, the commit. A
    WorkerStat row takes it as its default when the worker first writes it, so each worker row
    records the version of the process that made it (the workers page shows it)."""
    global _VERSION
    if _VERSION is None:
        _VERSION = _read_version()
    return _VERSION


_VERSION: str | None = None


def _read_version() -> str:
    try:
        version = metadata.version("durable-scheduler")
    except metadata.PackageNotFoundError:
        version = "unknown"
    git = Path(__file__).resolve().parents[1] / ".git"
    try:
        head = (git / "HEAD").read_text().strip()
        if head.startswith("ref: "):
            ref = head[5:]
            path = git / ref
            if path.exists():
                head = path.read_text().strip()
            else:
                packed = (git / "packed-refs").read_text().splitlines()
                head = next((line.split()[0] for line in packed if line.endswith(" " + ref)), "")
        if head:
            version += f"+g{head[:9]}"
    except OSError:
        pass
    return version[:64]


class WorkerStat(models.Model):
    """Counters a worker process flushes every few seconds (claims, empty claims, batch sizes),
    summed by /metrics."""

    worker_id = models.CharField(max_length=200, primary_key=True)
    started_at = models.DateTimeField()
    seen_at = models.DateTimeField()
    claims = models.BigIntegerField(default=0)
    empty_claims = models.BigIntegerField(default=0)
    claimed_runs = models.BigIntegerField(default=0)
    # Claim batch sizes as cumulative histogram buckets {"1": n, "10": n, ..., "+Inf": n}.
    batch_buckets = models.JSONField(default=dict)
    abandoned = models.BigIntegerField(default=0)
    fenced_results = models.BigIntegerField(default=0)
    # Filled by the default when the worker first writes its row, in the worker's own process.
    version = models.CharField(max_length=64, blank=True, default=software_version)


# --- pre-aggregated activity (dispatch.activity fills these; the portal reads them) -----------

# The tenant id of the rows that count every tenant together, so an operator's charts read one
# row per minute however many tenants there are. Not a tenant: no tenant has the nil UUID.
ALL_TENANTS = uuid.UUID(int=0)

# Upper bounds (seconds) of the start-lag histogram buckets, roughly x2 apart; the last bucket
# takes everything above. A percentile read from them is "at most" the bucket's bound.
LAG_BOUNDS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600)


class ActivityMinute(models.Model):
    """Attempts that ended in one minute (by outcome), and the start lags of first attempts that
    began in it, for one tenant or for all of them (`tenant_id` = ALL_TENANTS). Rows only grow
    by increments, so a late-finishing attempt adds to an older minute."""

    id = models.BigAutoField(primary_key=True)
    tenant_id = models.UUIDField()
    minute = models.DateTimeField()
    succeeded = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    unknown = models.PositiveIntegerField(default=0)
    # Of the unknown ones, those the reconciler ended because their lease expired.
    lease_expired = models.PositiveIntegerField(default=0)
    # Counts per LAG_BOUNDS bucket (len(LAG_BOUNDS) + 1 entries); empty until a lag is counted.
    lag_counts = models.JSONField(default=list, blank=True)
    # Latency (ms) of attempts that got an answer, summed, with their count, for a mean per minute.
    latency_ms_sum = models.BigIntegerField(default=0)
    latency_count = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            # The charts read one tenant's (or all tenants') minutes in a time range: this index.
            models.UniqueConstraint(fields=["tenant_id", "minute"], name="activity_minute_unique"),
        ]
        indexes = [
            # The activity loop's retention pass deletes the oldest minutes.
            models.Index(fields=["minute"], name="activity_minute_time_idx"),
        ]


class TargetMinute(models.Model):
    """Attempts that ended in one minute against one target URL (the one of the version each run
    was made by), with how many of them failed, for one tenant or for all (ALL_TENANTS): the
    dashboard's "targets failing most" sums the last hour of these rather than joining the
    attempts to their runs and versions. One row per target and minute that had an attempt;
    kept a little longer than that hour (dispatch.activity.TARGET_RETENTION)."""

    id = models.BigAutoField(primary_key=True)
    tenant_id = models.UUIDField()
    minute = models.DateTimeField()
    # A digest of the URL: a URL can be longer than a b-tree entry may be.
    url_key = models.CharField(max_length=40)
    target_url = models.CharField(max_length=2000)
    attempts = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)  # failed and unknown outcomes
    last_failed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # The dashboard reads one tenant's (or all tenants') minutes of the last hour by its
            # prefix; the activity loop finds the rows it adds to by the whole key.
            models.UniqueConstraint(fields=["tenant_id", "minute", "url_key"], name="target_minute_unique"),
        ]
        indexes = [
            # The activity loop's retention pass deletes the oldest minutes.
            models.Index(fields=["minute"], name="target_minute_time_idx"),
        ]


class ScheduleActivity(models.Model):
    """One row per schedule that has had a finished attempt since aggregation began: its last
    result, last success, totals, and its newest attempts' outcomes and latencies (the sparkline,
    success rate and p95 on the schedule pages), so those pages never read the attempts table."""

    RECENT = 50

    schedule_id = models.UUIDField(primary_key=True)
    tenant_id = models.UUIDField()
    succeeded = models.BigIntegerField(default=0)
    failed = models.BigIntegerField(default=0)  # failed and unknown outcomes
    last_finished_at = models.DateTimeField(null=True, blank=True)
    last_outcome = models.CharField(max_length=16, blank=True, default="")
    last_http_status = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True, default="")
    last_run_id = models.UUIDField(null=True, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    # The newest RECENT attempts, oldest first: [finished at (epoch s), outcome, latency ms or None].
    recent = models.JSONField(default=list, blank=True)


class ActivityCursor(models.Model):
    """Where the activity loop has got to: every attempt with an id up to `watermark` has been
    counted, or is in ActivityPending waiting for its outcome. One row; its lock makes passes of
    several loops (several `reconcile` or `scheduler` processes) take turns."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    watermark = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(null=True, blank=True)
    pruned_at = models.DateTimeField(null=True, blank=True)


class ActivityPending(models.Model):
    """An attempt passed by the watermark while still open (a call in flight): counted when it
    ends. As many rows as calls were in flight at one pass, at most."""

    attempt_id = models.BigIntegerField(primary_key=True)


# --- incidents and their notifications (dispatch.incidents, dispatch.notifications) ----------


class IncidentRule(models.TextChoices):
    """What opens an incident (docs/incidents.md says exactly when each fires and clears)."""

    DEAD = "dead"  # a run of the schedule went to the dead-letter queue
    CONSECUTIVE_FAILURES = "consecutive_failures"  # N failed attempts in a row, no success between
    MISSED_START = "missed_start"  # a run not started within its grace after its eligible time
    START_LAG = "start_lag"  # a run started more than `threshold` seconds after its scheduled time
    DLQ_GROWTH = "dlq_growth"  # the tenant's runs went dead more than `threshold` times in an hour


RULES = [r.value for r in IncidentRule]
TENANT_RULES = (IncidentRule.DLQ_GROWTH,)


class IncidentState(models.TextChoices):
    OPEN = "open"
    ACKNOWLEDGED = "acknowledged"  # still open: a person is on it; it still resolves by itself
    RESOLVED = "resolved"


class IncidentPolicy(models.Model):
    """A rule's setting for a tenant (schedule null) or one of its schedules (overrides the
    tenant's). Without a row the deployment's default applies (dispatch.incidents.DEFAULTS)."""

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey("schedules.Tenant", on_delete=models.CASCADE, related_name="+")
    schedule = models.ForeignKey("schedules.Schedule", on_delete=models.CASCADE, null=True, blank=True,
                                 related_name="+")
    rule = models.CharField(max_length=32, choices=IncidentRule.choices)
    enabled = models.BooleanField(default=True)
    # N for consecutive_failures, seconds for start_lag, K for dlq_growth; unused otherwise.
    threshold = models.FloatField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "rule"], condition=Q(schedule__isnull=True),
                                    name="incident_policy_tenant_unique"),
            models.UniqueConstraint(fields=["schedule", "rule"], condition=Q(schedule__isnull=False),
                                    name="incident_policy_schedule_unique"),
            models.CheckConstraint(condition=Q(rule__in=RULES), name="incident_policy_rule_valid"),
        ]


class Incident(models.Model):
    """One firing of a rule for a schedule (or, for tenant-wide rules, a tenant), open while the
    condition holds: later occurrences add to `occurrences` and `last_seen_at` without paging."""

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey("schedules.Tenant", on_delete=models.CASCADE, related_name="+")
    schedule = models.ForeignKey("schedules.Schedule", on_delete=models.CASCADE, null=True, blank=True,
                                 related_name="+")
    owner = models.ForeignKey("schedules.Owner", on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    rule = models.CharField(max_length=32, choices=IncidentRule.choices)
    state = models.CharField(max_length=16, choices=IncidentState.choices, default=IncidentState.OPEN)
    summary = models.CharField(max_length=500)
    occurrences = models.PositiveIntegerField(default=1)
    opened_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    last_run_id = models.UUIDField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True, default="")
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.CharField(max_length=200, blank=True, default="")
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.CharField(max_length=200, blank=True, default="")  # "system:incidents" when it cleared

    class Meta:
        ordering = ["-opened_at", "-id"]
        constraints = [
            # One open incident per (schedule, rule) and per (tenant, rule) for tenant-wide rules:
            # two evaluators (or an evaluator and a person) can never open a second one.
            models.UniqueConstraint(fields=["schedule", "rule"], name="incident_one_open_per_schedule",
                                    condition=Q(schedule__isnull=False) & ~Q(state="resolved")),
            models.UniqueConstraint(fields=["tenant", "rule"], name="incident_one_open_per_tenant",
                                    condition=Q(schedule__isnull=True) & ~Q(state="resolved")),
            models.CheckConstraint(condition=Q(rule__in=RULES), name="incident_rule_valid"),
            models.CheckConstraint(condition=Q(state__in=["open", "acknowledged", "resolved"]),
                                   name="incident_state_valid"),
            models.CheckConstraint(condition=~Q(state="resolved") | Q(resolved_at__isnull=False),
                                   name="incident_resolved_has_time"),
        ]
        indexes = [
            # The incidents pages and API: a tenant's newest first; an owner's; a schedule's.
            models.Index(fields=["tenant", "-opened_at"], name="incident_tenant_opened_idx"),
            models.Index(fields=["owner", "-opened_at"], name="incident_owner_opened_idx",
                         condition=Q(owner__isnull=False)),
            models.Index(fields=["schedule", "-opened_at"], name="incident_schedule_opened_idx",
                         condition=Q(schedule__isnull=False)),
        ]

    def __str__(self):
        what = f"schedule {self.schedule_id}" if self.schedule_id else "the tenant"
        return f"{self.rule} of {what} ({self.state})"


class FailureStreak(models.Model):
    """Failed attempts in a row of one schedule since its last success (the consecutive_failures
    rule); the row is deleted on a success, so the table holds only schedules now failing."""

    schedule_id = models.UUIDField(primary_key=True)
    failures = models.PositiveIntegerField(default=0)


class DeadMinute(models.Model):
    """Runs of one tenant that went dead in one minute (the dlq_growth rule sums the last hour)."""

    id = models.BigAutoField(primary_key=True)
    tenant_id = models.UUIDField()
    minute = models.DateTimeField()
    dead = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant_id", "minute"], name="dead_minute_unique")]
        indexes = [
            # The incidents loop's pruning of minutes older than the hour.
            models.Index(fields=["minute"], name="dead_minute_time_idx"),
        ]


class IncidentCursor(models.Model):
    """How far the incidents loop has read the outbox (every event with an id up to `watermark`
    has been evaluated). One row; its lock makes several loops take turns."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    watermark = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(null=True, blank=True)
    probed_at = models.DateTimeField(null=True, blank=True)


class NotificationChannel(models.TextChoices):
    WEBHOOK = "webhook"
    EMAIL = "email"


class NotificationKind(models.TextChoices):
    """What a notification says (its `kind`, sent as X-Scheduler-Event-Kind and in the body)."""

    INCIDENT_OPENED = "incident.opened"
    INCIDENT_RESOLVED = "incident.resolved"
    INCIDENT_TEST = "incident.test"  # asked for by a person: never held by quiet hours or the limit
    SUMMARY = "notification.summary"  # stands for the notifications the owner's hourly limit held


class HoldReason(models.TextChoices):
    QUIET = "quiet"  # the owner's quiet hours
    RATE = "rate"  # the owner's hourly limit on the channel


class Notification(models.Model):
    """An incident's message to one channel of its owner: an outbox row written in the
    transaction that opened or resolved the incident, delivered at least once (the same event id
    on every try: consumers dedupe by it) by dispatch.notifications."""

    id = models.BigAutoField(primary_key=True)
    event_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    tenant = models.ForeignKey("schedules.Tenant", on_delete=models.CASCADE, related_name="+")
    owner = models.ForeignKey("schedules.Owner", on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    incident = models.ForeignKey(Incident, on_delete=models.CASCADE, null=True, blank=True,
                                 related_name="notifications")
    kind = models.CharField(max_length=40)  # a NotificationKind
    channel = models.CharField(max_length=16, choices=NotificationChannel.choices)
    destination = models.CharField(max_length=2000)  # the webhook URL or e-mail address, as it was
    webhook_format = models.CharField(max_length=16, default=WebhookFormat.JSON)
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField()
    published_at = models.DateTimeField(null=True, blank=True)
    publish_attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    # Why it waits (next_attempt_at is when it is looked at again): the owner's quiet hours, or
    # its hourly limit on the channel. Blank once it is sent or when it never waited.
    held = models.CharField(max_length=8, choices=HoldReason.choices, blank=True, default="")
    # Sent as part of this summary (a notification of kind notification.summary that lists it)
    # rather than on its own: published_at is when the summary was made.
    summarized_in = models.ForeignKey("self", on_delete=models.SET_NULL, null=True, blank=True, related_name="+")

    class Meta:
        ordering = ["-id"]
        indexes = [
            # The relay's hourly limit: an owner's messages sent in the last hour on a channel.
            models.Index(fields=["owner", "channel", "published_at"], name="notification_owner_sent_idx",
                         condition=Q(published_at__isnull=False)),
            # The notification relay's claim: never-tried rows (next_attempt_at null) in id order,
            # and due retries by next_attempt_at (dispatch.notifications.claim).
            models.Index(fields=["next_attempt_at", "id"], name="notification_due_idx",
                         condition=Q(published_at__isnull=True)),
            models.Index(fields=["published_at"], name="notification_published_idx",
                         condition=Q(published_at__isnull=False)),
        ]

    def __str__(self):
        return f"{self.kind} to {self.channel} {self.destination}"



# --- retry cost (dispatch.retry_cost folds it in the activity loop; pages and the API read it) --


class CostDimension(models.TextChoices):
    """What a RetryCostHour row counts for."""

    SCHEDULE = "schedule"  # key: the schedule's id
    OWNER = "owner"  # key: the schedule's owner's id when the attempt was counted ("" = no owner)
    TARGET = "target"  # key: the run's target host:port


class RetryCostHour(models.Model):
    """Finished attempts of one schedule, owner or target host that ended in one UTC hour, with
    what their retries cost (docs/incidents.md, "Retry cost", says exactly what each counter
    counts). Rows only grow by increments; kept RETENTION (a little over the 7-day window)."""

    id = models.BigAutoField(primary_key=True)
    tenant_id = models.UUIDField()
    dimension = models.CharField(max_length=8, choices=CostDimension.choices)
    key = models.CharField(max_length=300)
    hour = models.DateTimeField()
    attempts = models.PositiveIntegerField(default=0)  # succeeded, failed and unknown
    successes = models.PositiveIntegerField(default=0)
    retries = models.PositiveIntegerField(default=0)  # attempts that followed a failed or unknown one
    retried_runs = models.PositiveIntegerField(default=0)  # first retries: one per run that needed one
    failed = models.PositiveIntegerField(default=0)  # failed and unknown attempts
    failed_us = models.BigIntegerField(default=0)  # their time from start to end, microseconds
    backoff_us = models.BigIntegerField(default=0)  # waits between a failed attempt and the retry

    class Meta:
        constraints = [
            # The schedule and owner pages read one key's hours of the window by this index; the
            # activity loop finds the rows it adds to by the whole key.
            models.UniqueConstraint(fields=["tenant_id", "dimension", "key", "hour"], name="retry_cost_hour_unique"),
            models.CheckConstraint(condition=Q(dimension__in=["schedule", "owner", "target"]),
                                   name="retry_cost_dimension_valid"),
        ]
        indexes = [
            # The ranking (GET /api/v1/retry-cost, the retry-cost page): a tenant's hours that had
            # a retry, so the keys that cost the most are found without reading those that cost none.
            models.Index(fields=["tenant_id", "dimension", "hour"], name="retry_cost_retried_idx",
                         condition=Q(retries__gt=0)),
            # The activity loop's retention pass deletes the oldest hours.
            models.Index(fields=["hour"], name="retry_cost_hour_time_idx"),
        ]


class _ForecastKey(models.Model):
    """Everything one forecast counts a schedule by (dispatch.forecast's group key), and its tenant.
    `anchored` is the schedule's anchor for rate() and RRULE rules (they count from it), else null."""

    tenant_id = models.UUIDField()
    expression = models.CharField(max_length=2000)
    time_zone = models.CharField(max_length=64)
    dst_skipped = models.CharField(max_length=16)
    dst_repeated = models.CharField(max_length=16)
    end_at = models.DateTimeField(null=True)
    anchored = models.DateTimeField(null=True)
    next_run_at = models.DateTimeField()
    spread_offset_seconds = models.IntegerField()
    misfire_grace_seconds = models.IntegerField()
    target_url = models.CharField(max_length=2000)
    n = models.BigIntegerField()

    class Meta:
        abstract = True


class ForecastGroup(_ForecastKey):
    """The forecast's summary: how many schedules in the forecast's scope (enabled, active, with a
    next run) have each group key, as of the last fold of ForecastDelta into it. The summary plus
    the deltas not folded yet are exact at any moment (dispatch.forecast_store)."""

    id = models.BigAutoField(primary_key=True)


class ForecastDelta(_ForecastKey):
    """Changes of ForecastGroup not folded in yet: written by database triggers on schedules and
    their versions (migration dispatch 0007) in the transaction of the change, +n for a key that
    gained schedules, -n for one that lost them. Readers fold them into the summary."""

    id = models.BigAutoField(primary_key=True)
