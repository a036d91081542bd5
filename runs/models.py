"""Occurrences, runs, attempts and the outbox: the durable side of scheduling (docs/failure-model.md).

State rules live in the database as check constraints. Every transition is decided once in
`runs.decisions` and applied by one entry point (`runs.queue` for the loops' batches,
`runs.actions` for every change a person or client asks for)
through the storage seam `runs.store`, and writes its outbox event in the same transaction.

On PostgreSQL the four history tables are partitioned by time (migration 0007, `runs.partitions`,
docs/scaling.md "Time partitioning"): occurrences, runs and attempts by the run's scheduled_time
(one run's whole history lives in one partition and goes with it), outbox events by created_at.
PostgreSQL wants the partition key in every unique constraint, so:
- each table's real primary key is (id, partition key); Django still sees `id` as the primary key
  and looks rows up by it (ids are UUIDs or sequence numbers, unique on their own);
- the unique constraints below carry scheduled_time (or created_at). Each stays exactly as strict
  as before because the key is a function of the rest: an occurrence has one scheduled time, a run
  has its occurrence's, an attempt its run's (all written together by the same statement);
- the run -> occurrence and attempt -> run foreign keys are not database constraints: a foreign key
  into a partitioned table would make every partition drop check the referencing table. The
  invariant checker covers both (`runs_without_occurrence`, `attempts_without_run`).
On SQLite the same constraints exist, unpartitioned.
"""

import uuid
from datetime import timedelta

from django.db import models
from django.db.models import F, Q

from runs import tracecontext
from schedules.models import Schedule, ScheduleVersion, Tenant


class RunState(models.TextChoices):
    READY = "ready"
    LEASED = "leased"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELED = "canceled"
    SKIPPED = "skipped"


# A terminal run changes only through an explicit manual retry (invariant 5 of docs/failure-model.md).
TERMINAL_STATES = tuple(s.value for s in (RunState.SUCCEEDED, RunState.DEAD, RunState.CANCELED, RunState.SKIPPED))


class RunKind(models.TextChoices):
    SCHEDULED = "scheduled"
    MANUAL = "manual"
    BACKFILL = "backfill"


class Reason(models.TextChoices):
    """Why a run was skipped or canceled (or, for ready runs, why it waits)."""

    MISFIRE = "misfire"
    OVERLAP = "overlap"
    SUPERSEDED = "superseded"
    PAUSED = "paused"
    DST = "dst"
    CANCELED = "canceled"  # an explicit cancel by an operator, tenant or service
    ARCHIVED = "archived"
    BUFFERED = "buffered"  # overlap buffer_one: waiting for the earlier run to end


class EventKind(models.TextChoices):
    """The outbox event each transition writes (consumers and the invariant checker read these)."""

    CREATED = "run.created"  # materialised ready (scanner, trigger, backfill)
    SKIPPED = "run.skipped"  # made or turned skipped (misfire, overlap, DST)
    CANCELED = "run.canceled"  # canceled (operator, pause, edit, archive), also made canceled
    LEASED = "run.leased"  # claimed by a worker: generation + 1, attempt opened
    SUCCEEDED = "run.succeeded"
    RETRY_SCHEDULED = "run.retry_scheduled"  # a failed or unknown attempt, another one will follow
    DEAD = "run.dead"  # into the dead-letter queue
    LEASE_EXPIRED = "run.lease_expired"  # the reconciler recovered a lease: outcome unknown
    RELEASED = "run.released"  # given back unstarted at worker shutdown
    UNBUFFERED = "run.unbuffered"  # overlap buffer_one: the run it waited for ended
    RETRIED = "run.retried"  # a manual retry of a dead or canceled run


class Occurrence(models.Model):
    # Ids are made client-side so a scanner batch inserts occurrences and runs without a round
    # trip to learn the keys. PostgreSQL's primary key is (id, scheduled_time): see the module.
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Served by the (schedule, version, instant) unique index.
    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="occurrences", db_index=False)
    schedule_version = models.PositiveIntegerField()
    # No index on version, as for Run.version: versions are never deleted, nothing looks
    # occurrences up by version, and the index cost a write per run made (runs/0011).
    version = models.ForeignKey(ScheduleVersion, on_delete=models.PROTECT, related_name="occurrences",
                                db_index=False)
    scheduled_time = models.DateTimeField()
    # What the rule meant: the naive local wall time, the zone, the tz database used, and a note
    # when DST moved or dropped it, so a later tzdata update cannot silently change history.
    local_wall_time = models.CharField(max_length=32)
    local_time = models.CharField(max_length=40)
    time_zone = models.CharField(max_length=64)
    tzdata_version = models.CharField(max_length=16)
    note = models.CharField(max_length=200, blank=True, default="")
    kind = models.CharField(max_length=16, choices=RunKind.choices, default=RunKind.SCHEDULED)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            # Invariant 1: the final guard against a second run for one occurrence.
            models.UniqueConstraint(
                fields=["schedule", "schedule_version", "scheduled_time"], name="occurrence_identity_unique"
            ),
        ]


