"""The schedule helpers every schedule change uses: validating a schedule's meaning and its quotas,
the fields of a version, the audit log. The changes themselves (create, edit, pause, resume,
archive, trigger, backfill) are in `runs.actions`, which says which module owns what; this module
knows nothing of runs.
"""

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from itertools import islice

from django.conf import settings
from django.db.models import Sum

from scheduler_project.foundation.errors import PayloadTooLarge, ValidationFailed
from scheduler_project.foundation.newrows import new_row
from schedules import timeexpr
from schedules.models import AuditEntry, Schedule, ScheduleVersion, Tenant, TenantScheduleCount
from schedules.spread import spread_offset, spread_problem
from schedules.targets import target_header_problems, url_allowed, url_shape_problem
from schedules.timeexpr.types import DstRepeated, DstSkipped

# The versioned fields, in API order, with their defaults; a change to any of them makes a new
# version (docs/time-semantics.md, "Editing").
VERSIONED_DEFAULTS = {
    "name": "",
    "expression": None,
    "time_zone": None,
    "payload": {},
    "target_url": None,
    "target_method": "POST",
    "target_headers": {},
    "target_timeout_seconds": None,  # the deployment's default: default_timeout_seconds()
    "misfire_policy": "run_once",
    "catchup_limit": 10,
    "misfire_grace_seconds": 60,
    "overlap_policy": "allow",
    "max_attempts": 5,
    "backoff_base_seconds": 1.0,
    "backoff_max_seconds": 300.0,
    "dst_skipped": DstSkipped.NEXT_VALID.value,
    "dst_repeated": DstRepeated.EARLIER.value,
    "start_at": None,
    "end_at": None,
    "spread_seconds": None,  # the tenant's default_spread_seconds for a new schedule
}
TARGET_METHODS = ("POST", "PUT", "PATCH", "GET", "DELETE")
# Bounds every caller gets here, the portal's form included (the API's serializers say the same at
# its edge): the columns' widths, and policy values a run can live with. A backoff of 1e308 s
# overflowed the date arithmetic that schedules a retry, and the worker could then record no result
# of its batch, any tenant's; a catch-up limit is how many runs one missed window may make.
MAX_NAME = 200
MAX_EXPRESSION = 2000
MAX_URL = 2000
MAX_CATCHUP_LIMIT = 10_000
MAX_POLICY_SECONDS = 7 * 86400
MIN_BACKOFF_SECONDS = 0.001


@dataclass(frozen=True)
class Actor:
    """Who made a change and from where, for the audit log and version history."""

    name: str  # "key:ab12cd34", "user:alice", "system:scan"
    remote_addr: str = ""

    def __str__(self):
        return self.name


SYSTEM = Actor("system")


def max_timeout_seconds() -> int:
    """The longest time limit a target call may have. Not tied to the lease: the worker's
    heartbeats keep a lease for as long as its call runs."""
    return max(1, settings.SCHEDULER_MAX_TIMEOUT_SECONDS)


def default_timeout_seconds() -> int:
    """The time limit of a schedule that gives none, within what may be asked for: a default the
    client never sent must never be the reason its request is refused."""
    return max(1, min(settings.SCHEDULER_DEFAULT_TIMEOUT_SECONDS, max_timeout_seconds()))


# json.dumps with any option builds an encoder per call; a batch measures a thousand payloads.
_COMPACT = json.JSONEncoder(separators=(",", ":"))


def payload_size(payload) -> int:
    """Bytes of the payload as compact JSON (ASCII: non-ASCII text counts as its escapes)."""
    return len(_COMPACT.encode(payload))


@lru_cache(maxsize=50_000)
def _rule(expression, time_zone, anchor, dst_skipped, dst_repeated):
    return timeexpr.parse(
        expression, time_zone, anchor=anchor, dst_policy=timeexpr.DstPolicy(dst_skipped, dst_repeated)
    )


def rule_for(version: ScheduleVersion, anchor: datetime):
    """The parsed rule of an (immutable) version; cached, since the scanner asks for it per
    occurrence."""
    return _rule(version.expression, version.time_zone, anchor, version.dst_skipped, version.dst_repeated)


def anchor_for(fields: dict, created_at: datetime) -> datetime:
    return fields.get("start_at") or created_at


SUB_MINUTE = timedelta(minutes=1)
SUB_MINUTE_SAMPLES = 8
# Below this many free places in a quota, creates take the tenant row lock and count again, so
# the last places are given out one at a time; further from the limit no create waits for another.
QUOTA_LOCK_MARGIN = 100


