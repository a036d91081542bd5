"""Apply a declared set of schedules: the API's POST /api/v1/schedules/apply and
`manage.py apply_schedules` (docs/api.md, "Schedules as code").

A tenant declares its schedules by a stable name (each item's `name`). Apply manages only the
schedules it made, whose `managed_name` is that name, and the ones a set adopts explicitly (an item
with `adopt: <schedule id>` takes an existing schedule of the tenant that no set manages yet under
the item's name); every other schedule of the tenant is left alone, whatever its name.

The plan says, per declared schedule, create, adopt, edit (with the field-by-field diff) or
unchanged, and with `prune`, archive for each managed schedule the set no longer names. The plan
is made and carried out in one transaction, under the tenant's row lock (on SQLite the
transaction's own write lock), so two applies of one tenant run one after the other and the second
plans against what the first made; the partial unique index on (tenant, managed_name) keeps any
other path from making a second live schedule of a name. Every change goes through its one entry
point (create_schedules, edit_schedule, archive_schedule), which writes the versions and each
schedule's own audit entry; one more `schedule.apply` entry records the plan as a whole. A set
that changes nothing writes nothing.
"""

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from django.conf import settings
from django.db import IntegrityError, transaction

from runs import actions
from runs.store import store
from scheduler_project.foundation.dbclock import db_now
from scheduler_project.foundation.errors import Conflict, PayloadTooLarge, ServiceError, ValidationFailed
from schedules.models import AuditAction, Schedule, ScheduleStatus, Tenant
from schedules.services import (
    VERSIONED_DEFAULTS,
    Actor,
    audit,
    default_timeout_seconds,
    jsonable,
    quota_refusals,
    validate_fields,
    version_fields,
)

# The API's name of each versioned field, for the plan's diffs.
FIELD_NAMES = {
    "name": "name", "expression": "expression", "time_zone": "timeZone", "payload": "payload",
    "target_url": "target.url", "target_method": "target.method", "target_headers": "target.headers",
    "target_timeout_seconds": "target.timeoutSeconds", "misfire_policy": "misfirePolicy",
    "catchup_limit": "catchupLimit", "misfire_grace_seconds": "misfireGraceSeconds",
    "overlap_policy": "overlapPolicy", "max_attempts": "retryPolicy.maxAttempts",
    "backoff_base_seconds": "retryPolicy.backoffBaseSeconds", "backoff_max_seconds": "retryPolicy.backoffMaxSeconds",
    "dst_skipped": "dstPolicy.skipped", "dst_repeated": "dstPolicy.repeated", "start_at": "startAt", "end_at": "endAt",
    "spread_seconds": "spreadSeconds",
}


def max_set_size() -> int:
    return settings.SCHEDULER_MAX_APPLY_SCHEDULES


class Action(StrEnum):
    CREATE = "create"
    ADOPT = "adopt"  # an existing schedule taken into the set (and edited, if its fields differ)
    EDIT = "edit"
    UNCHANGED = "unchanged"
    ARCHIVE = "archive"  # managed, no longer declared, and `prune` was asked for


@dataclass
class Declared:
    """One schedule of a set, as the caller parsed it: `fields` are the service's versioned fields
    given (the API's to_fields), `name` among them; `where` says where it was written (a file and
    its position), for error messages."""

    name: str
    fields: dict
    where: str
    enabled: bool | None = None  # None: left as it is
    adopt: object = None  # a schedule id


@dataclass
class Step:
    action: Action
    name: str
    where: str = ""
    schedule_id: object = None
    changes: dict = field(default_factory=dict)  # {API field: [before, after]}
    version: int | None = None  # the version the schedule is at (after the apply, when applied)
    # What carrying it out needs (not shown).
    schedule: Schedule | None = None
    desired: dict = field(default_factory=dict)
    enabled: bool | None = None

    def as_json(self) -> dict:
        out = {"action": str(self.action), "name": self.name,
               "id": str(self.schedule_id) if self.schedule_id else None, "version": self.version}
        if self.changes:
            out["changes"] = self.changes
        return out


@dataclass
class Plan:
    steps: list
    prune: bool
    # Managed schedules the set does not name, kept because `prune` was not asked for.
    not_declared: list = field(default_factory=list)
    applied: bool = False

    def counts(self) -> dict:
        return {str(a): sum(1 for s in self.steps if s.action == a) for a in Action}

    @property
    def changed(self) -> bool:
        return any(s.action != Action.UNCHANGED for s in self.steps)

    def as_json(self) -> dict:
        return {"applied": self.applied, "changed": self.changed, "prune": self.prune, "summary": self.counts(),
                "plan": [s.as_json() for s in self.steps], "notDeclared": self.not_declared}


