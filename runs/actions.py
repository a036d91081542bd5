"""Every change a person or a client asks for: create, edit, pause, resume, archive, trigger now
and backfill a schedule; retry and cancel a run; and their bulk forms. The API, the portal, the
admin and the commands call these, and nothing else writes what they write.

Which module owns which change:
- here, `runs.actions`: every requested change. Each is the one entry point for its change; a
  schedule change takes the schedule row lock first, the lock the scanner takes, so none races a
  scan of the same schedule, and one that ends a version's run of occurrences also cancels or
  records that version's runs. Each writes through the store (`runs.store`, its
  `RequestedChanges` methods), never with the ORM itself.
- `runs.queue`: every change a loop makes (scanner, claims, results, reconciler), in batches.
- `schedules.services`: the schedule helpers these use (validating fields, quotas, the audit log),
  which know nothing of runs; `schedules.tenants`: tenants, their target allowlists, webhooks and
  API keys.
"""

import uuid
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import prefetch_related_objects

from runs.decisions import MAX_OCCURRENCES_PER_PASS, build_run, event, manual_occurrence
from runs.models import EventKind, Reason, Run, RunKind, RunState
from runs.queue import insert_runs, release_buffered
from runs.store import store
from scheduler_project.foundation.dbclock import db_now
from scheduler_project.foundation.errors import Conflict, EditConflict, ServiceError, StaleVersion, ValidationFailed
from scheduler_project.foundation.newrows import new_row
from scheduler_project.foundation.notify import RUNS_CHANNEL, SCHEDULES_CHANNEL, notify
from schedules import timeexpr
from schedules.models import AuditAction, AuditEntry, Schedule, ScheduleStatus, ScheduleVersion, Tenant, shard_bucket
from schedules.occurrences import ONE_US, walk
from schedules.services import (
    VERSIONED_DEFAULTS,
    Actor,
    anchor_for,
    audit,
    audit_entry,
    check_quotas,
    first_run_at,
    jsonable,
    quota_locks,
    quota_refusals,
    rule_for,
    validate_fields,
    version_fields,
    with_spread_offset,
)
from schedules.targets import host_key, target_host

# An owner argument not given: create takes the tenant's default owner, edit leaves it.
UNSET = object()


def _owner_id(tenant: Tenant, owner):
    if owner is UNSET:
        return tenant.default_owner_id
    if owner is not None and owner.tenant_id != tenant.id:
        raise ValidationFailed({"owner": ["not an owner of this tenant"]})
    return owner.id if owner is not None else None


def _new_schedule(tenant: Tenant, fields: dict, rule, *, by: Actor, enabled: bool, now: datetime, owner=UNSET,
                  firsts: dict | None = None):
    """The unsaved schedule and its version 1 for validated `fields`. The schedule's id is made here,
    so the version can point at it before either row exists (both foreign keys are checked at
    commit): the schedule is then inserted once, with its current version already set. `firsts`:
    a batch's first instants by rule and bounds (a rule shared through validate_fields' `rules`
    has one first instant after the batch's `now`)."""
    if firsts is None:
        next_at = check_fires(rule, fields, now=now)
    else:
        # By the rule's identity: the batch's `rules` keeps every rule alive until it ends.
        key = (id(rule), fields.get("start_at"), fields.get("end_at"))
        if key not in firsts:
            firsts[key] = check_fires(rule, fields, now=now)
        next_at = firsts[key]
    sid = uuid.uuid4()
    version = new_row(ScheduleVersion, schedule_id=sid, version=1, created_by=by.name, changes={},
                      **with_spread_offset(fields, sid))
    schedule = new_row(Schedule, id=sid, tenant=tenant, name=fields["name"], enabled=enabled,
                       anchor_at=anchor_for(fields, now), shard=shard_bucket(sid), owner_id=_owner_id(tenant, owner))
    if owner is not UNSET and owner is not None:
        schedule.owner = owner  # the answer shows its slug without reading it again
    # Created paused: nothing is due until it is resumed, which computes from that moment.
    schedule.next_run_at = next_at if enabled else None
    schedule.paused_at = None if enabled else now
    return schedule, version