class Run(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)  # = idempotency key
    # One run per occurrence: run_one_per_occurrence below (not a database foreign key, see the
    # module docstring; served by that unique index).
    occurrence = models.ForeignKey(Occurrence, on_delete=models.PROTECT, related_name="run", db_index=False,
                                   db_constraint=False)
    # Denormalised from the occurrence so claiming, fairness and listing need no join. No
    # single-column indexes: the (tenant, time) and (schedule, time) indexes below serve those
    # lookups, and every index is written on each of a run's four or five updates.
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+", db_index=False)
    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="runs", db_index=False)
    schedule_version = models.PositiveIntegerField()
    # No index on version: versions are never deleted (a schedule is archived, never removed), so
    # nothing looks runs up by version, and each index costs a write on every claim and result.
    version = models.ForeignKey(ScheduleVersion, on_delete=models.PROTECT, related_name="runs", db_index=False)
    scheduled_time = models.DateTimeField()
    kind = models.CharField(max_length=16, choices=RunKind.choices, default=RunKind.SCHEDULED)
    state = models.CharField(max_length=16, choices=RunState.choices, default=RunState.READY)
    reason = models.CharField(max_length=16, choices=Reason.choices, blank=True, default="")
    generation = models.PositiveIntegerField(default=0)
    # Attempts the retry policy counts; a manual retry resets it, the generation never goes back.
    attempts_used = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=5)
    next_eligible_at = models.DateTimeField(null=True, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    lease_owner = models.CharField(max_length=200, blank=True, default="")
    # host:port of the version's target, for per-target concurrency budgets at claim time.
    target_host = models.CharField(max_length=300, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    first_started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    retried_by = models.CharField(max_length=200, blank=True, default="")
    retried_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-scheduled_time", "-id"]
        indexes = [
            # The workers' claim: ready runs by eligibility time. Partial so the planner keeps to
            # the few ready rows however large the history grows.
            models.Index(fields=["next_eligible_at"], name="run_ready_idx", condition=Q(state="ready")),
            # Tenant-fair claiming: which tenants have due runs (a skip scan over tenant_id), then
            # each tenant's share of the batch in eligibility order.
            models.Index(fields=["tenant", "next_eligible_at"], name="run_ready_tenant_idx", condition=Q(state="ready")),
            # The reconciler's expiry scan: leased runs by lease end.
            models.Index(fields=["lease_until"], name="run_leased_idx", condition=Q(state="leased")),
            # The dead-letter queue's size and the dashboard's latest dead runs (by when they died).
            models.Index(fields=["tenant", "-finished_at"], name="run_dead_idx", condition=Q(state="dead")),
            # The portal's dead runs in list order (the DLQ, its groups' sample, the runs list
            # filtered to dead): one tenant's, and every tenant's. Without them a page of dead runs
            # walks the tenant's whole recent history, finished runs first, to find fifty.
            models.Index(fields=["tenant", "-scheduled_time", "-id"], name="run_dead_time_idx", condition=Q(state="dead")),
            models.Index(fields=["-scheduled_time", "-id"], name="run_dead_all_time_idx", condition=Q(state="dead")),
            # Run lists per schedule and per tenant (keyset pagination on scheduled_time, id).
            models.Index(fields=["schedule", "-scheduled_time", "-id"], name="run_schedule_time_idx"),
            models.Index(fields=["tenant", "-scheduled_time", "-id"], name="run_tenant_time_idx"),
            # Retention (runs.retention): runs retried by hand are kept counting from the retry,
            # and a partition swap re-copies the ones retried while it staged. Partial, so only
            # the few retried runs have an entry and the hot path writes none.
            models.Index(fields=["retried_at"], name="run_retried_idx", condition=Q(retried_at__isnull=False)),
        ]
        constraints = [
            # Invariant 1: one run per occurrence (a run's scheduled_time is its occurrence's).
            models.UniqueConstraint(fields=["occurrence", "scheduled_time"], name="run_one_per_occurrence"),
            models.CheckConstraint(
                condition=Q(state__in=[s.value for s in RunState]), name="run_state_valid"
            ),
            # Leased exactly when a lease exists.
            models.CheckConstraint(
                condition=(Q(state="leased") & Q(lease_until__isnull=False) & ~Q(lease_owner=""))
                | (~Q(state="leased") & Q(lease_until__isnull=True)),
                name="run_lease_iff_leased",
            ),
            models.CheckConstraint(
                condition=~Q(state="ready") | Q(next_eligible_at__isnull=False), name="run_ready_has_eligibility"
            ),
            # finished_at is set exactly when the run is terminal.
            models.CheckConstraint(
                condition=(Q(state__in=TERMINAL_STATES) & Q(finished_at__isnull=False))
                | (~Q(state__in=TERMINAL_STATES) & Q(finished_at__isnull=True)),
                name="run_finished_iff_terminal",
            ),
            models.CheckConstraint(condition=Q(generation__gte=0), name="run_generation_nonnegative"),
            models.CheckConstraint(condition=Q(attempts_used__lte=F("generation")), name="run_attempts_within_generation"),
            models.CheckConstraint(
                condition=~Q(state="leased") | Q(generation__gte=1), name="run_leased_has_generation"
            ),
        ]

    def __str__(self):
        return f"run {self.id} ({self.state})"

    # Spread (schedules.spread): only the scanner's runs are spread; a manual trigger or a backfill
    # is eligible when it is made. Read from the run's version (select_related it for lists).
    @property
    def spread_seconds(self) -> int:
        return self.version.spread_seconds if self.kind == RunKind.SCHEDULED else 0

    @property
    def spread_offset_seconds(self) -> int:
        return self.version.spread_offset_seconds if self.kind == RunKind.SCHEDULED else 0

    @property
    def eligible_from(self):
        """When its first attempt could start: the nominal instant plus the spread offset (a
        backfill's runs are ready when made). Lags are measured from here."""
        if self.kind == RunKind.BACKFILL:
            return self.created_at
        return self.scheduled_time + timedelta(seconds=self.spread_offset_seconds)

    @property
    def idempotency_key(self) -> str:
        return str(self.id)


class RunTimeField(models.DateTimeField):
    """An attempt's copy of its run's scheduled time (the partition key). The queue's statements
    write it with the attempt; any other code that makes an attempt without it (the admin, a test)
    gets its run's, read here, so the copy can never differ from the run's own."""

    def pre_save(self, model_instance, add):
        value = getattr(model_instance, self.attname)
        if value is None and add and model_instance.run_id is not None:
            run = model_instance._state.fields_cache.get("run")
            if run is None or run.pk != model_instance.run_id:
                run = Run.objects.only("scheduled_time").get(pk=model_instance.run_id)
            value = run.scheduled_time
            setattr(model_instance, self.attname, value)
        return value


class AttemptOutcome(models.TextChoices):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    UNKNOWN = "unknown"  # the lease expired: the target may or may not have acted
    ABANDONED = "abandoned"  # given back without calling the target (shutdown) or canceled mid-call


class Attempt(models.Model):
    id = models.BigAutoField(primary_key=True)
    # Served by the (run, generation) unique index; not a database foreign key (module docstring).
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="attempts", db_index=False,
                            db_constraint=False)
    # The run's scheduled time, written with the attempt by the claim: the partition key, so that a
    # run and all its attempts live in the same partition and are removed together.
    scheduled_time = RunTimeField()
    generation = models.PositiveIntegerField()
    worker_id = models.CharField(max_length=200)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=AttemptOutcome.choices, null=True, blank=True)
    http_status = models.PositiveSmallIntegerField(null=True, blank=True)
    error_class = models.CharField(max_length=100, blank=True, default="")
    error = models.TextField(blank=True, default="")
    response_excerpt = models.TextField(blank=True, default="")
    latency_ms = models.PositiveIntegerField(null=True, blank=True)
    remote_address = models.CharField(max_length=64, blank=True, default="")
    # Set when the run was canceled while this attempt was in flight.
    canceled_in_flight = models.BooleanField(default=False)
    # A result that arrived after the attempt was fenced (lease lost, run canceled): kept as
    # evidence, never applied to the run.
    late_result = models.JSONField(null=True, blank=True)

    # The W3C trace context the attempt's call carried (runs.tracecontext): derived from the run's
    # id and this attempt's, so the worker, the API and the portal show the same ids.
    @property
    def trace_id(self) -> str:
        return tracecontext.trace_id(self.run_id)

    @property
    def span_id(self) -> str:
        return tracecontext.span_id(self.id)

    @property
    def traceparent(self) -> str:
        return tracecontext.traceparent(self.run_id, self.id)

    class Meta:
        ordering = ["run", "generation"]
        constraints = [
            # Invariant 2: one attempt per generation (scheduled_time is the run's: same strictness).
            models.UniqueConstraint(fields=["run", "generation", "scheduled_time"], name="attempt_run_generation_unique"),
            # Invariant 3 (half of it): at most one open attempt per run.
            models.UniqueConstraint(fields=["run", "scheduled_time"], condition=Q(outcome__isnull=True),
                                    name="attempt_one_open_per_run"),
            models.CheckConstraint(
                condition=(Q(outcome__isnull=True) & Q(finished_at__isnull=True))
                | (Q(outcome__isnull=False) & Q(finished_at__isnull=False)),
                name="attempt_finished_iff_outcome",
            ),
            models.CheckConstraint(
                condition=Q(outcome__isnull=True) | Q(outcome__in=[o.value for o in AttemptOutcome]),
                name="attempt_outcome_valid",
            ),
            models.CheckConstraint(condition=Q(generation__gte=1), name="attempt_generation_positive"),
        ]

    def __str__(self):
        return f"attempt {self.run_id}#{self.generation}"