def _errors_of(exc: ServiceError) -> dict:
    if isinstance(exc, ValidationFailed):
        return exc.errors
    if isinstance(exc, PayloadTooLarge):
        return {"payload": [exc.message]}
    return {"body": [exc.message]}


class _Errors:
    def __init__(self):
        self.found: dict[str, list[str]] = {}

    def add(self, where: str, name: str, field_name: str, message: str) -> None:
        label = f'schedule "{name}"' if name else "schedule"
        self.found.setdefault(f"{where}.{field_name}" if field_name else where, []).append(f"{label}: {message}")

    def raise_any(self) -> None:
        if self.found:
            raise ValidationFailed(self.found)


def _diff(current: dict, desired: dict) -> dict:
    changed = [k for k in VERSIONED_DEFAULTS if current[k] != desired[k]]
    if not changed:
        return {}
    before, after = jsonable({k: current[k] for k in changed}), jsonable({k: desired[k] for k in changed})
    return {FIELD_NAMES[k]: [before[k], after[k]] for k in changed}


def _lock_tenant(tenant: Tenant) -> None:
    """Applies of one tenant one after the other (SQLite: the IMMEDIATE transaction already is)."""
    Tenant.objects.select_for_update(no_key=True).filter(id=tenant.id).first()


def plan_set(tenant: Tenant, declared: list, *, prune: bool, now: datetime) -> Plan:
    """What applying `declared` would do, checking everything it can before anything is written:
    every item's fields as a create checks them, names unique in the set, adoptions, and the
    schedule quota against the set's creates less its archives. Raises ValidationFailed naming
    each item's place, its name and the field."""
    errors = _Errors()
    if len(declared) > max_set_size():
        raise ValidationFailed({"schedules": [
            f"at most {max_set_size()} schedules per set (SCHEDULER_MAX_APPLY_SCHEDULES); this one has {len(declared)}"]})
    seen: dict[str, str] = {}
    for d in declared:
        if not d.name:
            errors.add(d.where, "", "name", "every schedule of a set needs a name, its stable key")
        elif d.name in seen:
            errors.add(d.where, d.name, "name", f"this name is declared twice (also at {seen[d.name]})")
        else:
            seen[d.name] = d.where
    errors.raise_any()
    managed = {s.managed_name: s for s in Schedule.objects.filter(tenant=tenant, managed_name__isnull=False)
               .exclude(status=ScheduleStatus.ARCHIVED).select_related("current")}
    adopt_ids = {d.adopt for d in declared if d.adopt is not None}
    adoptable = {s.id: s for s in Schedule.objects.filter(tenant=tenant, id__in=adopt_ids).select_related("current")}
    if tenant.known_prefixes is None:
        # The allowlist, read once for every item (as a list: no queryset per item).
        tenant.known_prefixes = [t.prefix for t in tenant.targets.all()]
    default_timeout = default_timeout_seconds()
    steps = []
    for d in declared:
        desired = {**VERSIONED_DEFAULTS, **d.fields}
        if desired["target_timeout_seconds"] is None:
            desired["target_timeout_seconds"] = default_timeout
        existing = managed.get(d.name)
        # A spread left out is what a create would give: the tenant's default where it fits the
        # rule (validate_fields decides), so the shortcut below compares with that default.
        probe = desired if desired["spread_seconds"] is not None else {
            **desired, "spread_seconds": tenant.default_spread_seconds or 0}
        if (existing is not None and d.adopt in (None, existing.id)
                and (d.enabled is None or d.enabled == existing.enabled)
                and not _diff(version_fields(existing.current), probe)):
            # Exactly its stored version, which was checked when it was written: nothing to parse
            # (parsing every rule again was most of the time of a plan that changes nothing).
            steps.append(Step(Action.UNCHANGED, d.name, d.where, schedule_id=existing.id, version=existing.version,
                              schedule=existing))
            continue
        try:
            rule = validate_fields(tenant, desired, now=now, quotas=False)
        except ServiceError as exc:
            for field_name, messages in _errors_of(exc).items():
                for message in messages:
                    errors.add(d.where, d.name, field_name, message)
            continue
        action = Action.EDIT
        if d.adopt is not None and (existing is None or existing.id != d.adopt):
            target = adoptable.get(d.adopt)
            if target is None:
                errors.add(d.where, d.name, "adopt", f"no schedule {d.adopt} in this tenant")
                continue
            if target.status == ScheduleStatus.ARCHIVED:
                errors.add(d.where, d.name, "adopt", f"schedule {d.adopt} is archived")
                continue
            if target.managed_name is not None:
                errors.add(d.where, d.name, "adopt", f'schedule {d.adopt} is already managed as "{target.managed_name}"')
                continue
            if existing is not None:
                errors.add(d.where, d.name, "adopt", f"this name already manages schedule {existing.id}")
                continue
            existing, action = target, Action.ADOPT
        if existing is None:
            try:
                actions.check_fires(rule, desired, now=now)
            except ValidationFailed as exc:
                for field_name, messages in exc.errors.items():
                    for message in messages:
                        errors.add(d.where, d.name, field_name, message)
                continue
            steps.append(Step(Action.CREATE, d.name, d.where, desired=desired, enabled=d.enabled))
            continue
        current = version_fields(existing.current)
        desired.pop("sub_minute", None)
        changes = _diff(current, desired)
        if d.enabled is not None and d.enabled != existing.enabled:
            changes["enabled"] = [existing.enabled, d.enabled]
        if not changes and action == Action.EDIT:
            action = Action.UNCHANGED
        steps.append(Step(action, d.name, d.where, schedule_id=existing.id, changes=changes, version=existing.version,
                          schedule=existing, desired=desired, enabled=d.enabled))
    errors.raise_any()
    not_declared = sorted(set(managed) - set(seen))
    if prune:
        steps += [Step(Action.ARCHIVE, name, schedule_id=managed[name].id, version=managed[name].version,
                       schedule=managed[name]) for name in not_declared]
        not_declared = []
    creates = [s for s in steps if s.action == Action.CREATE]
    archives = [s.schedule for s in steps if s.action == Action.ARCHIVE]
    refused = quota_refusals(tenant, [s.desired["sub_minute"] for s in creates],
                             freed=(len(archives), sum(1 for s in archives if s.current.sub_minute)))
    for index, exc in refused.items():
        for field_name, messages in _errors_of(exc).items():
            errors.add(creates[index].where, creates[index].name, field_name, messages[0])
    errors.raise_any()
    return Plan(steps, prune, not_declared)