def check_fires(rule, fields: dict, *, now: datetime):
    """A new schedule's first due instant; refused when there is none."""
    next_at = first_run_at(rule, fields, after=now)
    if next_at is None:
        if rule.kind == "at":
            # A one-time at() in the past: nothing will ever fire; say so instead of storing a dead rule.
            raise ValidationFailed({"expression": ["this at() time is already past"]})
        raise ValidationFailed({"expression": ["this rule never fires within startAt/endAt"]})
    return next_at


def _created_entry(schedule: Schedule, fields: dict, *, tenant: Tenant, by: Actor) -> AuditEntry:
    after = jsonable(fields)
    if schedule.owner_id:
        after["owner_id"] = str(schedule.owner_id)
    return audit_entry(AuditAction.SCHEDULE_CREATE, by=by, obj_type="schedule", obj_id=schedule.id, tenant=tenant,
                       after=after)


def _wake_scanners_for(schedules, now: datetime) -> None:
    """Scanners poll every SCHEDULER_POLL_SECONDS and make runs SCHEDULER_HORIZON_SECONDS ahead;
    a schedule first due later than that is found by their polling, so only one due sooner needs
    the wake-up."""
    soon = now + timedelta(seconds=settings.SCHEDULER_HORIZON_SECONDS + 2 * settings.SCHEDULER_POLL_SECONDS)
    if any(s.next_run_at is not None and s.next_run_at <= soon for s in schedules):
        notify(SCHEDULES_CHANNEL)


def create_schedule(tenant: Tenant, given: dict, *, by: Actor, enabled: bool = True, now: datetime,
                    owner=UNSET) -> Schedule:
    """Validate and store a new schedule at version 1 with its first due instant: two inserts and
    the audit entry. The inserts are atomic by themselves (store.schedule_insert); only a quota
    near its limit, whose tenant lock must be held until they commit, needs a transaction around
    them, so a create far from every limit costs no BEGIN and COMMIT round trips."""
    fields = {**VERSIONED_DEFAULTS, **given}
    rule = validate_fields(tenant, fields, now=now, quotas=False)
    schedule, version = _new_schedule(tenant, fields, rule, by=by, enabled=enabled, now=now, owner=owner)
    entry = _created_entry(schedule, fields, tenant=tenant, by=by)
    with transaction.atomic() if quota_locks(tenant, [fields["sub_minute"]]) else nullcontext():
        check_quotas(tenant, sub_minute=fields["sub_minute"], schedule=None)
        store().schedule_insert(schedule, version, entry)
    _wake_scanners_for([schedule], now)
    return schedule


# Most schedules one create_schedules call takes (the API's batch endpoint).
MAX_BATCH = 1000


