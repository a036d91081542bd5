"""The incidents loop: turns run transitions into incidents, one per (schedule or tenant, rule)
while its condition holds, and writes each opening and resolution as notifications to the
owner's channels (dispatch.notifications delivers them). docs/incidents.md says what each rule
means exactly.

One pass (`IncidentEvaluator.step`), in two transactions:

1. A short read (`read_facts`): the outbox events after the watermark by id, at most BATCH,
   stopping at the first one written less than SETTLE ago (an older id may still be committing,
   as in dispatch.activity); their runs and schedules by primary key, and the tenants; on a probe,
   the oldest ready runs past their grace. Committed before the evaluation: a transaction holds
   its locks on the tables it read until it ends, and `maintain` gives way to any holder of the
   history tables or the schedules (runs.partitions, "Lock order"). One that evaluated thousands
   of events while holding them (seconds on a busy host) made retention give way again and
   again, and the history grew (found by bench/soak.py: most of its giving way was to this loop).
2. Lock the cursor row (IncidentCursor): several loops (one per `scheduler` or `reconcile`
   process) take turns, so no event is evaluated twice; a pass whose watermark moved since its
   read starts again. Read the policies, failure streaks and open incidents of only those
   schedules and tenants; apply each event in order: a failure adds to the streak and opens or
   adds to an incident, a success clears the streak and resolves, a start resolves a missed start
   and checks the start lag, a misfire skip is a missed start.
4. At most every PROBE_SECONDS: the oldest ready runs past their grace (the head of the
   workers' run_ready_idx, at most PROBE_BATCH) are missed starts even before the reconciler
   skips them (runs stuck behind a budget never are); tenants' dead-letter growth over the last
   hour is checked for the tenants that had a run go dead since, and those with a DLQ incident.

A pass costs what changed since the last one (BATCH events, their runs and schedules by key,
PROBE_BATCH index entries), never a scan of the schedules, and runs in its own loop: claiming and
completing runs do no incident work at all.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Max, Sum

from dispatch.models import (
    DeadMinute,
    FailureStreak,
    Incident,
    IncidentCursor,
    IncidentPolicy,
    IncidentRule,
    IncidentState,
    Notification,
    NotificationChannel,
    NotificationKind,
)
from runs.models import EventKind, OutboxEvent, Reason, Run, RunKind, RunState
from runs.store import store
from scheduler_project.foundation import anyof  # noqa: F401  (registers __anyof)
from scheduler_project.foundation.dbclock import db_now
from scheduler_project.foundation.dbplanner import by_key
from scheduler_project.foundation.errors import Conflict
from schedules.models import AuditAction, AuditEntry, Owner, Schedule, Tenant
from schedules.services import Actor, audit, audit_entry

log = logging.getLogger("scheduler.incidents")

SYSTEM = Actor("system:incidents")
BATCH = 5000
PROBE_BATCH = 500
PROBE_SECONDS = 5.0
IDLE_SECONDS = 2.0
DEAD_WINDOW = timedelta(hours=1)


@dataclass(frozen=True)
class Policy:
    enabled: bool
    threshold: float | None


# Without a policy row: the deployment's defaults (settings SCHEDULER_INCIDENT_*).
def defaults() -> dict[str, Policy]:
    return {
        IncidentRule.DEAD: Policy(True, None),
        IncidentRule.CONSECUTIVE_FAILURES: Policy(True, float(getattr(settings, "SCHEDULER_INCIDENT_FAILURES", 3))),
        # Threshold: seconds of grace; None = the schedule version's misfire grace.
        IncidentRule.MISSED_START: Policy(True, None),
        IncidentRule.START_LAG: Policy(getattr(settings, "SCHEDULER_INCIDENT_START_LAG_SECONDS", None) is not None,
                                       getattr(settings, "SCHEDULER_INCIDENT_START_LAG_SECONDS", None)),
        IncidentRule.DLQ_GROWTH: Policy(getattr(settings, "SCHEDULER_INCIDENT_DLQ_GROWTH", None) is not None,
                                        getattr(settings, "SCHEDULER_INCIDENT_DLQ_GROWTH", None)),
    }


def settle() -> timedelta:
    return timedelta(seconds=float(getattr(settings, "SCHEDULER_INCIDENT_SETTLE_SECONDS", 10)))


FAILING = (IncidentRule.CONSECUTIVE_FAILURES, IncidentRule.DEAD)
FAILED = {EventKind.RETRY_SCHEDULED.value, EventKind.DEAD.value, EventKind.LEASE_EXPIRED.value}
READ = FAILED | {EventKind.SUCCEEDED.value, EventKind.LEASED.value, EventKind.SKIPPED.value}

SUMMARIES = {
    IncidentRule.DEAD: "a run of {name} went to the dead-letter queue",
    IncidentRule.CONSECUTIVE_FAILURES: "{name} failed {n} times in a row",
    IncidentRule.MISSED_START: "a run of {name} did not start within its grace",
    IncidentRule.START_LAG: "runs of {name} started {n:.0f} s late",
    IncidentRule.DLQ_GROWTH: "{n} runs of tenant {name} went dead in the last hour",
}


def _iso(dt: datetime | None) -> str | None:
    return dt.isoformat().replace("+00:00", "Z") if dt else None


def incident_json(inc: Incident) -> dict:
    return {
        "id": inc.id, "rule": inc.rule, "state": inc.state, "summary": inc.summary,
        "scheduleId": str(inc.schedule_id) if inc.schedule_id else None,
        "owner": inc.owner.slug if inc.owner_id else None,
        "occurrences": inc.occurrences, "openedAt": _iso(inc.opened_at), "lastSeenAt": _iso(inc.last_seen_at),
        "lastRunId": str(inc.last_run_id) if inc.last_run_id else None, "lastError": inc.last_error,
        "acknowledgedAt": _iso(inc.acknowledged_at), "acknowledgedBy": inc.acknowledged_by or None,
        "resolvedAt": _iso(inc.resolved_at), "resolvedBy": inc.resolved_by or None,
    }


# --- notifications: written in the transaction that opened or resolved the incident ---------


def notifications_for(inc: Incident, kind: NotificationKind, *, tenant_slug: str, now: datetime, owner: Owner | None = None) -> list:
    """One Notification per channel of the incident's owner (none without an owner)."""
    owner = owner if owner is not None else (Owner.objects.filter(id=inc.owner_id).first() if inc.owner_id else None)
    if owner is None:
        return []
    body = {"tenant": tenant_slug, "incident": incident_json(inc), "text": _text(inc, kind)}
    out = []
    if owner.webhook_url:
        out.append(Notification(tenant_id=inc.tenant_id, owner=owner, incident=inc, kind=kind,
                                channel=NotificationChannel.WEBHOOK, destination=owner.webhook_url,
                                webhook_format=owner.webhook_format, payload=body, created_at=now))
    if owner.email:
        out.append(Notification(tenant_id=inc.tenant_id, owner=owner, incident=inc, kind=kind,
                                channel=NotificationChannel.EMAIL, destination=owner.email, payload=body,
                                created_at=now))
    return out