def _carry_out(tenant: Tenant, plan: Plan, *, by: Actor, now: datetime) -> None:
    # Archives first: they free quota places the creates may need.
    for step in plan.steps:
        if step.action == Action.ARCHIVE:
            actions.archive_schedule(step.schedule, by=by)
    for step in plan.steps:
        if step.action not in (Action.EDIT, Action.ADOPT):
            continue
        if step.action == Action.ADOPT:
            store().schedule_set_managed_name(step.schedule_id, step.name)
        real = {k: step.desired[k] for k in VERSIONED_DEFAULTS if FIELD_NAMES[k] in step.changes}
        try:
            edited = actions.edit_schedule(step.schedule, expected_version=step.schedule.version,
                                           changes=real, enabled=step.enabled, by=by)
        except ValidationFailed as exc:  # e.g. the sub-minute quota, which an edit checks itself
            errors = _Errors()
            for field_name, messages in exc.errors.items():
                errors.add(step.where, step.name, field_name, messages[0])
            errors.raise_any()
        step.version = edited.version
    creates = [s for s in plan.steps if s.action == Action.CREATE]
    for start in range(0, len(creates), actions.MAX_BATCH):
        chunk = creates[start:start + actions.MAX_BATCH]
        items = []
        for step in chunk:
            given = {k: step.desired[k] for k in VERSIONED_DEFAULTS}
            given["enabled"] = True if step.enabled is None else step.enabled
            given["managed_name"] = step.name
            items.append(given)
        made = actions.create_schedules(tenant, items, by=by, now=now)
        for step, outcome in zip(chunk, made):
            if isinstance(outcome, ServiceError):
                errors = _Errors()
                for field_name, messages in _errors_of(outcome).items():
                    errors.add(step.where, step.name, field_name, messages[0])
                errors.raise_any()
            step.schedule_id, step.version = outcome.id, outcome.version


def apply_set(tenant: Tenant, declared: list, *, prune: bool = False, dry_run: bool = False, by: Actor) -> Plan:
    """Plan `declared` and, unless `dry_run`, carry the plan out: all of it or, on any error,
    nothing (ValidationFailed, or Conflict when a schedule changed meanwhile)."""
    try:
        with transaction.atomic():
            _lock_tenant(tenant)
            now = db_now()
            plan = plan_set(tenant, declared, prune=prune, now=now)
            if dry_run or not plan.changed:
                return plan
            _carry_out(tenant, plan, by=by, now=now)
            audit(AuditAction.SCHEDULE_APPLY, by=by, obj_type="tenant", obj_id=tenant.id, tenant=tenant,
                  after={"prune": prune, "summary": plan.counts(),
                         "changes": [s.as_json() for s in plan.steps if s.action != Action.UNCHANGED]})
            plan.applied = True
            return plan
    except IntegrityError as exc:
        # PostgreSQL names the constraint, SQLite its columns.
        if "schedule_managed_name_unique_per_tenant" in str(exc) or "managed_name" in str(exc):
            raise Conflict("another change made a schedule of one of these names meanwhile; apply again") from None
        raise