@transaction.atomic
def create_schedules(tenant: Tenant, items: list, *, by: Actor, now: datetime) -> list:
    """Create many schedules at once (at most MAX_BATCH), each validated exactly as create_schedule
    validates one, in one transaction. `items` are the service's field dicts (as create_schedule's
    `given`), each with an optional "enabled" (default True) and "managed_name". Returns, per item in order, the
    stored Schedule or the ServiceError that refused it (ValidationFailed, PayloadTooLarge);
    refusing one item does not refuse the others.

    Steps, in this order because each depends on the one before:
    1. Validate every item (fields, rule, allowlist: the tenant's prefixes are read once).
    2. Apply the quotas to the valid items as a whole (one count per quota).
    3. Insert the versions (their ids taken first), then the schedules with their current version
       set, then the audit entries: one bulk insert each (COPY on PostgreSQL), whatever the batch size.
    """
    if len(items) > MAX_BATCH:
        raise ValidationFailed({"schedules": [f"at most {MAX_BATCH} schedules per request; this one has {len(items)}"]})
    # The allowlist is read once for all items; the quotas are applied to the batch as a whole below.
    if tenant.known_prefixes is None:
        prefetch_related_objects([tenant], "targets")
    results: list = []
    valid = []
    rules: dict = {}  # the batch's parsed rules, by what they were parsed from (validate_fields)
    firsts: dict = {}  # their first instants (_new_schedule)
    for index, given in enumerate(items):
        given = dict(given)
        enabled = given.pop("enabled", True)
        managed_name = given.pop("managed_name", None)  # a schedule set's (runs.schedule_apply)
        owner = given.pop("owner", UNSET)
        fields = {**VERSIONED_DEFAULTS, **given}
        try:
            rule = validate_fields(tenant, fields, now=now, quotas=False, rules=rules)
            made = _new_schedule(tenant, fields, rule, by=by, enabled=enabled, now=now, owner=owner, firsts=firsts)
            made[0].managed_name = managed_name
            results.append((fields, made))
            valid.append((index, fields))
        except ServiceError as exc:
            results.append(exc)
    for i, exc in quota_refusals(tenant, [fields["sub_minute"] for _, fields in valid]).items():
        results[valid[i][0]] = exc
    made = [r for r in results if not isinstance(r, ServiceError)]
    if made:
        versions = [v for _, (_, v) in made]
        store().rows_insert_new(ScheduleVersion, versions, need_ids=True)
        for (_, (schedule, _)), version in zip(made, versions):
            schedule.current = version
        store().rows_insert_new(Schedule, [s for _, (s, _) in made])
        store().rows_insert_new(AuditEntry, [_created_entry(s, fields, tenant=tenant, by=by) for fields, (s, _) in made])
        _wake_scanners_for([s for _, (s, _) in made], now)
    return [r if isinstance(r, ServiceError) else r[1][0] for r in results]


def _locked(schedule) -> Schedule:
    sid = getattr(schedule, "id", schedule)
    locked = Schedule.objects.select_for_update(of=("self",)).select_related("current", "tenant").get(id=sid)
    if locked.current_id is not None and getattr(locked.current, "id", None) != locked.current_id:
        # PostgreSQL, after waiting for the lock of a schedule another change was editing, returns
        # the schedule row as that change committed it, but its joined version from the snapshot
        # the statement began with, where the new version does not exist yet: read it again.
        locked.current = ScheduleVersion.objects.get(id=locked.current_id)
    return locked


def _require_live(schedule: Schedule) -> None:
    if schedule.status == ScheduleStatus.ARCHIVED:
        raise Conflict("this schedule is archived", status=schedule.status)


def _record_unmaterialised(schedule: Schedule, *, now: datetime, reason: str) -> int:
    """Occurrences of the current version that were already due but not yet materialised (the
    scanner is behind, or was down) when an edit, pause or archive ends that version's run of
    occurrences. Had the scanner been on time they would be runs now, canceled by this very
    change; so they are recorded as exactly that (canceled with its reason, or skipped for a DST
    drop) instead of vanishing. Call it before the change moves next_run_at."""
    if not (schedule.enabled and schedule.status == ScheduleStatus.ACTIVE and schedule.next_run_at):
        return 0
    if schedule.next_run_at > now:
        return 0
    version = schedule.current
    try:
        rule = rule_for(version, schedule.anchor_at)
        span = walk(rule, version, after=schedule.next_run_at - ONE_US, until=now, limit=MAX_OCCURRENCES_PER_PASS)
    except timeexpr.ExpressionError:
        # A rule the engine cannot evaluate (the scanner parked it) made no occurrences to record;
        # the change itself must still go through.
        return 0
    triples = []
    for occ in span.occurrences:
        state, why = (RunState.SKIPPED, Reason.DST) if occ.dropped else (RunState.CANCELED, reason)
        triples.append(build_run(schedule, version, occ, state=state, reason=why, eligible_at=None,
                                 kind=RunKind.SCHEDULED, now=now))
    return len(insert_runs(triples))


def fields_changed(before: dict, after: dict) -> dict:
    """{field: (before, after)} for each versioned field that differs."""
    return {k: (before.get(k), after.get(k)) for k in VERSIONED_DEFAULTS if before.get(k) != after.get(k)}