def _text(inc: Incident, kind: NotificationKind) -> str:
    if kind == NotificationKind.INCIDENT_RESOLVED:
        how = "by itself" if inc.resolved_by == SYSTEM.name else f"by {inc.resolved_by}"
        return f"Resolved ({how}): {inc.summary}"
    if kind == NotificationKind.INCIDENT_TEST:
        return "A test notification from the scheduler"
    return f"Incident: {inc.summary}"


# --- the evaluation --------------------------------------------------------------------------


@dataclass
class Facts:
    """What a pass reads from the run history and the schedule tables, in its own short
    transaction before the evaluation (read_facts)."""

    events: list  # (id, run_id, tenant_id, kind, payload, created_at), in id order, settled
    runs: dict  # run id -> (id, schedule_id, scheduled_time, kind)
    missed: list  # the probe's ready runs past their grace (probe_missed)
    schedules: dict  # id -> dict(id, tenant_id, owner_id, name)
    tenants: dict  # id -> dict(id, slug, default_owner_id)


def read_facts(watermark: int, now: datetime, *, batch: int = BATCH, probe: bool = False) -> Facts:
    """The events after `watermark` (at most `batch`, up to the first not settled), the runs they
    name, on a probe the oldest ready runs past their grace, and the schedules and tenants of all
    of them (with the tenants that have a DLQ incident open), in one short transaction."""
    with transaction.atomic():
        rows = list(OutboxEvent.objects.filter(id__gt=watermark).order_by("id").values_list(
            "id", "run_id", "tenant_id", "kind", "payload", "created_at")[:batch])
        cutoff = now - settle()
        events = []
        for row in rows:
            if row[5] > cutoff:
                break
            events.append(row)
        run_ids = {e[1] for e in events if e[1] and e[3] in READ}
        # By key whatever the statistics say: probed, a batch's runs cost the batch; PostgreSQL would
        # read the day's partition whole while it judges that cheaper (foundation.dbplanner).
        runs = {}
        if run_ids:
            with by_key():
                runs = {r[0]: r for r in Run.objects.filter(id__anyof=run_ids).values_list(
                    "id", "schedule_id", "scheduled_time", "kind")}
        missed = []
        if probe:
            missed = list(
                store().runs_live(due_by=now).filter(state=RunState.READY, next_eligible_at__lt=now)
                .exclude(reason=Reason.BUFFERED)
                .order_by("next_eligible_at")
                .values_list("id", "schedule_id", "tenant_id", "next_eligible_at",
                             "version__misfire_grace_seconds")[:PROBE_BATCH]
            )
        sids = {r[1] for r in runs.values()} | {r[1] for r in missed}
        schedules = {}
        if sids:
            with by_key():
                schedules = {row["id"]: row for row in Schedule.objects.filter(id__anyof=sids).order_by().values(
                    "id", "tenant_id", "owner_id", "name")}
        tids = {e[2] for e in events} | {r[2] for r in missed} | {row["tenant_id"] for row in schedules.values()}
        if events or probe:  # the dead-letter growth check's (check_dead_growth); an idle pass has none
            tids |= set(Incident.objects.filter(rule=IncidentRule.DLQ_GROWTH, schedule__isnull=True)
                        .exclude(state=IncidentState.RESOLVED).values_list("tenant_id", flat=True))
        tenants = {}
        if tids:
            tenants = {row["id"]: row for row in Tenant.objects.filter(id__anyof=tids).values("id", "slug",
                                                                                              "default_owner_id")}
    return Facts(events, runs, missed, schedules, tenants)