def is_sub_minute(rule, *, after: datetime) -> bool:
    """Whether the rule fires twice less than a minute apart. cron fires at most once a minute
    and rate() takes minutes at least; an RRULE that fires faster does so in runs (every second
    of an hour, two BYSECONDs in a minute), so its first few instants show it."""
    if rule.kind in ("cron", "at"):
        return False
    if rule.kind == "rate":
        return rule.interval < SUB_MINUTE
    previous = None
    for occ in islice((o for o in rule.iter_after(after) if not o.dropped), SUB_MINUTE_SAMPLES):
        if previous is not None and occ.at - previous < SUB_MINUTE:
            return True
        previous = occ.at
    return False


def _quota(tenant: Tenant, own, default) -> int:
    return own if own is not None else default


def _quota_limits(tenant: Tenant) -> tuple[int, int]:
    """The tenant's schedule and sub-minute quotas; 0: none."""
    return (_quota(tenant, tenant.max_schedules, settings.SCHEDULER_MAX_SCHEDULES_PER_TENANT),
            _quota(tenant, tenant.max_subminute_schedules, settings.SCHEDULER_MAX_SUBMINUTE_SCHEDULES_PER_TENANT))


def _over_schedule_quota(limit: int) -> ValidationFailed:
    return ValidationFailed({"body": [
        f"this tenant has {limit} schedules, its quota; archive (DELETE) schedules it no longer needs, or ask an "
        "operator to raise the quota"]})


def _over_subminute_quota(limit: int) -> ValidationFailed:
    return ValidationFailed({"expression": [
        f"this rule fires more than once a minute, and this tenant already has {limit} such schedules, its quota "
        "for them; use a slower rule, or ask an operator to raise the quota"]})


def _counted(tenant: Tenant, *, fresh: bool = False) -> tuple[int, int]:
    """The tenant's schedules that are not archived, and how many of those have a sub-minute rule:
    the sum of its TenantScheduleCount rows, which the database keeps (one small read, however many
    schedules the tenant has); or, unless `fresh`, the counts read earlier in this request, once."""
    known, tenant.known_schedule_counts = tenant.known_schedule_counts, None
    if known is not None and not fresh:
        return known
    got = TenantScheduleCount.objects.filter(tenant_id=tenant.id).aggregate(live=Sum("live"), sub=Sum("sub_minute"))
    return got["live"] or 0, got["sub"] or 0


def _near(limits: tuple[int, int], adding: tuple[int, int], counts: tuple[int, int]) -> bool:
    return any(limit and n and (n > 1 or count >= limit - QUOTA_LOCK_MARGIN)
               for limit, n, count in zip(limits, adding, counts))


def _quota_counts(tenant: Tenant, limits: tuple[int, int], adding: tuple[int, int]) -> tuple[int, int]:
    """The counts for the quotas in `limits` (0: none) that `adding` new schedules (all, sub-minute)
    must fit, read so that concurrent creates cannot both take the last places. Far from every
    limit a single create reads them without waiting for anyone: the creates in flight beside it
    are far fewer than the QUOTA_LOCK_MARGIN places left. Near one, and for a batch whatever the
    counts, the tenant row is locked and the counts read again after the wait: a batch adds up to a
    thousand places in one commit, so two batches (or a batch and near-limit creates) that each
    counted before the other committed could together go far past the quota; under the lock they
    are counted one after the other."""
    counts = _counted(tenant)
    if _near(limits, adding, counts):
        Tenant.objects.select_for_update(no_key=True).filter(id=tenant.id).first()
        counts = _counted(tenant, fresh=True)
    return counts


def _limits_and_adding(tenant: Tenant, sub_minutes: list[bool]) -> tuple[tuple[int, int], tuple[int, int]]:
    return _quota_limits(tenant), (len(sub_minutes), sum(1 for s in sub_minutes if s))


def quota_use(tenant: Tenant) -> dict:
    """How much of its quotas the tenant uses (the portal's tenant page); a quota of 0 is none."""
    live, sub_minute = _counted(tenant, fresh=True)
    limit, sub_limit = _quota_limits(tenant)
    return {"schedules": live, "schedule_quota": limit, "sub_minute": sub_minute, "sub_minute_quota": sub_limit}


def quotas_apply(tenant: Tenant, sub_minutes: list[bool]) -> bool:
    """Whether any quota counts new schedules like these (else quota_refusals reads nothing)."""
    limit, sub_limit = _quota_limits(tenant)
    return bool(limit and sub_minutes) or bool(sub_limit and any(sub_minutes))


def quota_locks(tenant: Tenant, sub_minutes: list[bool]) -> bool:
    """Whether checking new schedules like these against the quotas (quota_refusals) takes the
    tenant lock: near a limit, or for a batch. The lock must be held until they are inserted, so
    the caller then holds a transaction around the check and the inserts; far from every limit a
    single create needs none. The counts read here are the ones the check then uses."""
    if not quotas_apply(tenant, sub_minutes):
        return False
    limits, adding = _limits_and_adding(tenant, sub_minutes)
    tenant.known_schedule_counts = counts = _counted(tenant)
    return _near(limits, adding, counts)