def _version_fields(schedule: Schedule, number) -> dict | None:
    """The fields of one of the schedule's versions, or None if it never had that version."""
    version = ScheduleVersion.objects.filter(schedule_id=schedule.id, version=number).first() \
        if isinstance(number, int) else None
    return version_fields(version) if version else None


@dataclass(frozen=True)
class Merged:
    """What a merged edit did: `mine`, the fields written (the editor changed them from the version
    they loaded, to values the current version does not already have); `kept`, the fields others
    changed since, left as they are now."""

    base_version: int
    mine: tuple
    kept: tuple


@transaction.atomic
def edit_schedule(schedule, *, expected_version: int, changes: dict, enabled: bool | None = None, by: Actor,
                  merge: bool = False, owner=UNSET) -> Schedule:
    """Apply an edit made against `expected_version`. A change to any versioned field makes a new
    immutable version and cancels the older versions' runs that have not started (superseded);
    runs already leased or waiting to retry finish under their own version.

    A stale `expected_version` (someone saved in between) is refused with StaleVersion, which
    says field by field what changed since. With `merge` (a form that posts every field as its
    editor saw them), it is merged three ways instead: base = the expected version, theirs = the
    current one, mine = `changes`. Only the fields the editor changed from the base are written,
    so a colleague's change to another field stays; a field both changed to different values
    raises EditConflict and saves nothing (the editor must choose). The merge is recorded on the
    returned schedule as `schedule.merged` (a Merged), None when the edit was not stale.

    A new `owner` (an Owner of the tenant, or None for none) is metadata: no version, an audit
    entry (schedule.owner)."""
    schedule = _locked(schedule)
    _require_live(schedule)
    current = version_fields(schedule.current)
    schedule.merged = None
    if expected_version != schedule.version:
        base = _version_fields(schedule, expected_version)
        theirs = fields_changed(base, current) if base is not None else None
        if not merge or base is None:
            raise StaleVersion(schedule.version, expected_version=expected_version, changed_since=theirs)
        mine = {k: v for k, v in changes.items() if k in VERSIONED_DEFAULTS and base.get(k) != v}
        conflicts = {k: {"base": base[k], "theirs": current[k], "mine": v}
                     for k, v in mine.items() if k in theirs and v != current[k]}
        if conflicts:
            raise EditConflict(schedule.version, expected_version=expected_version, changed_since=theirs,
                               conflicts=conflicts)
        changes = mine
    now = db_now()
    real = {k: v for k, v in changes.items() if current.get(k) != v}
    if expected_version != schedule.version:
        schedule.merged = Merged(expected_version, tuple(real), tuple(k for k in theirs if k not in real))
    if owner is not UNSET:
        _set_owner(schedule, owner, by=by)
    if real:
        # Cancel first, then read the clock the new version starts from. A worker may claim an
        # old version's run meanwhile (claims do not take the schedule's lock): once the cancel
        # has gone through, every old run left is one claimed at or after its instant, so none
        # is after `now`. With the clock read first, a run claimed between the two, for an
        # instant after that reading, was made again by the new version: two deliveries (found
        # by bench/soak.py; tests/core/test_an_edit_racing_a_claim_makes_one_run_per_instant.py).
        cancel_unstarted(schedule.id, reason=Reason.SUPERSEDED, versions_below=schedule.version + 1)
        now = db_now()
        _record_unmaterialised(schedule, now=now, reason=Reason.SUPERSEDED)
        write_new_version(schedule, real, by=by, now=now)
    if enabled is False and schedule.enabled:
        _pause(schedule, by=by, now=now)
    elif enabled is True and not schedule.enabled:
        _resume(schedule, by=by, now=now)
    return schedule