class Pass:
    """The state one pass reads for the schedules and tenants its events touch."""

    def __init__(self, now: datetime, facts: Facts | None = None):
        self.now = now
        # Read before the pass's transaction (read_facts): id -> dict(tenant_id, owner_id, name),
        # and id -> dict(slug, default_owner_id).
        self.schedules: dict = dict(facts.schedules) if facts else {}
        self.tenants: dict = dict(facts.tenants) if facts else {}
        self.policies: dict = {}  # (tenant_id or schedule_id, rule) -> Policy
        self.streaks: dict = {}  # schedule id -> failures
        self.open: dict = {}  # (schedule id or tenant id, rule) -> Incident
        self.owners: dict = {}
        self.notes: list[Notification] = []
        self.audits: list = []
        self.touched: dict = {}  # id(incident) -> incident, to save
        self.dead_by_tenant: dict = defaultdict(int)

    def load(self, schedule_ids: set, tenant_ids: set) -> None:
        """The incident state of these schedules and tenants (their own facts are read already)."""
        schedule_ids = {sid for sid in schedule_ids if sid in self.schedules}
        tenant_ids = {tid for tid in tenant_ids if tid in self.tenants} | {
            self.schedules[sid]["tenant_id"] for sid in schedule_ids}
        for p in IncidentPolicy.objects.filter(tenant_id__anyof=tenant_ids, schedule__isnull=True):
            self.policies[(p.tenant_id, p.rule)] = Policy(p.enabled, p.threshold)
        for p in IncidentPolicy.objects.filter(schedule_id__anyof=schedule_ids):
            self.policies[(p.schedule_id, p.rule)] = Policy(p.enabled, p.threshold)
        self.streaks = dict(FailureStreak.objects.filter(schedule_id__anyof=schedule_ids).values_list("schedule_id",
                                                                                                   "failures"))
        opened = Incident.objects.exclude(state=IncidentState.RESOLVED)
        for inc in opened.filter(schedule_id__anyof=schedule_ids):
            self.open[(inc.schedule_id, inc.rule)] = inc
        for inc in opened.filter(tenant_id__anyof=tenant_ids, schedule__isnull=True):
            self.open[(inc.tenant_id, inc.rule)] = inc

    def policy(self, sid, tid, rule) -> Policy:
        return self.policies.get((sid, rule)) or self.policies.get((tid, rule)) or defaults()[rule]

    def owner_of(self, sid, tid):
        sch = self.schedules.get(sid) if sid else None
        oid = (sch or {}).get("owner_id") or self.tenants.get(tid, {}).get("default_owner_id")
        if oid and oid not in self.owners:
            self.owners[oid] = Owner.objects.filter(id=oid).first()
        return self.owners.get(oid) if oid else None

    def fire(self, sid, tid, rule, *, n=1, run_id=None, error="", at=None, count=1) -> None:
        """Open the (schedule or tenant, rule) incident, or add `count` to the open one."""
        key = (sid or tid, rule)
        at = at or self.now
        inc = self.open.get(key)
        if inc is None and rule in FAILING:
            # One failure incident per schedule: a dead run while N failures are open (or the
            # other way round) adds to the open one instead of paging again.
            inc = next((self.open[(sid, r)] for r in FAILING if (sid, r) in self.open), None)
            count = 1 if inc is not None else count
        if inc is not None:
            inc.occurrences += count
            inc.last_seen_at = max(inc.last_seen_at, at)
            inc.last_run_id = run_id or inc.last_run_id
            inc.last_error = (error or inc.last_error)[:300]
            self.touched[id(inc)] = inc
            return
        name = self.schedules[sid]["name"] or str(sid) if sid else self.tenants[tid]["slug"]
        owner = self.owner_of(sid, tid)
        inc = Incident(tenant_id=tid, schedule_id=sid, owner=owner, rule=rule, state=IncidentState.OPEN,
                       summary=SUMMARIES[rule].format(name=name, n=n)[:500], occurrences=max(1, int(count)),
                       opened_at=at, last_seen_at=at, last_run_id=run_id, last_error=error[:300])
        inc.save(force_insert=True)
        self.open[key] = inc
        self.audits.append(audit_entry(AuditAction.INCIDENT_OPEN, by=SYSTEM, obj_type="incident", obj_id=inc.id, tenant_id=tid,
                                       after=incident_json(inc)))
        self.notes += notifications_for(inc, NotificationKind.INCIDENT_OPENED, tenant_slug=self.tenants[tid]["slug"], now=self.now,
                                        owner=owner)

    def clear(self, sid, tid, rule) -> None:
        inc = self.open.pop((sid or tid, rule), None)
        if inc is None:
            return
        inc.state, inc.resolved_at, inc.resolved_by = IncidentState.RESOLVED, self.now, SYSTEM.name
        self.touched[id(inc)] = inc
        self.audits.append(audit_entry(AuditAction.INCIDENT_RESOLVE, by=SYSTEM, obj_type="incident", obj_id=inc.id,
                                       tenant_id=tid, after={"state": inc.state, "occurrences": inc.occurrences}))
        self.notes += notifications_for(inc, NotificationKind.INCIDENT_RESOLVED, tenant_slug=self.tenants[tid]["slug"], now=self.now,
                                        owner=self.owners.get(inc.owner_id) if inc.owner_id else None)

    def save(self, schedule_ids: set) -> None:
        for inc in self.touched.values():
            inc.save(update_fields=["occurrences", "last_seen_at", "last_run_id", "last_error", "state",
                                    "resolved_at", "resolved_by"])
        # The pass's schedules' streaks written back whole: two statements however many changed
        # (the cursor lock keeps other passes off them meanwhile).
        FailureStreak.objects.filter(schedule_id__anyof=schedule_ids).delete()
        FailureStreak.objects.bulk_create([FailureStreak(schedule_id=sid, failures=n)
                                           for sid, n in self.streaks.items() if n > 0 and sid in schedule_ids])
        if self.notes:
            Notification.objects.bulk_create(self.notes)
        if self.audits:
            AuditEntry.objects.bulk_create(self.audits)