def quota_refusals(tenant: Tenant, sub_minutes: list[bool], *, freed: tuple[int, int] = (0, 0)
                   ) -> dict[int, ValidationFailed]:
    """New schedules, given in order by whether each is sub-minute, against the tenant's quotas:
    the ones that do not fit, {index: error}. Both quotas count the tenant's schedules that are not
    archived (archiving frees a place), read from the counts the database keeps (TenantScheduleCount)
    once, whatever the number of schedules given or stored."""
    if not quotas_apply(tenant, sub_minutes):
        return {}  # no query
    limits, adding = _limits_and_adding(tenant, sub_minutes)
    limit, sub_limit = limits
    used, used_sub = _quota_counts(tenant, limits, adding)
    # Places the same change frees first (a schedule set's archives, runs.schedule_apply).
    used, used_sub = used - freed[0], used_sub - freed[1]
    refused = {}
    for index, sub_minute in enumerate(sub_minutes):
        if limit and used >= limit:
            refused[index] = _over_schedule_quota(limit)
        elif sub_limit and sub_minute and used_sub >= sub_limit:
            refused[index] = _over_subminute_quota(sub_limit)
        else:
            used += 1
            used_sub += sub_minute
    return refused


def check_quotas(tenant: Tenant, *, sub_minute: bool, schedule: Schedule | None) -> None:
    """A new schedule (`schedule` None) must fit the tenant's quotas (quota_refusals), and an edit
    that makes a rule sub-minute the sub-minute quota. 0 in the settings means no quota."""
    if schedule is None:
        refused = quota_refusals(tenant, [sub_minute])
        if refused:
            raise refused[0]
        return
    _, sub_limit = _quota_limits(tenant)
    if sub_limit and sub_minute and not schedule.current.sub_minute:
        if _quota_counts(tenant, (0, sub_limit), (0, 1))[1] >= sub_limit:
            raise _over_subminute_quota(sub_limit)


def validate_fields(tenant: Tenant, fields: dict, *, now: datetime, schedule: Schedule | None = None,
                    quotas: bool = True, rules: dict | None = None) -> object:
    """Check a full set of versioned fields against `schedule` (None: a new schedule), and the
    tenant's quotas unless `quotas` is False (a batch applies them to all its schedules at once,
    quota_refusals); returns the parsed rule. Raises ValidationFailed with every field error found,
    so a client can fix them all at once. Fills in `fields` what the version row records besides
    what was given: the deployment's default timeout, and whether the rule is sub-minute.

    `rules`: a dict the caller keeps for one batch, in which a rule parsed here is kept by what
    it was parsed from, so the batch's schedules that share an expression, zone, anchor and DST
    policy (a fleet loaded at one `now`) parse it once. Rules are immutable (the scanner shares
    them too: _rule)."""
    errors: dict[str, list[str]] = {}
    if fields.get("target_timeout_seconds") is None:
        # Filled here, where every create passes, so each caller gets the same clamped default.
        fields["target_timeout_seconds"] = default_timeout_seconds()

    def err(field, message):
        errors.setdefault(field, []).append(message)

    if payload_size(fields["payload"]) > settings.SCHEDULER_MAX_PAYLOAD_BYTES:
        raise PayloadTooLarge(
            f"payload is {payload_size(fields['payload'])} bytes; the limit is "
            f"{settings.SCHEDULER_MAX_PAYLOAD_BYTES} (SCHEDULER_MAX_PAYLOAD_BYTES)"
        )
    if len(fields["name"] or "") > MAX_NAME:
        err("name", f"name must be at most {MAX_NAME} characters")
    if len(fields["expression"] or "") > MAX_EXPRESSION:
        err("expression", f"expression must be at most {MAX_EXPRESSION} characters")
    url = fields["target_url"] or ""
    if len(url) > MAX_URL:
        err("target", f"url must be at most {MAX_URL} characters")
    elif (problem := url_shape_problem(url)) is not None:
        err("target", problem)
    elif not url_allowed(url, tenant.allowed_prefixes()):
        err(
            "target",
            f"{url} is not on this tenant's target allowlist; an operator can allow a prefix with "
            f"`manage.py create_tenant {tenant.slug} --allow-target PREFIX`",
        )
    if fields["target_method"] not in TARGET_METHODS:
        err("target", f"method must be one of {', '.join(TARGET_METHODS)}")
    for problem in target_header_problems(fields["target_headers"]):
        err("target", problem)
    timeout_cap = max_timeout_seconds()
    if not 1 <= fields["target_timeout_seconds"] <= timeout_cap:
        err("target", f"timeoutSeconds must be between 1 and {timeout_cap} ({timeout_cap // 60} minutes)")
    if fields["backoff_base_seconds"] <= 0 or fields["backoff_max_seconds"] < fields["backoff_base_seconds"]:
        err("retryPolicy", "backoffBaseSeconds must be > 0 and backoffMaxSeconds >= backoffBaseSeconds")
    elif not (MIN_BACKOFF_SECONDS <= fields["backoff_base_seconds"] and fields["backoff_max_seconds"] <= MAX_POLICY_SECONDS):
        err("retryPolicy", f"backoffBaseSeconds and backoffMaxSeconds must be between {MIN_BACKOFF_SECONDS} and "
                           f"{MAX_POLICY_SECONDS} seconds (7 days)")
    if not 1 <= fields["catchup_limit"] <= MAX_CATCHUP_LIMIT:
        err("catchupLimit", f"catchupLimit must be between 1 and {MAX_CATCHUP_LIMIT}")
    if not 0 <= fields["misfire_grace_seconds"] <= MAX_POLICY_SECONDS:
        err("misfireGraceSeconds", f"misfireGraceSeconds must be between 0 and {MAX_POLICY_SECONDS} (7 days)")
    if not 1 <= fields["max_attempts"] <= 100:
        err("retryPolicy", "maxAttempts must be between 1 and 100")
    if fields["start_at"] and fields["end_at"] and fields["end_at"] <= fields["start_at"]:
        err("endAt", "endAt must be after startAt")
    rule = None
    anchor = anchor_for(fields, now)
    key = (fields["expression"] or "", fields["time_zone"] or "", anchor, fields["dst_skipped"], fields["dst_repeated"])
    if rules is not None and key in rules:
        rule, fields["sub_minute"] = rules[key]
    else:
        try:
            timeexpr.DstPolicy.from_dict({"skipped": fields["dst_skipped"], "repeated": fields["dst_repeated"]})
            rule = timeexpr.parse(key[0], key[1], anchor=anchor,
                                  dst_policy=timeexpr.DstPolicy(fields["dst_skipped"], fields["dst_repeated"]))
            fields["sub_minute"] = is_sub_minute(rule, after=anchor - timedelta(microseconds=1))
            if rules is not None:
                rules[key] = rule, fields["sub_minute"]
        except timeexpr.ExpressionError as e:
            err(e.field, str(e))
    if rule is not None:
        _check_spread(tenant, fields, rule, now=now, err=err)
    if errors:
        raise ValidationFailed(errors)
    if quotas:
        check_quotas(tenant, sub_minute=fields["sub_minute"], schedule=schedule)
    return rule