def write_new_version(schedule: Schedule, changed: dict, *, by: Actor, now: datetime) -> ScheduleVersion:
    """Append version N+1 with `changed` applied to the current fields; the caller holds the
    schedule row lock and has checked expectedVersion."""
    before = version_fields(schedule.current)
    fields = {**before, **changed}
    rule = validate_fields(schedule.tenant, fields, now=now, schedule=schedule)
    diff = {k: [jsonable({k: before[k]})[k], jsonable({k: fields[k]})[k]] for k in changed if before[k] != fields[k]}
    version = ScheduleVersion(schedule=schedule, version=schedule.version + 1, created_by=by.name, changes=diff,
                              **with_spread_offset(fields, schedule.id))
    schedule.name = fields["name"]
    if fields.get("start_at") or before.get("start_at"):
        schedule.anchor_at = anchor_for(fields, schedule.created_at)
    # Otherwise the anchor stays the one the create took (the database's clock then; created_at is
    # this process's clock at the save, a few milliseconds off): an edit of a rate() schedule's
    # payload moved all its instants by that much, so the instants the scanner had made no longer
    # matched the rule (found by bench/soak.py). The rule may have changed its anchor (startAt):
    # recompute the rule against it.
    rule = rule_for(version, schedule.anchor_at)
    # The new version starts from the moment of the edit: its first occurrence is the first
    # instant after now (and at or after startAt), never one the old version already covered.
    # A paused schedule gets its next instant when it is resumed.
    schedule.next_run_at = first_run_at(rule, fields, after=now) if schedule.enabled else None
    if schedule.enabled and schedule.status != ScheduleStatus.ARCHIVED:
        if schedule.next_run_at is None:
            # e.g. endAt moved into the past, or an at() edited to a past time: nothing will fire.
            if schedule.status != ScheduleStatus.COMPLETED:
                schedule.status, schedule.completed_at = ScheduleStatus.COMPLETED, now
        else:
            schedule.status, schedule.completed_at = ScheduleStatus.ACTIVE, None
    store().version_insert(schedule, version)
    audit(
        AuditAction.SCHEDULE_EDIT,
        by=by,
        obj_type="schedule",
        obj_id=schedule.id,
        tenant=schedule.tenant,
        before=jsonable(before),
        after=jsonable(fields),
    )
    return version


def _set_owner(schedule: Schedule, owner, *, by: Actor) -> None:
    new_id = _owner_id(schedule.tenant, owner)
    if new_id == schedule.owner_id:
        return
    before = {"owner": schedule.owner.slug if schedule.owner_id else None}
    store().schedule_set_owner(schedule.id, new_id)
    schedule.owner = owner
    audit(AuditAction.SCHEDULE_OWNER, by=by, obj_type="schedule", obj_id=schedule.id, tenant_id=schedule.tenant_id,
          before=before, after={"owner": owner.slug if owner else None})


def _pause(schedule: Schedule, *, by: Actor, now: datetime) -> None:
    _record_unmaterialised(schedule, now=now, reason=Reason.PAUSED)
    store().schedule_set_paused(schedule, now=now)
    canceled = cancel_unstarted(schedule.id, reason=Reason.PAUSED)
    audit(AuditAction.SCHEDULE_PAUSE, by=by, obj_type="schedule", obj_id=schedule.id, tenant_id=schedule.tenant_id,
          before={"enabled": True}, after={"enabled": False, "canceledRuns": canceled})


def _resume(schedule: Schedule, *, by: Actor, now: datetime) -> None:
    """The next occurrence is computed from the moment of resume: the paused interval is not
    replayed (a backfill does that on purpose)."""
    next_at = schedule.next_run_at
    if schedule.status == ScheduleStatus.ACTIVE:
        try:
            rule = rule_for(schedule.current, schedule.anchor_at)
            next_at = first_run_at(rule, version_fields(schedule.current), after=now)
        except timeexpr.ExpressionError as e:
            raise ValidationFailed({"expression": [f"cannot resume: {e}; edit the expression first"]})
    store().schedule_set_resumed(schedule, next_run_at=next_at, completed_at=now)
    notify(SCHEDULES_CHANNEL)
    audit(AuditAction.SCHEDULE_RESUME, by=by, obj_type="schedule", obj_id=schedule.id, tenant_id=schedule.tenant_id,
          before={"enabled": False}, after={"enabled": True, "nextRunAt": schedule.next_run_at and schedule.next_run_at.isoformat()})