def apply_events(p: Pass, events: list, runs: dict) -> set:
    """Apply events (id, run_id, tenant_id, kind, payload, created_at) in order, with their runs
    (read_facts); returns the schedule ids they touched."""
    sids = {r[1] for r in runs.values()}
    p.load(sids, {e[2] for e in events if e[3] in READ})
    for _, run_id, tid, kind, payload, created_at in events:
        run = runs.get(run_id)
        if kind not in READ or run is None or run[1] not in p.schedules:
            continue
        sid = run[1]
        payload = payload or {}
        if kind in FAILED:
            p.streaks[sid] = p.streaks.get(sid, 0) + 1
            error = payload.get("error") or payload.get("errorClass") or ""
            cf = p.policy(sid, tid, IncidentRule.CONSECUTIVE_FAILURES)
            n = int(cf.threshold or 1)
            if cf.enabled and p.streaks[sid] >= n:
                # Opened with the whole streak counted; each later failure adds one.
                first = (sid, IncidentRule.CONSECUTIVE_FAILURES) not in p.open
                p.fire(sid, tid, IncidentRule.CONSECUTIVE_FAILURES, n=p.streaks[sid], run_id=run_id, error=error,
                       at=created_at, count=p.streaks[sid] if first else 1)
            if kind == EventKind.DEAD or payload.get("state") == RunState.DEAD:
                p.dead_by_tenant[tid] += 1
                # Already counted by an open N-failures incident (one failure incident per schedule).
                if p.policy(sid, tid, IncidentRule.DEAD).enabled and (sid, IncidentRule.CONSECUTIVE_FAILURES) not in p.open:
                    p.fire(sid, tid, IncidentRule.DEAD, run_id=run_id, error=error, at=created_at)
        elif kind == EventKind.SUCCEEDED:
            p.streaks[sid] = 0
            for rule in (IncidentRule.CONSECUTIVE_FAILURES, IncidentRule.DEAD, IncidentRule.MISSED_START):
                p.clear(sid, tid, rule)
        elif kind == EventKind.LEASED:
            p.clear(sid, tid, IncidentRule.MISSED_START)
            lag_policy = p.policy(sid, tid, IncidentRule.START_LAG)
            if lag_policy.enabled and lag_policy.threshold is not None and run[3] == RunKind.SCHEDULED \
                    and payload.get("generation") == 1:
                lag = (created_at - run[2]).total_seconds()
                if lag > lag_policy.threshold:
                    p.fire(sid, tid, IncidentRule.START_LAG, n=lag, run_id=run_id, at=created_at)
                else:
                    p.clear(sid, tid, IncidentRule.START_LAG)
        elif kind == EventKind.SKIPPED and payload.get("reason") == Reason.MISFIRE:
            if p.policy(sid, tid, IncidentRule.MISSED_START).enabled:
                p.fire(sid, tid, IncidentRule.MISSED_START, run_id=run_id, at=created_at)
    return sids