def with_spread(runs) -> list:
    """`runs` with their versions' spread (Run.spread_seconds, eligible_from) read in one query,
    unless the caller joined the versions already (select_related)."""
    runs = list(runs)
    version_field = Run._meta.get_field("version")
    missing = {r.version_id for r in runs if not version_field.is_cached(r)}
    if missing:
        versions = ScheduleVersion.objects.only("id", "spread_seconds", "spread_offset_seconds").in_bulk(list(missing))
        for run in runs:
            if run.version_id in versions and not version_field.is_cached(run):
                version_field.set_cached_value(run, versions[run.version_id])
    return runs


def with_history(runs) -> list:
    """`runs` (a list or queryset) with each run's occurrence (`run.occurrence`) and attempts,
    oldest first (`run.attempt_list`): two queries for any number of runs, each restricted to the
    runs' scheduled times as well as their ids, so PostgreSQL plans and probes only the partitions
    that hold them. Joining the occurrence by its id alone makes every partition part of the plan:
    on a long history that plan is costed high enough to run in parallel, and starting the workers
    took most of a run page's time."""
    runs = list(runs)
    if not runs:
        return runs
    times = {r.scheduled_time for r in runs}
    occurrences = {o.id: o for o in
                   Occurrence.objects.filter(id__in={r.occurrence_id for r in runs}, scheduled_time__in=times)}
    # A run and its occurrence always share the scheduled time (the partitions rely on it); one
    # that does not is still shown with its occurrence, found by id alone.
    strays = {r.occurrence_id for r in runs} - set(occurrences)
    if strays:
        occurrences.update(Occurrence.objects.in_bulk(list(strays)))
    attempts: dict = {r.id: [] for r in runs}
    for attempt in Attempt.objects.filter(run_id__in=list(attempts), scheduled_time__in=times).order_by(
            "run_id", "generation"):
        attempts[attempt.run_id].append(attempt)
    field = Run._meta.get_field("occurrence")
    for run in runs:
        field.set_cached_value(run, occurrences.get(run.occurrence_id))
        run.attempt_list = attempts[run.id]
    return runs