@transaction.atomic
def pause_schedule(schedule, *, by: Actor) -> Schedule:
    schedule = _locked(schedule)
    _require_live(schedule)
    if schedule.enabled:
        _pause(schedule, by=by, now=db_now())
    return schedule


@transaction.atomic
def resume_schedule(schedule, *, by: Actor) -> Schedule:
    schedule = _locked(schedule)
    _require_live(schedule)
    if not schedule.enabled:
        _resume(schedule, by=by, now=db_now())
    return schedule


@transaction.atomic
def archive_schedule(schedule, *, by: Actor) -> Schedule:
    """No new occurrences; history kept; runs that have not started are canceled."""
    schedule = _locked(schedule)
    if schedule.status == ScheduleStatus.ARCHIVED:
        return schedule
    now = db_now()
    _record_unmaterialised(schedule, now=now, reason=Reason.ARCHIVED)
    store().schedule_set_archived(schedule, now=now)
    canceled = cancel_unstarted(schedule.id, reason=Reason.ARCHIVED)
    audit(AuditAction.SCHEDULE_ARCHIVE, by=by, obj_type="schedule", obj_id=schedule.id, tenant_id=schedule.tenant_id,
          after={"canceledRuns": canceled})
    return schedule


@transaction.atomic
def trigger_schedule(schedule, *, by: Actor) -> Run:
    """A manual run now; its identity is the trigger's instant (database clock)."""
    schedule = _locked(schedule)
    _require_live(schedule)
    now = db_now()
    version = schedule.current
    triple = build_run(schedule, version, manual_occurrence(version, now), state=RunState.READY, reason="",
                       eligible_at=now, kind=RunKind.MANUAL, now=now)
    made = insert_runs([triple])
    if not made:
        raise Conflict("a run for this instant already exists; try again")
    audit(AuditAction.SCHEDULE_TRIGGER, by=by, obj_type="schedule", obj_id=schedule.id, tenant_id=schedule.tenant_id,
          after={"runId": str(made[0].id)})
    return made[0]


def plan_backfill(schedule: Schedule, start: datetime, end: datetime) -> tuple[list, int]:
    """The occurrences a backfill of [start, end) would make under the current version, leaving
    out instants that already have a run of any version; and how many the rule has in all.

    The range is first narrowed to when the schedule was meant to fire and could have: its
    startAt/endAt bounds, and now (a future occurrence is the scanner's to make, at its time; a
    backfill would run it early). Instants the DST policy drops are not made."""
    if end <= start:
        raise ValidationFailed({"to": ["'to' must be after 'from'"]})
    limit = settings.SCHEDULER_MAX_BACKFILL
    version = schedule.current
    start = max(start, version.start_at) if version.start_at else start
    end = min(end, version.end_at) if version.end_at else end
    end = min(end, db_now())
    if end <= start:
        return [], 0
    try:
        rule = rule_for(version, schedule.anchor_at)
        span = walk(rule, version, after=start - ONE_US, until=end, inclusive=False, limit=limit + 1,
                    count_dropped=False)
    except timeexpr.ExpressionError as e:
        raise ValidationFailed({e.field: [str(e)]})
    occs = [o for o in span.occurrences if not o.dropped]
    if len(occs) > limit:
        raise ValidationFailed(
            {"to": [f"this range has more than {limit} occurrences (SCHEDULER_MAX_BACKFILL); backfill a shorter range"]}
        )
    existing = store().run_existing_instants(schedule.id, start, end)
    return [o for o in occs if o.at not in existing], len(occs)