def probe_missed(now: datetime, facts: Facts | None = None) -> set:
    """The oldest ready runs past their grace (the head of run_ready_idx, read by read_facts):
    missed starts."""
    facts = facts or read_facts(0, now, batch=0, probe=True)
    p = Pass(now, facts)
    rows = facts.missed
    if not rows:
        return set()
    sids = {r[1] for r in rows}
    p.load(sids, {r[2] for r in rows})
    for run_id, sid, tid, eligible, grace in rows:
        if sid not in p.schedules:
            continue
        policy = p.policy(sid, tid, IncidentRule.MISSED_START)
        limit = policy.threshold if policy.threshold is not None else grace
        if policy.enabled and eligible + timedelta(seconds=limit) < now and (sid, IncidentRule.MISSED_START) not in p.open:
            p.fire(sid, tid, IncidentRule.MISSED_START, run_id=run_id, at=now)
    p.save(set())
    return sids


def check_dead_growth(now: datetime, dead_by_tenant: dict, facts: Facts) -> None:
    """Count this pass's dead runs per minute and tenant; compare each affected tenant's last
    hour (and every tenant with an open DLQ incident) with its threshold."""
    minute = now.replace(second=0, microsecond=0)
    for tid, n in dead_by_tenant.items():
        row, _ = DeadMinute.objects.select_for_update().get_or_create(tenant_id=tid, minute=minute)
        DeadMinute.objects.filter(id=row.id).update(dead=row.dead + n)
    open_tids = set(Incident.objects.filter(rule=IncidentRule.DLQ_GROWTH, schedule__isnull=True)
                    .exclude(state=IncidentState.RESOLVED).values_list("tenant_id", flat=True))
    tids = set(dead_by_tenant) | open_tids
    if not tids:
        return
    p = Pass(now, facts)
    p.load(set(), set(tids))
    sums = dict(DeadMinute.objects.filter(tenant_id__anyof=tids, minute__gt=now - DEAD_WINDOW)
                .values("tenant_id").annotate(n=Sum("dead")).values_list("tenant_id", "n"))
    for tid in tids:
        if tid not in p.tenants:
            continue
        policy = p.policy(None, tid, IncidentRule.DLQ_GROWTH)
        total = sums.get(tid, 0)
        if policy.enabled and policy.threshold is not None and total > policy.threshold:
            if (tid, IncidentRule.DLQ_GROWTH) in p.open:
                p.fire(None, tid, IncidentRule.DLQ_GROWTH, count=dead_by_tenant.get(tid, 0) or 0)
            else:
                p.fire(None, tid, IncidentRule.DLQ_GROWTH, n=total, count=total)
        else:
            p.clear(None, tid, IncidentRule.DLQ_GROWTH)
    p.save(set())
    DeadMinute.objects.filter(minute__lt=now - 2 * DEAD_WINDOW).delete()