def attempts_with_their_runs(attempts):
    """`attempts` joined to their runs on the partition key as well as the id (the two always
    agree: the claim copies the run's scheduled time into the attempt). With the id alone,
    PostgreSQL probes every runs partition for each attempt; with the key it probes the one that
    holds the run. For querysets that read run__ fields."""
    return attempts.filter(run__scheduled_time=F("scheduled_time"))


class OutboxEvent(models.Model):
    """A run transition, written in the transaction that made it; the relay publishes it."""

    id = models.BigAutoField(primary_key=True)
    # Consumers dedupe by event_id. It is a random UUID (uuid4 here, gen_random_uuid() in the
    # queue statements): unique by its 122 random bits, not by an index. A unique index could only
    # have been on (event_id, created_at), the partition key being part of every unique index,
    # which checks nothing the random bits do not already give; it cost a random-position insert
    # and a uniqueness probe per event, two or three per run (runs/0011).
    event_id = models.UUIDField(default=uuid.uuid4, editable=False)
    # An event is history: the queue statements write it from the RETURNING of the run's own
    # update, so its run and tenant exist when it is written, and it must not stop a run or
    # tenant from being removed later (retention, partition drops). So no database foreign keys
    # here: they cost five trigger queries per run on the hot path (bench/queue_profile.py
    # measures the share). The relay reaches the tenant by its primary key.
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False, db_constraint=False)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events", null=True, db_constraint=False)
    kind = models.CharField(max_length=40)  # run.created, run.leased, run.succeeded, ...
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)
    published_at = models.DateTimeField(null=True, blank=True)
    publish_attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")

    class Meta:
        indexes = [
            # The relay's queue: unpublished events in order.
            models.Index(fields=["id"], name="outbox_unpublished_idx", condition=Q(published_at__isnull=True)),
            # The relay's claim (dispatch.relay): never-tried events (next_attempt_at null) in id
            # order, and due retries by next_attempt_at. Without it a webhook that is down
            # leaves a backlog that every claim would walk past.
            models.Index(
                fields=["next_attempt_at", "id"], name="outbox_relay_due_idx", condition=Q(published_at__isnull=True)
            ),
        ]

    def __str__(self):
        return f"{self.kind} of run {self.run_id}" if self.run_id else self.kind