@transaction.atomic
def backfill_schedule(schedule, *, start: datetime, end: datetime, by: Actor) -> int:
    """Materialise every occurrence of the rule in [start, end) that has no run yet, as runs
    ready now. Bounded by SCHEDULER_MAX_BACKFILL; never a second run for an instant."""
    schedule = _locked(schedule)
    _require_live(schedule)
    now = db_now()
    todo, _ = plan_backfill(schedule, start, end)
    triples = [
        build_run(schedule, schedule.current, o, state=RunState.READY, reason="", eligible_at=now,
                  kind=RunKind.BACKFILL, now=now)
        for o in todo
    ]
    made = insert_runs(triples)
    audit(AuditAction.SCHEDULE_BACKFILL, by=by, obj_type="schedule", obj_id=schedule.id, tenant_id=schedule.tenant_id,
          after={"from": start.isoformat(), "to": end.isoformat(), "runs": len(made)})
    return len(made)



# --- shaping a surge: one spread window for many schedules ---------------------------------------

# Most schedules one bulk spread changes (each is an edit: a version, the superseded runs'
# cancellation); a larger selection is refused, to be applied in parts.
MAX_BULK_SPREAD = 5_000


def schedules_for_spread(tenant: Tenant, *, host: str | None = None, expression: str | None = None,
                         without_window: int | None = None) -> list:
    """A tenant's active schedules, optionally only those calling one target host ("host:port")
    and/or with one expression (as written), in id order: the selection of a bulk spread. At most
    MAX_BULK_SPREAD + 1 are read, so a caller can tell a selection that is too large.
    `without_window`: leave out those that have this window already, so a selection larger than
    one bulk change is applied in parts, each taking the next ones."""

    host = (host_key(host) or host) if host else None  # as typed (`[::1]:9000`) to as kept (`::1:9000`)
    qs = Schedule.objects.filter(tenant=tenant, status=ScheduleStatus.ACTIVE).select_related("current")
    if expression:
        qs = qs.filter(current__expression=expression)
    if without_window is not None:
        qs = qs.exclude(current__spread_seconds=without_window)
    out = []
    for s in qs.order_by("id").iterator(chunk_size=2000):
        if host and target_host(s.current.target_url) != host:
            continue
        out.append(s)
        if len(out) > MAX_BULK_SPREAD:
            break
    return out


@transaction.atomic
def spread_schedules(tenant: Tenant, schedules: list, window: int, *, by: Actor, selection: dict | None = None) -> dict:
    """Give every one of `schedules` (of `tenant`) the spread window `window`, as one change: each
    schedule through edit_schedule (a new version, as any edit), all in one transaction, and one
    audit entry for the whole with what was selected. A schedule whose rule the window does not
    fit (schedules.spread.spread_problem), or that changed meanwhile, is left as it is and listed
    with the reason; the others are changed. Returns {"changed": [ids], "refused": {id: reason}}."""
    if len(schedules) > MAX_BULK_SPREAD:
        raise ValidationFailed({"schedules": [f"at most {MAX_BULK_SPREAD} schedules per bulk spread; this selection "
                                              f"has more: narrow it (target, expression) or apply it in parts"]})
    if any(s.tenant_id != tenant.id for s in schedules):
        raise ValidationFailed({"schedules": ["every schedule of a bulk spread must be of its tenant"]})
    changed, refused, unchanged = [], {}, 0
    for s in schedules:
        if s.current.spread_seconds == window:
            unchanged += 1
            continue
        try:
            with transaction.atomic():  # a savepoint: a refused one leaves the others' edits in place
                edit_schedule(s, expected_version=s.version, changes={"spread_seconds": window}, by=by)
            changed.append(str(s.id))
        except ValidationFailed as e:
            refused[str(s.id)] = " ".join(e.errors.get("spreadSeconds") or [str(e)])
        except (StaleVersion, Conflict) as e:
            refused[str(s.id)] = e.message
    audit(AuditAction.SCHEDULE_BULK_SPREAD, by=by, obj_type="tenant", obj_id=tenant.id, tenant_id=tenant.id,
          after={"spreadSeconds": window, "selection": selection or {}, "changed": len(changed),
                 "unchanged": unchanged, "refused": refused, "schedules": changed})
    return {"changed": changed, "refused": refused, "unchanged": unchanged}


# --- runs: retry and cancel ----------------------------------------------------------------------