def _cursor() -> IncidentCursor:
    cursor = IncidentCursor.objects.select_for_update().filter(id=1).first()
    if cursor is None:
        # A new deployment evaluates from now on, not the history already in the outbox.
        start = OutboxEvent.objects.aggregate(m=Max("id"))["m"] or 0
        IncidentCursor.objects.get_or_create(id=1, defaults={"watermark": start})
        cursor = IncidentCursor.objects.select_for_update().get(id=1)
    return cursor


class IncidentEvaluator:
    name = "incidents"

    def __init__(self, *, batch: int = BATCH, probe_seconds: float = PROBE_SECONDS):
        self.batch = batch
        self.probe_seconds = probe_seconds

    def idle_seconds(self) -> float:
        return IDLE_SECONDS

    def step(self, *, probe: bool | None = None) -> bool:
        start = IncidentCursor.objects.filter(id=1).values_list("watermark", "probed_at").first()
        if start is None:
            with transaction.atomic():
                start = (_cursor().watermark, None)
        now = db_now()
        due = probe if probe is not None else (
            start[1] is None or (now - start[1]).total_seconds() >= self.probe_seconds)
        facts = read_facts(start[0], now, batch=self.batch, probe=due)
        taken = facts.events
        with transaction.atomic():
            cursor = _cursor()
            if (cursor.watermark, cursor.probed_at) != start:
                return True  # another loop's pass went first: read again from where it stopped
            p = Pass(now, facts)
            if taken:
                sids = apply_events(p, taken, facts.runs)
                p.save(sids)
                cursor.watermark = taken[-1][0]
            if due or p.dead_by_tenant:
                check_dead_growth(now, dict(p.dead_by_tenant), facts)
            if due:
                probe_missed(now, facts)
                cursor.probed_at = now
            if taken or due:  # an idle pass between probes writes nothing (SQLite has one writer)
                cursor.updated_at = now
                cursor.save()
        return len(taken) == self.batch


def drain(evaluator: IncidentEvaluator | None = None, **kwargs) -> None:
    evaluator = evaluator or IncidentEvaluator()
    while evaluator.step(**kwargs):
        pass


# --- what people do to incidents (the API, the portal and the admin call these) ---------------