# The longest retention a tenant's own policy may set (a century). Retention subtracts the period
# from now; a period beyond what a datetime can hold (e.g. 2,000,000,000 days) made every retention
# pass, /metrics and the dashboard fail for every tenant, not only the one that set it.
MAX_RETENTION_DAYS = 36_500


class RetentionPolicy(models.Model):
    """A tenant's own retention (runs.retention): how long its finished history is kept, where it
    differs from the deployment's defaults (SCHEDULER_RETENTION_DAYS, SCHEDULER_DEAD_RETENTION_DAYS).
    Empty fields use the default. Runs that are not finished are never removed, whatever this says."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, primary_key=True, related_name="retention")
    # Succeeded, canceled and skipped runs: days after their scheduled time (after a manual retry,
    # after the retry).
    finished_days = models.PositiveIntegerField(null=True, blank=True)
    # Dead runs: days after they went dead.
    dead_days = models.PositiveIntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(finished_days__isnull=True) | Q(finished_days__gte=1, finished_days__lte=MAX_RETENTION_DAYS),
                name="retention_finished_days_range",
            ),
            models.CheckConstraint(
                condition=Q(dead_days__isnull=True) | Q(dead_days__gte=1, dead_days__lte=MAX_RETENTION_DAYS),
                name="retention_dead_days_range",
            ),
        ]

    def __str__(self):
        return f"retention of {self.tenant_id}"


class HistoryPartition(models.Model):
    """One partition of a history table on PostgreSQL (runs.partitions keeps this list in step with
    the database's own; empty on SQLite). `sealed`: the partition holds no ready or leased run, so
    the dispatch hot path leaves it out of its plans; a trigger on a sealed partition unseals it the
    moment a row in it becomes ready or leased again (a manual retry, a backfill)."""

    name = models.CharField(max_length=63, primary_key=True)
    table = models.CharField(max_length=63)
    # None: unbounded (the kept partition starts at MINVALUE, the catch-all ends at MAXVALUE).
    lower = models.DateTimeField(null=True, blank=True)
    upper = models.DateTimeField(null=True, blank=True)
    role = models.CharField(max_length=16)  # kept | live | future
    sealed = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["table", "lower"]
        indexes = [models.Index(fields=["table", "sealed"], name="history_partition_live_idx")]

    def __str__(self):
        return self.name


class HistoryRemoval(models.Model):
    """One removal by retention (runs.retention), also in the audit log; the newest is what the
    portal and /metrics show (read by its index, not by searching the audit log)."""

    id = models.BigAutoField(primary_key=True)
    at = models.DateTimeField(auto_now_add=True)
    what = models.CharField(max_length=200)  # a partition's name, or "batches"
    removed = models.JSONField(default=dict)  # table -> rows removed
    kept = models.JSONField(default=dict)  # table -> rows of the new kept partition
    lock_ms = models.FloatField(null=True, blank=True)  # how long the tables were locked

    class Meta:
        ordering = ["-at"]
        indexes = [models.Index(fields=["-at"], name="history_removal_at_idx")]

    def __str__(self):
        return f"{self.what} at {self.at}"


class RecentStateCount(models.Model):
    """The last hour's runs by state for one set of tenants (the dashboard's and /metrics' "runs
    scheduled in the last hour"), kept only when counting them was slow (runs.stats): at the
    design rate an hour holds about a million runs, and every dashboard poll of every operator
    counted them again. Shared by every process through the database; read by its key."""

    # "all", or the sha256 of the sorted tenant ids a user sees: a count is only ever served for
    # exactly the tenants it counted.
    key = models.CharField(max_length=64, primary_key=True)
    taken_at = models.DateTimeField()
    counts = models.JSONField(default=dict)  # state -> runs