RETRYABLE_FROM = (RunState.DEAD, RunState.CANCELED)
CANCELABLE_FROM = (RunState.READY, RunState.LEASED)


def _locked_run(run_or_id) -> Run:
    run_id = getattr(run_or_id, "id", run_or_id)
    return Run.objects.select_for_update().get(id=run_id)


@transaction.atomic
def retry_run(run, *, by: Actor) -> Run:
    """dead | canceled -> ready now. Keeps the run id (the idempotency key); the next attempt gets
    the next generation and a fresh retry budget."""
    run = _locked_run(run)
    if run.state not in RETRYABLE_FROM:
        raise Conflict(f"only dead or canceled runs can be retried; this run is {run.state}", state=run.state)
    before = run.state
    now = db_now()
    store().run_set_retried(run, by=by.name, now=now)
    store().event_insert_many([event(run.id, run.tenant_id, EventKind.RETRIED, state=RunState.READY, by=by.name)], now=now)
    notify(RUNS_CHANNEL)
    audit(AuditAction.RUN_RETRY, by=by, obj_type="run", obj_id=run.id, tenant_id=run.tenant_id,
          before={"state": before}, after={"state": RunState.READY})
    return run


@transaction.atomic
def cancel_run(run, *, by: Actor, reason: str = Reason.CANCELED) -> Run:
    """ready | leased -> canceled. A leased run's worker learns of it at its next heartbeat and
    abandons the call; whatever it reports later is fenced and kept only as evidence."""
    run = _locked_run(run)
    if run.state not in CANCELABLE_FROM:
        raise Conflict(f"only ready or leased runs can be canceled; this run is {run.state}", state=run.state)
    before = run.state
    now = db_now()
    store().run_set_canceled(run, reason=reason, by=by.name, now=now)
    store().event_insert_many([event(run.id, run.tenant_id, EventKind.CANCELED, state=RunState.CANCELED, reason=reason,
                                     inFlight=before == RunState.LEASED, by=by.name)], now=now)
    audit(AuditAction.RUN_CANCEL, by=by, obj_type="run", obj_id=run.id, tenant_id=run.tenant_id,
          before={"state": before}, after={"state": RunState.CANCELED, "reason": reason})
    # A run buffered behind this one (overlap buffer_one) may start now.
    release_buffered({run.schedule_id}, now)
    return run


def cancel_unstarted(schedule_id, *, reason: str, versions_below: int | None = None) -> int:
    """Cancel a schedule's runs that have not started (ready, never attempted) in one statement,
    with their events: used by pause (reason paused), edit (superseded) and archive."""
    return store().run_cancel_unstarted(schedule_id, now=db_now(), reason=reason, versions_below=versions_below)


# --- bulk forms ----------------------------------------------------------------------------------


@dataclass
class Bulk:
    """What a bulk change did: the items it changed, and each item it refused with the reason."""

    done: list
    refused: list  # [(item, message)]


def apply_each(change, items, *, by: Actor) -> Bulk:
    """The bulk form of a requested change: `change` (retry_run, pause_schedule, ...) applied to
    each item in its own transaction, so one that changed state meanwhile is refused and reported,
    not fatal to the others. The portal's DLQ and the admin's actions call this."""
    bulk = Bulk(done=[], refused=[])
    for item in items:
        try:
            change(item, by=by)
            bulk.done.append(item)
        except ServiceError as e:
            bulk.refused.append((item, e.message))
    return bulk


def retry_runs(runs, *, by: Actor) -> Bulk:
    return apply_each(retry_run, runs, by=by)


def cancel_runs(runs, *, by: Actor) -> Bulk:
    return apply_each(cancel_run, runs, by=by)


def pause_schedules(schedules, *, by: Actor) -> Bulk:
    return apply_each(pause_schedule, schedules, by=by)


def resume_schedules(schedules, *, by: Actor) -> Bulk:
    return apply_each(resume_schedule, schedules, by=by)


def archive_schedules(schedules, *, by: Actor) -> Bulk:
    return apply_each(archive_schedule, schedules, by=by)
