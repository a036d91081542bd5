"""The run queue's statements through the ORM: the whole store on SQLite, and on PostgreSQL every
statement `runs.store.postgres` does not replace with a faster one. See `runs.store`.

Each method applies a decision already made (`runs.decisions`) inside the caller's transaction.
Writes that apply a worker's result, heartbeat or release are fenced by their own WHERE (run id,
generation, state leased): a worker that lost its lease changes nothing.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from django.db import OperationalError, connection, transaction
from django.db.models import (
    Case,
    CharField,
    Count,
    DateTimeField,
    F,
    IntegerField,
    Min,
    Q,
    TextField,
    Value,
    When,
    Window,
)
from django.db.models.functions import Mod, RowNumber

from runs import decisions
from runs.decisions import (
    BUFFERED_UNTIL,
    LEASE_EXPIRED,
    Claimed,
    Decided,
    Event,
    VersionPolicy,
    completion_kind,
    event,
    iso,
)
from runs.models import (
    TERMINAL_STATES,
    Attempt,
    AttemptOutcome,
    EventKind,
    Occurrence,
    OutboxEvent,
    Reason,
    RecentStateCount,
    Run,
    RunKind,
    RunState,
)
from runs.store.history import PortableHistory
from runs.store.requested import RequestedChanges
from scheduler_project.foundation.dbclock import db_now
from schedules.models import MisfirePolicy, Schedule, ScheduleStatus, ScheduleVersion, TargetPrefix, Tenant
from schedules.targets import target_host


def _owned(keys, worker_id=None):
    """Runs still leased at the given (run id, generation) pairs: the fence."""
    cond = Q()
    for run_id, gen in keys:
        cond |= Q(id=run_id, generation=gen)
    qs = Run.objects.filter(cond, state=RunState.LEASED)
    if worker_id:
        qs = qs.filter(lease_owner=worker_id)
    return qs


def _keep_recent_count(key: str, taken_at: datetime, counts: dict) -> None:
    """One INSERT ... ON CONFLICT DO UPDATE, in a savepoint when the caller has a transaction."""
    with transaction.atomic():
        RecentStateCount.objects.bulk_create(
            [RecentStateCount(key=key, taken_at=taken_at, counts=counts)],
            update_conflicts=True, unique_fields=["key"], update_fields=["taken_at", "counts"])


# The distinct misfire graces read in one pass (each one range of the missed runs' read).
GRACE_VALUES = 1000


class PortableStore(RequestedChanges, PortableHistory):
    # --- new rows of any model, in bulk (schedule creation) ---------------------------------------

    def rows_insert_new(self, model, objs: list, *, need_ids: bool = False) -> None:
        """Insert new, unsaved instances of one model, all at once; with `need_ids`, an
        auto-numbered primary key is set on each instance (the caller points other rows at it)."""
        model.objects.bulk_create(objs)

    # --- schedules: creation, the scanner's due range and its write-back --------------------------

    def schedule_insert(self, schedule: Schedule, version: ScheduleVersion, entry) -> None:
        """A new schedule's rows, all unsaved: its first version, the schedule with that version
        current, and the audit entry of its creation, all or none (a transaction of their own when
        the caller has none). The schedule's id is already set (the version points at it); the
        version's id is set here, and `schedule.current` is the version."""
        with transaction.atomic():
            version.save(force_insert=True)
            schedule.current = version
            schedule.save(force_insert=True)
            entry.save(force_insert=True)

    def schedule_due_query(self, now, *, shards: int | None = None, shard=None, horizon=timedelta(0)):
        """Schedules with an occurrence due within the horizon, in the given shard(s) of `shards`,
        oldest first: one range scan on schedule_due_idx, whose cost follows what is due. (Only
        `allow` schedules are materialised ahead; the caller passes over the others until they are
        due. Filtering them here would join the versions into the range scan.)"""
        qs = Schedule.objects.filter(next_run_at__lte=now + horizon, enabled=True, status=ScheduleStatus.ACTIVE)
        if shards:
            wanted = [shard] if isinstance(shard, int) else list(shard)
            qs = qs.annotate(_shard=Mod(F("shard"), shards)).filter(_shard__in=wanted)
        return qs.order_by("next_run_at")

    def schedule_scan_begin(self) -> tuple[datetime, bool]:
        """The database's clock for a scanner pass, and whether the pass may go on: always here
        (no partition DDL to make way for; runs.partitions, "The scanner's gate")."""
        return db_now(), True

    def schedule_lock_due(self, now, *, batch: int, shards=None, shard=None, horizon=timedelta(0),
                          after: datetime | None = None, exclude=()) -> list:
        """Up to `batch` due schedules with their current version, oldest first (only those due
        after `after`, if given; none of `exclude`, ids this transaction holds already), locked;
        ones another scanner holds are skipped. The schedule row lock serialises everyone who
        inserts occurrences for a schedule (scanner, trigger, backfill, edits)."""
        qs = self.schedule_due_query(now, shards=shards, shard=shard, horizon=horizon)
        if after is not None:
            qs = qs.filter(next_run_at__gt=after)
        if exclude:
            qs = qs.exclude(id__in=list(exclude))
        return list(qs.select_for_update(skip_locked=True, of=("self",)).select_related("current")[:batch])

    def schedule_oldest_due(self, now, *, shards=None, shard=None, horizon=timedelta(0)):
        """The next_run_at of the oldest due schedule (locked or not), or None: one probe of
        schedule_due_idx."""
        return (self.schedule_due_query(now, shards=shards, shard=shard, horizon=horizon)
                .values_list("next_run_at", flat=True).first())

    def schedule_first_due(self, *, after: datetime | None = None):
        """The earliest next_run_at of a live schedule (beyond `after`), or None."""
        live = Schedule.objects.filter(enabled=True, status=ScheduleStatus.ACTIVE, next_run_at__isnull=False)
        if after is not None:
            live = live.filter(next_run_at__gt=after)
        return live.order_by("next_run_at").values_list("next_run_at", flat=True).first()

    def schedule_nth_due(self, now, k: int, *, beyond: datetime, until: datetime, shards=None, shard=None):
        """The due time of the k-th live schedule due in (beyond, until], or None when fewer are."""
        qs = (self.schedule_due_query(now, shards=shards, shard=shard, horizon=until - now)
              .filter(next_run_at__gt=beyond).values_list("next_run_at", flat=True))
        return qs[k - 1:k].first()

    def schedule_count_due(self, now, *, beyond: datetime, until: datetime, cap: int, shards=None, shard=None) -> tuple:
        """(how many live schedules are due in (beyond, until], counted up to `cap`; the due time of
        the last of those counted). The count reads the due range of schedule_due_idx once, only
        as far as `cap`: the queryset's own statement, limited, inside a COUNT."""
        qs = (self.schedule_due_query(now, shards=shards, shard=shard, horizon=until - now)
              .filter(next_run_at__gt=beyond).values("next_run_at")[:cap])
        inner, params = qs.query.get_compiler(using=qs.db).as_sql()
        with connection.cursor() as cur:
            cur.execute(f"SELECT COUNT(*) FROM ({inner}) due", params)
            count = cur.fetchone()[0]
        if not count:
            return 0, None
        return count, self.schedule_nth_due(now, count, beyond=beyond, until=until, shards=shards, shard=shard)

    def schedule_advance_many(self, schedules, *, now: datetime) -> None:
        """The scanner's write-back of next_run_at, completion and last scan error."""
        Schedule.objects.bulk_update(schedules, ["next_run_at", "status", "completed_at", "last_error"],
                                     batch_size=1000)

    # --- versions ---------------------------------------------------------------------------------

    def version_policies_by_id(self, version_ids) -> dict:
        return {
            vid: VersionPolicy(base, cap, overlap)
            for vid, base, cap, overlap in ScheduleVersion.objects.filter(id__in=version_ids).values_list(
                "id", "backoff_base_seconds", "backoff_max_seconds", "overlap_policy")
        }

    def version_least_misfire_grace(self) -> int:
        return ScheduleVersion.objects.aggregate(g=Min("misfire_grace_seconds"))["g"] or 0

    # --- tenants ----------------------------------------------------------------------------------

    def tenant_claim_caps(self) -> tuple[dict, dict]:
        """Per-tenant in-flight caps and per-(tenant, target host) budgets."""
        tenant_caps = dict(Tenant.objects.filter(max_in_flight__isnull=False).values_list("id", "max_in_flight"))
        host_caps: dict = {}
        for tenant_id, prefix, cap in TargetPrefix.objects.filter(max_concurrency__isnull=False).values_list(
            "tenant_id", "prefix", "max_concurrency"
        ):
            key = (tenant_id, target_host(prefix))
            host_caps[key] = min(cap, host_caps.get(key, cap))
        return tenant_caps, host_caps

    # --- runs: materialising ----------------------------------------------------------------------

    def run_insert_many(self, triples, *, stamp: datetime, now: datetime) -> set:
        """Insert occurrences, then runs and events for the occurrences that were new; returns the
        ids (text) of the runs made. An occurrence that already exists (a backfill's, or a crashed
        pass's that committed) is left alone: the unique constraint decides, so there is never a
        second run for it."""
        Occurrence.objects.bulk_create([t[0] for t in triples], batch_size=1000, ignore_conflicts=True)
        inserted = set(Occurrence.objects.filter(id__in=[t[0].id for t in triples]).values_list("id", flat=True))
        kept = [t for t in triples if t[0].id in inserted]
        for o, r, _ in kept:
            r.occurrence_id = o.id
        Run.objects.bulk_create([t[1] for t in kept], batch_size=1000)
        self.event_insert_many([t[2] for t in kept], now=now)
        return {str(t[1].id) for t in kept}

    def run_active_per_schedule(self, schedule_ids) -> dict:
        """For overlap policies: per schedule, (an earlier run is still leased or waiting to retry,
        a run is already buffered)."""
        out = {}
        if not schedule_ids:
            return out
        rows = Run.objects.filter(schedule_id__in=schedule_ids).filter(
            Q(state=RunState.LEASED) | Q(state=RunState.READY, generation__gt=0)
            | Q(state=RunState.READY, reason=Reason.BUFFERED)
        ).values_list("schedule_id", "state", "reason")
        for sid, state, reason in rows:
            busy, buffered = out.get(sid, (False, False))
            if reason == Reason.BUFFERED:
                buffered = True
            else:
                busy = True
            out[sid] = (busy, buffered)
        return out

    def run_existing_instants(self, schedule_id, start: datetime, end: datetime) -> set:
        """Instants in [start, end) that already have a run of any version of the schedule."""
        return set(
            Run.objects.filter(schedule_id=schedule_id, scheduled_time__gte=start, scheduled_time__lt=end)
            .values_list("scheduled_time", flat=True)
        )

    # --- runs: claiming ---------------------------------------------------------------------------

    def run_due_tenants(self, now, *, max_tenants: int) -> list:
        """Tenants with runs due now, in tenant order. A run is due once it is eligible and its
        scheduled time has come (a run is never started before its instant)."""
        return list(
            Run.objects.filter(state=RunState.READY, next_eligible_at__lte=now, scheduled_time__lte=now)
            .order_by("tenant_id").values_list("tenant_id", flat=True).distinct()[:max_tenants]
        )

    def run_due_candidates(self, tenants: list, now, *, per_tenant: int, room: dict | None = None,
                           without: dict | None = None) -> list:
        """(run id, tenant id, target host) of up to `per_tenant` of each tenant's oldest due runs,
        and no more than its `room` (tenant -> runs it may still be given) where that is less,
        locked (rows another worker holds are skipped), in the given tenant order, leaving out
        the runs of each tenant's targets in `without` (tenant -> hosts with no room): a backlog
        to a full target must not hide the tenant's other targets."""
        rows = []
        for tenant, limit in zip(tenants, decisions.candidate_limits(tenants, per_tenant, room)):
            if limit <= 0:
                continue
            rows += list(
                Run.objects.filter(state=RunState.READY, tenant_id=tenant, next_eligible_at__lte=now,
                                   scheduled_time__lte=now)
                .exclude(target_host__in=(without or {}).get(tenant, ()))
                .order_by("next_eligible_at", "id").select_for_update(skip_locked=True)
                .values_list("id", "tenant_id", "target_host")[:limit]
            )
        return rows

    def run_cap_locks(self, tenant_ids, host_keys) -> set:
        """Of the capped tenants and budgeted (tenant, host) pairs, those this claim may count and
        lease for until it commits. SQLite has one writer at a time: the claim that writes first
        commits before another's write begins, so every one is this claim's."""
        return set(tenant_ids) | set(host_keys)

    def run_leased_per_tenant(self, tenant_ids) -> dict:
        return dict(
            Run.objects.filter(state=RunState.LEASED, tenant_id__in=tenant_ids)
            .values_list("tenant_id").annotate(n=Count("id")).values_list("tenant_id", "n")
        )

    def run_leased_per_host(self, keys) -> dict:
        rows = (
            Run.objects.filter(state=RunState.LEASED, tenant_id__in={k[0] for k in keys},
                               target_host__in={k[1] for k in keys})
            .values_list("tenant_id", "target_host").annotate(n=Count("id"))
        )
        return {(t, h): n for t, h, n in rows}

    def run_claim_due(self, *, worker: str, limit: int, lease_seconds: float, shift: int, holding) -> list[Claimed]:
        """With no explicit caps in play: lease up to `limit` due runs, tenants in rotation, each
        with a fair share, taken round-robin, and no tenant or target host beyond its room under
        the default shares of the claiming worker's slots (`holding`, a decisions.Holding): the
        same choice PostgresStore makes in one statement."""
        now = db_now()
        due = [t for t in self.run_due_tenants(now, max_tenants=10_000) if holding.tenant_room(t) > 0]
        tenants = decisions.rotate(due, shift)[:limit]
        if not tenants:
            return []
        candidates = self.run_due_candidates(tenants, now, per_tenant=decisions.fair_share(limit, len(tenants)),
                                             without=decisions.full_targets(holding.hosts, holding.host_cap))
        ids = decisions.pick(candidates, limit, tenant_room={t: holding.tenant_room(t) for t in tenants},
                             host_room={}, target_room={k: holding.host_room(k) for k in holding.hosts},
                             target_cap=holding.host_cap)
        return self.run_claim(ids, worker=worker, now=now, until=now + timedelta(seconds=lease_seconds))

    def run_claim(self, ids, *, worker: str, now: datetime, until: datetime) -> list[Claimed]:
        """Lease the given ready runs: generation + 1, attempt opened, event written."""
        if not ids:
            return []
        Run.objects.filter(id__in=ids, state=RunState.READY).update(
            state=RunState.LEASED,
            generation=F("generation") + 1,
            attempts_used=F("attempts_used") + 1,
            lease_until=until,
            lease_owner=worker,
            reason="",
            next_eligible_at=None,
            first_started_at=Case(
                When(first_started_at__isnull=True, then=Value(now)), default=F("first_started_at"),
                output_field=DateTimeField(),
            ),
        )
        rows = list(
            Run.objects.filter(id__in=ids, lease_owner=worker, lease_until=until).values_list(
                "id", "generation", "attempts_used", "max_attempts", "tenant_id", "schedule_id",
                "schedule_version", "scheduled_time", "version_id",
                "version__target_url", "version__target_method", "version__target_headers",
                "version__target_timeout_seconds", "version__payload",
                "version__backoff_base_seconds", "version__backoff_max_seconds", "version__overlap_policy",
                "target_host",
            )
        )
        attempts = Attempt.objects.bulk_create(
            [Attempt(run_id=r[0], scheduled_time=r[7], generation=r[1], worker_id=worker, started_at=now) for r in rows]
        )
        self.event_insert_many([event(r[0], r[4], EventKind.LEASED, generation=r[1], workerId=worker,
                                      state=RunState.LEASED) for r in rows], now=now)
        # The same shape PostgresStore's claim returns: the version's call (headers and payload as
        # JSON text) and policy, and the ids and time as the call's headers carry them.
        return [
            Claimed(r[0], r[1], a.id, r[2], r[3], r[4], r[5], r[6], r[7], r[8],
                    target=(r[9], r[10], json.dumps(r[11] or {}), r[12], json.dumps(r[13], separators=(",", ":"))),
                    policy=r[14:17], run_key=str(r[0]), schedule_key=str(r[5]), scheduled_iso=iso(r[7]),
                    target_host=r[17])
            for r, a in zip(rows, attempts)
        ]

    def runs_live(self, *, due_by: datetime | None = None):
        """The runs a read of ready or leased runs needs to look at: every run here; on
        PostgreSQL, those in the live partitions (PostgresStore.runs_live). With `due_by`, only
        those scheduled by then, which every run due or leased by then is (a run is never
        eligible before its scheduled time, and was due when it was leased)."""
        qs = Run.objects.all()
        return qs if due_by is None else qs.filter(scheduled_time__lte=due_by)

    def run_earliest_ready(self, *, until: datetime):
        """When the earliest ready run becomes eligible, if that is by `until` (None otherwise)."""
        return (self.runs_live(due_by=until).filter(state=RunState.READY, next_eligible_at__lte=until)
                .order_by("next_eligible_at").values_list("next_eligible_at", flat=True).first())

    # --- runs: leases and results -----------------------------------------------------------------

    def run_extend_leases(self, keys, *, worker: str, lease_seconds: float) -> set:
        """Extend the leases this worker still holds at these generations; returns the pairs it
        still owns."""
        now = db_now()
        owned = set(_owned(keys, worker).select_for_update().values_list("id", "generation"))
        if owned:
            _owned(owned, worker).update(lease_until=now + timedelta(seconds=lease_seconds))
        return owned

    def run_complete(self, decided: list[Decided]) -> tuple[set, datetime | None]:
        """Apply each decided result where its generation still holds the lease: the run's new
        state, its attempt's evidence, the event. Any other result is kept on its attempt as a
        late result. Returns the (run id text, generation) pairs applied and the time written."""
        now = db_now()
        keys = [(d.result.claimed.run_id, d.result.claimed.generation) for d in decided]
        owned = set(_owned(keys).select_for_update().values_list("id", "generation"))
        attempts = {a.id: a for a in Attempt.objects.filter(id__in=[d.result.claimed.attempt_id for d in decided])}
        updates, events = [], []
        for d in decided:
            r, c = d.result, d.result.claimed
            a = attempts[c.attempt_id]
            if (c.run_id, c.generation) not in owned:
                a.late_result = {**r.evidence(), "receivedAt": iso(now)}
                continue
            eligible = now + timedelta(seconds=d.delay) if d.state == RunState.READY else None
            a.outcome, a.finished_at, a.http_status = r.outcome, now, r.http_status
            a.error_class, a.error, a.response_excerpt = r.error_class[:100], r.error[:2000], r.response_excerpt
            a.latency_ms, a.remote_address = r.latency_ms, r.remote_address or ""
            updates.append((c.run_id, d.state, eligible, r.last_error))
            events.append(event(c.run_id, c.tenant_id, completion_kind(d.state), generation=c.generation,
                                state=d.state, nextEligibleAt=iso(eligible), **r.evidence()))
        Attempt.objects.bulk_update(
            list(attempts.values()),
            ["outcome", "finished_at", "http_status", "error_class", "error", "response_excerpt", "latency_ms",
             "remote_address", "late_result"],
        )
        self.run_apply_updates(updates, now=now)
        self.event_insert_many(events, now=now)
        return {(str(run_id), gen) for run_id, gen in owned}, now

    def run_apply_updates(self, updates, *, now: datetime) -> None:
        """One UPDATE for a batch of (run id, new state, next_eligible_at, last error) decided
        while the rows are locked; the lease is cleared and finished_at set on terminal states."""
        if not updates:
            return
        ids = [u[0] for u in updates]
        state_case = Case(*[When(id=u[0], then=Value(u[1])) for u in updates], output_field=CharField())
        eligible_case = Case(
            *[When(id=u[0], then=Value(u[2])) for u in updates if u[2]], default=Value(None),
            output_field=DateTimeField(),
        )
        error_case = Case(*[When(id=u[0], then=Value(u[3])) for u in updates], default=F("last_error"),
                          output_field=TextField())
        terminal = [u[0] for u in updates if u[1] in TERMINAL_STATES]
        Run.objects.filter(id__in=ids).update(
            state=state_case,
            next_eligible_at=eligible_case,
            lease_until=None,
            lease_owner="",
            last_error=error_case,
            finished_at=Case(When(id__in=terminal, then=Value(now)), default=Value(None), output_field=DateTimeField())
            if terminal else None,
        )

    def run_release_unstarted(self, claims: list[Claimed], *, now: datetime) -> list[Claimed]:
        """Runs claimed but never called go back to ready now; their attempt stays (generations
        have no gaps) as abandoned and does not count against the retry budget. Returns the
        claims released (the ones whose generation still held the lease)."""
        keys = [(c.run_id, c.generation) for c in claims]
        owned = set(_owned(keys).select_for_update().values_list("id", "generation"))
        if not owned:
            return []
        _owned(owned).update(state=RunState.READY, lease_until=None, lease_owner="", next_eligible_at=now,
                             attempts_used=F("attempts_used") - 1)
        mine = [c for c in claims if (c.run_id, c.generation) in owned]
        Attempt.objects.filter(id__in=[c.attempt_id for c in mine]).update(
            outcome=AttemptOutcome.ABANDONED, finished_at=now, error="given back unstarted at worker shutdown"
        )
        self.event_insert_many([event(c.run_id, c.tenant_id, EventKind.RELEASED, generation=c.generation,
                                      state=RunState.READY) for c in mine], now=now)
        return mine

    # --- runs: the reconciler and schedule changes ------------------------------------------------

    def run_lock_expired_leases(self, now, *, batch: int) -> list:
        """Leased runs past their lease end, locked, with what the retry decision needs."""
        return list(
            self.runs_live(due_by=now).filter(state=RunState.LEASED, lease_until__lt=now)
            .select_for_update(skip_locked=True)
            .select_related("version")
            .only("id", "tenant_id", "schedule_id", "generation", "attempts_used", "max_attempts",
                  "version__backoff_base_seconds", "version__backoff_max_seconds", "version__overlap_policy",
                  "lease_owner")[:batch]
        )

    def run_release_buffered(self, schedule_ids, *, now: datetime) -> int:
        """Overlap buffer_one: for schedules whose earlier run ended, their buffered run may start
        now. A schedule is still busy while any other run of it is leased or ready; its buffered
        run then waits on. Rows another transaction holds are left for the next call, so this never
        waits on a lock. The released run's eligibility is now, where its misfire grace starts."""
        schedule_ids = set(schedule_ids)
        live = self.runs_live()  # PostgreSQL reads the live floor once for both reads
        busy = set(
            live.filter(schedule_id__in=schedule_ids, state__in=[RunState.LEASED, RunState.READY])
            .exclude(reason=Reason.BUFFERED)
            .values_list("schedule_id", flat=True)
        )
        free = schedule_ids - busy
        if not free:
            return 0
        rows = list(
            # A run is buffered when it is due (never made ahead), so it was scheduled by now.
            live.filter(schedule_id__in=free, state=RunState.READY, reason=Reason.BUFFERED, scheduled_time__lte=now)
            .select_for_update(skip_locked=True)
            .values_list("id", "tenant_id")
        )
        if not rows:
            return 0
        Run.objects.filter(id__in=[r[0] for r in rows]).update(next_eligible_at=now, reason="")
        self.event_insert_many([event(rid, tid, EventKind.UNBUFFERED, state=RunState.READY, nextEligibleAt=iso(now))
                                for rid, tid in rows], now=now)
        return len(rows)

    def run_buffered_schedules(self, *, now: datetime) -> set:
        """Schedules with a buffered run. Buffered runs wait at BUFFERED_UNTIL, the far end of
        run_ready_idx: this reads them only, not every ready run of a backlog. A run is buffered
        when it is due, so it was scheduled by `now`."""
        return set(
            self.runs_live(due_by=now).filter(state=RunState.READY, next_eligible_at=BUFFERED_UNTIL, reason=Reason.BUFFERED)
            .values_list("schedule_id", flat=True)
        )

    def _run_unclaimed(self, now):
        return self.runs_live(due_by=now).filter(
            state=RunState.READY, generation=0, kind=RunKind.SCHEDULED, reason="", next_eligible_at__lt=now
        )

    def run_oldest_unclaimed(self, now):
        return self._run_unclaimed(now).order_by("next_eligible_at").values_list("next_eligible_at", flat=True).first()

    def run_missed_beyond_policy(self, now, *, limit: int) -> list:
        """Ids of unclaimed runs eligible longer ago than their version's grace that their
        schedule's misfire policy does not keep (ranked per schedule, newest first, past the 0, 1
        or catchupLimit kept), oldest first, at most `limit`.

        Ranking over the whole missed set, not a locked batch, means a pass never skips a run that
        should be kept. PostgreSQL refuses FOR UPDATE beside a window function, so the caller
        locks what this picks in a separate step. "Eligible longer ago than its version's grace"
        is one range per distinct grace value (there are few): interval arithmetic on a column is
        not portable."""
        unclaimed = self._run_unclaimed(now)
        # Without the model's ordering: DISTINCT would take its columns in and give a row per run
        # (the newest GRACE_VALUES runs, sorted, and a grace seen only among older runs missed).
        graces = set(unclaimed.order_by().values_list("version__misfire_grace_seconds", flat=True)
                     .distinct()[:GRACE_VALUES])
        missed = Q()
        for g in graces:
            missed |= Q(version__misfire_grace_seconds=g, next_eligible_at__lt=now - timedelta(seconds=g))
        return list(
            unclaimed.filter(missed)
            .annotate(
                newer=Window(RowNumber(), partition_by=[F("schedule_id")],
                             order_by=[F("scheduled_time").desc(), F("id").desc()]),
                keep=Case(
                    When(version__misfire_policy=MisfirePolicy.SKIP, then=Value(0)),
                    When(version__misfire_policy=MisfirePolicy.RUN_ONCE, then=Value(1)),
                    default=F("version__catchup_limit"),
                    output_field=IntegerField(),
                ),
            )
            .filter(newer__gt=F("keep"))
            .order_by("next_eligible_at")
            .values_list("id", flat=True)[:limit]
        )

    def run_skip_unclaimed(self, ids, *, now: datetime, reason: str) -> int:
        """Skip those of `ids` still unclaimed (locked with SKIP LOCKED, re-checked)."""
        qs = Run.objects.filter(id__in=ids, state=RunState.READY, generation=0, reason="")
        return self._run_end_unstarted(qs, RunState.SKIPPED, reason=reason, now=now, skip_locked=True)

    def run_cancel_unstarted(self, schedule_id, *, now: datetime, reason: str, versions_below: int | None = None) -> int:
        """Cancel a schedule's runs that have not started (ready, never attempted), with events."""
        qs = Run.objects.filter(schedule_id=schedule_id, state=RunState.READY, generation=0)
        if versions_below is not None:
            qs = qs.filter(schedule_version__lt=versions_below)
        return self._run_end_unstarted(qs, RunState.CANCELED, reason=reason, now=now)

    def _run_end_unstarted(self, qs, state: str, *, reason: str, now: datetime, skip_locked: bool = False) -> int:
        """Runs of `qs` (ready, never attempted), locked, made terminal in `state` with `reason`,
        each with its event."""
        rows = list(qs.select_for_update(skip_locked=skip_locked).values_list("id", "tenant_id"))
        if not rows:
            return 0
        Run.objects.filter(id__in=[r[0] for r in rows]).update(
            state=state, reason=reason, next_eligible_at=None, finished_at=now
        )
        kind = {RunState.SKIPPED: EventKind.SKIPPED, RunState.CANCELED: EventKind.CANCELED}[state]
        self.event_insert_many([event(rid, tid, kind, state=state, reason=reason) for rid, tid in rows], now=now)
        return len(rows)

    # --- attempts ---------------------------------------------------------------------------------

    def attempt_mark_open_unknown(self, runs, *, now: datetime, error: str) -> None:
        cond = Q()
        for r in runs:
            cond |= Q(run_id=r.id, generation=r.generation)
        Attempt.objects.filter(cond, outcome__isnull=True).update(
            outcome=AttemptOutcome.UNKNOWN, finished_at=now, error_class=LEASE_EXPIRED, error=error,
        )

    # --- events: every outbox event is written here -----------------------------------------------

    def event_insert_many(self, events: list[Event], *, now: datetime) -> None:
        """Every outbox event is written here, in the caller's transaction. A tenant without a
        webhook has nobody to deliver to, so its events are written published (the PostgreSQL
        statements that write events decide it the same way, in SQL: runs.store.postgres)."""
        if not events:
            return
        silent = {str(t) for t in Tenant.objects.filter(id__in={e.tenant_id for e in events}, notification_url="")
                  .values_list("id", flat=True)}
        OutboxEvent.objects.bulk_create([
            OutboxEvent(run_id=e.run_id, tenant_id=e.tenant_id, kind=e.kind, payload=e.payload,
                        published_at=now if str(e.tenant_id) in silent else None)
            for e in events
        ])

    # --- counters kept for the portal and /metrics (runs.stats) -----------------------------------

    def counter_keep_recent(self, key: str, *, taken_at: datetime, counts: dict) -> bool:
        """Keep the last hour's counts for `key` (one upsert), or, when another writer holds the
        database, not: the caller is a page or a scrape, which must not wait for an optional save.
        True when kept. SQLite has one write lock for the file; the upsert runs without the busy
        wait the connection otherwise has (restored after)."""
        with connection.cursor() as cur:
            cur.execute("PRAGMA busy_timeout")
            (wait_ms,) = cur.fetchone()
            cur.execute("PRAGMA busy_timeout = 0")
            try:
                _keep_recent_count(key, taken_at, counts)
            except OperationalError:  # "database is locked": another writer has the file
                return False
            finally:
                cur.execute(f"PRAGMA busy_timeout = {int(wait_ms)}")
        return True