def _check_spread(tenant: Tenant, fields: dict, rule, *, now: datetime, err) -> None:
    """The spread window must fit the rule (schedules.spread.spread_problem). A new schedule that
    gives none takes its tenant's default, unless that default does not fit this rule: a default
    the client never sent must never be the reason its request is refused, so it gets none."""
    after = max(now, anchor_for(fields, now))
    if fields.get("spread_seconds") is None:
        default = tenant.default_spread_seconds or 0
        fields["spread_seconds"] = default if default and spread_problem(default, rule, after=after) is None else 0
        return
    window = fields["spread_seconds"]
    if not isinstance(window, int) or isinstance(window, bool):
        err("spreadSeconds", "spreadSeconds must be a whole number of seconds")
        return
    problem = spread_problem(window, rule, after=after)
    if problem:
        err("spreadSeconds", problem)


def with_spread_offset(fields: dict, schedule_id) -> dict:
    """The version row's fields with the offset its window gives this schedule (schedules.spread)."""
    return {**fields, "spread_offset_seconds": spread_offset(schedule_id, fields.get("spread_seconds") or 0)}


def first_run_at(rule, fields: dict, *, after: datetime):
    """The first occurrence instant at or after `after` (and startAt), or None when the rule will
    never fire again within its bounds."""
    start = fields.get("start_at")
    frm = max(after, start - timedelta(microseconds=1)) if start else after
    occ = rule.next_after(frm)
    if occ is None:
        return None
    end = fields.get("end_at")
    if end and occ.at >= end:
        return None
    return occ.at


def version_fields(version: ScheduleVersion) -> dict:
    return {name: getattr(version, name) for name in VERSIONED_DEFAULTS}


def audit_entry(action: str, *, by: Actor, obj_type: str, obj_id, tenant=None, tenant_id=None, before=None,
                after=None) -> AuditEntry:
    """The unsaved audit entry for a change; `audit` saves it, bulk writers insert many."""
    return new_row(
        AuditEntry,
        tenant_id=tenant.id if tenant else tenant_id,
        actor=by.name,
        action=action,
        object_type=obj_type,
        object_id=str(obj_id),
        remote_addr=by.remote_addr or "",
        before=before,
        after=after,
    )


def audit(action: str, **entry) -> None:
    audit_entry(action, **entry).save(force_insert=True)


def jsonable(fields: dict) -> dict:
    return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in fields.items()}