@transaction.atomic
def acknowledge_incident(incident_id, *, tenant_id, by: Actor) -> Incident:
    inc = Incident.objects.select_for_update().filter(id=incident_id, tenant_id=tenant_id).first()
    if inc is None:
        raise Incident.DoesNotExist
    if inc.state != IncidentState.OPEN:
        raise Conflict(f"this incident is {inc.state}", state=inc.state)
    inc.state, inc.acknowledged_at, inc.acknowledged_by = IncidentState.ACKNOWLEDGED, db_now(), by.name
    inc.save(update_fields=["state", "acknowledged_at", "acknowledged_by"])
    audit(AuditAction.INCIDENT_ACKNOWLEDGE, by=by, obj_type="incident", obj_id=inc.id, tenant_id=tenant_id,
          before={"state": IncidentState.OPEN}, after={"state": inc.state})
    return inc


@transaction.atomic
def resolve_incident(incident_id, *, tenant_id, by: Actor) -> Incident:
    """Resolve by hand (the condition may still hold: the next occurrence then opens a new one)."""
    inc = Incident.objects.select_for_update().filter(id=incident_id, tenant_id=tenant_id).first()
    if inc is None:
        raise Incident.DoesNotExist
    if inc.state == IncidentState.RESOLVED:
        raise Conflict("this incident is already resolved", state=inc.state)
    before = inc.state
    now = db_now()
    inc.state, inc.resolved_at, inc.resolved_by = IncidentState.RESOLVED, now, by.name
    inc.save(update_fields=["state", "resolved_at", "resolved_by"])
    if inc.rule == IncidentRule.CONSECUTIVE_FAILURES and inc.schedule_id:
        # A new incident needs a new streak of N, not the next single failure.
        FailureStreak.objects.filter(schedule_id=inc.schedule_id).delete()
    audit(AuditAction.INCIDENT_RESOLVE, by=by, obj_type="incident", obj_id=inc.id, tenant_id=tenant_id,
          before={"state": before}, after={"state": inc.state})
    slug = Tenant.objects.filter(id=tenant_id).values_list("slug", flat=True).first()
    Notification.objects.bulk_create(notifications_for(inc, NotificationKind.INCIDENT_RESOLVED, tenant_slug=slug, now=now))
    return inc


@transaction.atomic
def send_test_notification(owner: Owner, *, by: Actor) -> list:
    """A test message on each of the owner's channels, delivered like any notification."""
    now = db_now()
    inc = Incident(id=None, tenant_id=owner.tenant_id, owner=owner, rule=IncidentRule.DEAD, state=IncidentState.OPEN,
                   summary=f"test notification for {owner.slug}", opened_at=now, last_seen_at=now)
    notes = notifications_for(inc, NotificationKind.INCIDENT_TEST, tenant_slug=owner.tenant.slug, now=now, owner=owner)
    for n in notes:
        n.incident = None
        n.payload = {**n.payload, "incident": None}
    Notification.objects.bulk_create(notes)
    audit(AuditAction.OWNER_TEST_NOTIFICATION, by=by, obj_type="owner", obj_id=owner.id, tenant_id=owner.tenant_id,
          after={"channels": [n.channel for n in notes]})
    return notes


@transaction.atomic
def set_policy(tenant: Tenant, rule: str, *, schedule_id=None, enabled: bool, threshold: float | None,
               by: Actor) -> IncidentPolicy:
    """A rule's setting for the tenant, or for one of its schedules (an override)."""
    policy, _ = IncidentPolicy.objects.select_for_update().get_or_create(
        tenant=tenant, schedule_id=schedule_id, rule=rule, defaults={"enabled": enabled, "threshold": threshold})
    before = {"enabled": policy.enabled, "threshold": policy.threshold}
    policy.enabled, policy.threshold = enabled, threshold
    policy.save(update_fields=["enabled", "threshold"])
    audit(AuditAction.INCIDENT_RULE_SET, by=by, obj_type="schedule" if schedule_id else "tenant",
          obj_id=schedule_id or tenant.id, tenant=tenant, before={"rule": rule, **before},
          after={"rule": rule, "enabled": enabled, "threshold": threshold})
    return policy
