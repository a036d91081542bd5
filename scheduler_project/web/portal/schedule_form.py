"""Creating and editing a schedule in the portal, with a live preview of the expression.

The form is plain HTML: a person types the rule, target, headers (one "Name: value" a line) and
payload (JSON); `runs.actions.create_schedule` / `edit_schedule` check every value, as
for the API, and their field errors are shown next to the fields. The preview panel asks
`expression_preview` as you type (htmx, `keyup changed delay:300ms`); it uses the time engine's
own preview with its budgets, so an expression too expensive to evaluate shows the engine's
message (a 400, which htmx swaps in; base.html's htmx-config). Without JavaScript the form's
Preview button shows the same panel.

Who: operators with `operate_schedules`, and tenant admins in their own tenants
(scheduler_project.web.access); a viewer or a read-only operator gets 403.
"""

from __future__ import annotations

import json
import zoneinfo
from datetime import timedelta
from functools import lru_cache

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import redirect, render
from rest_framework.exceptions import ParseError

from runs import actions
from scheduler_project.foundation.dbclock import db_now
from scheduler_project.foundation.errors import (
    EditConflict,
    PayloadTooLarge,
    ServiceError,
    StaleVersion,
    ValidationFailed,
)
from scheduler_project.web.access import actor_for, get_scoped, operable_tenant_ids, portal_view, require, scope
from scheduler_project.web.api.errors import check_json_value
from scheduler_project.web.portal.common import parse_uuid, parse_when, render_view
from scheduler_project.web.portal.display import TimePrefs
from scheduler_project.web.textinput import long_value_limit
from schedules import timeexpr
from schedules.models import MisfirePolicy, OverlapPolicy, Owner, Schedule, Tenant
from schedules.services import (
    TARGET_METHODS,
    VERSIONED_DEFAULTS,
    default_timeout_seconds,
    validate_fields,
    version_fields,
)
from schedules.timeexpr.types import REPEATED_CHOICES, SKIPPED_CHOICES, DstRepeated, DstSkipped

PREVIEW_COUNT = 10
DST_SKIPPED = SKIPPED_CHOICES
DST_REPEATED = REPEATED_CHOICES
INTS = {
    "target_timeout_seconds": "Timeout",
    "max_attempts": "Attempts",
    "misfire_grace_seconds": "Misfire grace",
    "catchup_limit": "Catch-up limit",
    "spread_seconds": "Spread",
}
FLOATS = {"backoff_base_seconds": "Backoff from", "backoff_max_seconds": "Backoff up to"}
CHOICES = {
    "target_method": TARGET_METHODS,
    "misfire_policy": tuple(MisfirePolicy.values),
    "overlap_policy": tuple(OverlapPolicy.values),
    "dst_skipped": DST_SKIPPED,
    "dst_repeated": DST_REPEATED,
}
# The service's field names (as the API names them) -> the form's.
SERVICE_FIELDS = {
    "expression": "expression", "timeZone": "time_zone", "dstPolicy": "dst_skipped", "startAt": "start_at",
    "endAt": "end_at", "target": "target_url", "retryPolicy": "max_attempts", "payload": "payload", "name": "name",
    "catchupLimit": "catchup_limit", "misfireGraceSeconds": "misfire_grace_seconds",
    "spreadSeconds": "spread_seconds",
}


@lru_cache(maxsize=1)
def zone_names() -> list[str]:
    return sorted(z for z in zoneinfo.available_timezones() if "/" in z or z == "UTC")


def _text(post, name, limit: int | None = None) -> str:
    """A form value, bounded (scheduler_project.web.textinput refuses longer ones before the view)."""
    return str(post.get(name, ""))[:limit or long_value_limit()]


def parse_headers(text: str) -> tuple[dict, str | None]:
    headers: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if ":" not in line:
            return headers, f"line {n}: write each header as Name: value"
        name, value = line.split(":", 1)
        name, value = name.strip(), value.strip()
        if not name:
            return headers, f"line {n}: the header has no name"
        if name.lower() in (h.lower() for h in headers):
            return headers, f"line {n}: {name} is given twice"
        headers[name] = value
    return headers, None


def headers_text(headers: dict) -> str:
    return "\n".join(f"{k}: {v}" for k, v in (headers or {}).items())


def _not_json(name):
    raise ValueError(f"{name} is not a JSON number")


def parse_form(post) -> tuple[dict, dict]:
    """The versioned fields from the form, and {form field: message} for what could not be read.
    Values are checked for meaning by the service; here only for form."""
    given: dict = {}
    errors: dict = {}
    for name in ("name", "expression", "time_zone", "target_url"):
        # Not cut to the columns' widths: the service refuses what is too long, with a message
        # (a cut URL would call somewhere else). RefuseBadTextMiddleware bounds every value.
        given[name] = _text(post, name).strip().replace("\r\n", "\n")
    for name, choices in CHOICES.items():
        value = _text(post, name, 32) or VERSIONED_DEFAULTS[name]
        if value not in choices:
            errors[name] = f"choose one of {', '.join(choices)}"
        given[name] = value
    for name, label in INTS.items():
        raw = _text(post, name, 32).strip()
        if not raw and name == "target_timeout_seconds":
            given[name] = None
            continue
        if not raw:
            given[name] = VERSIONED_DEFAULTS[name]
            continue
        if not (raw.isascii() and raw.isdigit()) or len(raw) > 9:
            errors[name] = f"{label}: give a whole number"
            continue
        given[name] = int(raw)
    for name, label in FLOATS.items():
        raw = _text(post, name, 32).strip()
        try:
            if not raw.isascii() or "_" in raw:
                raise ValueError  # float() reads "١" and "1_0" too; the API's JSON numbers do not
            value = float(raw) if raw else VERSIONED_DEFAULTS[name]
            if value != value or value in (float("inf"), float("-inf")):
                raise ValueError
            given[name] = value
        except ValueError:
            errors[name] = f"{label}: give a number of seconds"
    headers, problem = parse_headers(_text(post, "target_headers"))
    given["target_headers"] = headers
    if problem:
        errors["target_headers"] = problem
    raw_payload = _text(post, "payload").strip()
    if raw_payload:
        try:
            # What the API's body parser refuses is refused here too: NaN and Infinity, and (from
            # check_json_value) NUL, lone surrogates and deep nesting, which PostgreSQL cannot store.
            given["payload"] = json.loads(raw_payload, parse_constant=_not_json)
            check_json_value(given["payload"], "payload")
        except RecursionError:
            errors["payload"] = "the payload is nested too deeply"
        except ValueError as e:
            errors["payload"] = f"not JSON: {e}"
        except ParseError as e:
            errors["payload"] = str(e.detail)
    else:
        given["payload"] = {}
    for name in ("start_at", "end_at"):
        raw = _text(post, name, 64).strip()
        value = parse_when(raw)
        if raw and value is None:
            errors[name] = "give a UTC date and time between 1970 and 2999"
        given[name] = value
    return given, errors


def service_errors(e: ServiceError) -> dict:
    if isinstance(e, ValidationFailed):
        out: dict = {}
        for field, msgs in e.errors.items():
            key = SERVICE_FIELDS.get(field, "form")
            out.setdefault(key, []).extend(msgs)
        return {k: " ".join(v) for k, v in out.items()}
    if isinstance(e, PayloadTooLarge):
        return {"payload": e.message}
    return {"form": e.message}


def preview(expression: str, time_zone: str, dst_skipped: str, dst_repeated: str, start_at=None):
    """(occurrences, error message): the next instants as the API's preview computes them."""
    if not expression.strip():
        return [], ""
    if dst_skipped not in DST_SKIPPED or dst_repeated not in DST_REPEATED:
        return [], "choose a DST policy"
    anchor = start_at or db_now()
    after = anchor - timedelta(microseconds=1) if start_at else anchor
    try:
        rule = timeexpr.parse(expression, time_zone or "UTC", anchor=anchor,
                              dst_policy=timeexpr.DstPolicy(dst_skipped, dst_repeated))
        return timeexpr.preview(rule, after, PREVIEW_COUNT), ""
    except timeexpr.ExpressionError as e:
        return [], str(e)


def _preview_context(values: dict) -> dict:
    occurrences, error = preview(values.get("expression", ""), values.get("time_zone", ""),
                                 values.get("dst_skipped", DstSkipped.NEXT_VALID), values.get("dst_repeated", DstRepeated.EARLIER),
                                 values.get("start_at"))
    return {"occurrences": occurrences, "preview_error": error, "preview_zone": values.get("time_zone") or "UTC",
            "previewed": bool(values.get("expression", "").strip())}


@portal_view
def expression_preview(request):
    """The preview panel alone (GET, from the form's fields): 400 with the engine's message for an
    expression it refuses or cannot evaluate within its budget."""
    values = {name: _text(request.GET, name, 2000).replace("\r\n", "\n")
              for name in ("expression", "time_zone", "dst_skipped", "dst_repeated")}
    values["start_at"] = parse_when(_text(request.GET, "start_at", 64))
    ctx = _preview_context(values)
    # Always the panel alone: it is the form's fragment, not a page (opened directly, the whole
    # form would have no schedule or tenant to render).
    return render(request, "schedules/form.html#preview", {"v": values, **ctx},
                  status=400 if ctx["preview_error"] else 200)


def _operable_tenants(request):
    ids = operable_tenant_ids(request.user, "operate_schedules")
    qs = Tenant.objects.all()
    return qs if ids is None else qs.filter(id__in=ids)


def _form_context(request, values, errors, **extra) -> dict:
    return {"v": values, "errors": errors, "zones": zone_names(), "methods": TARGET_METHODS,
            "misfire_policies": MisfirePolicy.values, "overlap_policies": OverlapPolicy.values,
            "dst_skipped_choices": DST_SKIPPED, "dst_repeated_choices": DST_REPEATED,
            "default_timeout": default_timeout_seconds(), **_preview_context(values), **extra}


def _owner_choice(post, tenant, errors: dict):
    """The form's owner: UNSET when left to the tenant's default (create) or not posted, None for
    "no owner", else one of the tenant's owners (another is an error on the field)."""
    raw = post.get("owner")
    if raw in (None, ""):
        return actions.UNSET
    if raw == "none":
        return None
    chosen = parse_uuid(raw)
    owner = Owner.objects.filter(id=chosen, tenant=tenant).first() if chosen and tenant is not None else None
    if owner is None:
        errors["owner"] = "choose one of this tenant's owners"
    return owner


def _values_from_post(post, given) -> dict:
    values = {k: _text(post, k) for k in post.keys() if k != "csrfmiddlewaretoken"}
    values["start_at"], values["end_at"] = given.get("start_at"), given.get("end_at")
    values["start_at_text"], values["end_at_text"] = _text(post, "start_at", 64), _text(post, "end_at", 64)
    return values


@portal_view
def schedule_create(request):
    tenants = _operable_tenants(request)
    if not tenants.exists():
        raise PermissionDenied("your account may not create schedules")
    tenant_list = list(tenants.prefetch_related("targets")[:500])
    owners = list(Owner.objects.filter(tenant__in=tenant_list).select_related("tenant")
                  .order_by("tenant__slug", "slug"))
    if request.method != "POST":
        prefs = TimePrefs.of(request)
        chosen = parse_uuid(request.GET.get("tenant"))
        values = {**{k: v for k, v in VERSIONED_DEFAULTS.items() if v is not None}, "payload": "{}",
                  "target_headers": "", "time_zone": prefs.browser_zone or "UTC",
                  "tenant": str(chosen or (tenant_list[0].id if tenant_list else ""))}
        return render_view(request, "schedules/form.html", _form_context(
            request, values, {}, tenants=tenant_list, creating=True, prefixes=_prefixes(tenant_list), owners=owners))
    given, errors = parse_form(request.POST)
    values = _values_from_post(request.POST, given)
    tenant = next((t for t in tenant_list if str(t.id) == request.POST.get("tenant")), None)
    if tenant is None:
        errors["tenant"] = "choose a tenant you may create schedules in"
    owner = _owner_choice(request.POST, tenant, errors)
    ctx = dict(tenants=tenant_list, creating=True, prefixes=_prefixes(tenant_list), owners=owners)
    if errors and not request.POST.get("preview"):
        check_all(tenant, given, errors, base={})
    if errors or request.POST.get("preview"):
        return render_view(request, "schedules/form.html", _form_context(request, values, errors, **ctx),
                           status=400 if errors else 200)
    require(request.user, "operate_schedules", tenant.id)
    try:
        schedule = actions.create_schedule(tenant, given, by=actor_for(request),
                                           enabled=not request.POST.get("paused"), now=db_now(), owner=owner)
    except ServiceError as e:
        return render_view(request, "schedules/form.html", _form_context(request, values, service_errors(e), **ctx),
                           status=400)
    messages.success(request, "Created." + (" It is paused: resume it to start." if not schedule.enabled else ""))
    return redirect("schedules-detail", pk=schedule.id)


def _prefixes(tenants) -> dict:
    """{tenant slug: its allowed prefixes}, for the URL field's suggestions and the text under it."""
    return {t.slug: [p.prefix for p in t.targets.all()] for t in tenants}


# What the form calls each versioned field, for the conflict panel.
LABELS = {
    "name": "Name", "expression": "Expression", "time_zone": "Time zone", "payload": "Payload",
    "target_url": "URL", "target_method": "Method", "target_headers": "Headers",
    "target_timeout_seconds": "Timeout", "misfire_policy": "Misfire policy", "catchup_limit": "Catch-up limit",
    "misfire_grace_seconds": "Misfire grace", "overlap_policy": "Overlap policy", "max_attempts": "Attempts",
    "backoff_base_seconds": "Backoff from", "backoff_max_seconds": "Backoff up to",
    "dst_skipped": "A skipped local time", "dst_repeated": "A repeated local time", "start_at": "Start",
    "end_at": "End",
}


def _when_text(value) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%S") if value else ""


def _field_text(name: str, value) -> str:
    """A field's value as the form writes it."""
    if name == "payload":
        return json.dumps(value, indent=2, ensure_ascii=False)
    if name == "target_headers":
        return headers_text(value)
    if name in ("start_at", "end_at"):
        return _when_text(value)
    return "" if value is None else str(value)


def _form_values(fields: dict, version: int) -> dict:
    """The form's values for a full set of versioned fields."""
    values = {name: fields.get(name) for name in VERSIONED_DEFAULTS}
    values.update(payload=_field_text("payload", fields["payload"]),
                  target_headers=_field_text("target_headers", fields["target_headers"]), version=version,
                  start_at_text=_when_text(fields["start_at"]), end_at_text=_when_text(fields["end_at"]))
    return values


def label(name: str) -> str:
    return LABELS.get(name, name.replace("_", " ").capitalize())


def check_all(tenant, given: dict, errors: dict, *, base: dict, schedule=None) -> None:
    """Add to `errors` what the service would refuse among the values the form could read, so a
    form shows all of its errors at once instead of in rounds (the service's checks ran only
    after the form's own). `base` fills the fields that could not be read."""
    if tenant is None:
        return
    readable = {k: v for k, v in given.items() if k not in errors}
    fields = {**VERSIONED_DEFAULTS, **base, **readable}
    try:
        validate_fields(tenant, fields, now=db_now(), schedule=schedule, quotas=False)
    except ServiceError as e:
        for name, message in service_errors(e).items():
            errors.setdefault(name, message)


def _resolve_choices(request, given: dict, errors: dict, shown: dict | None) -> None:
    """After a conflict the form asks, for each field both sides changed, which value to keep:
    "theirs" takes the value of the version the form now edits (`shown`); "mine" keeps the field
    as posted. No choice is no save."""
    names = [n for n in request.POST.get("conflicts", "").split(",") if n in VERSIONED_DEFAULTS]
    for name in names:
        choice = request.POST.get(f"keep_{name}")
        if choice == "theirs" and shown is not None:
            given[name] = shown[name]
        elif choice != "mine":
            errors[name] = f"{label(name)}: both you and a colleague changed it; choose which value to keep"


def _conflict_context(e: EditConflict, given: dict, current: dict, current_by: str) -> tuple[dict, dict, list]:
    """(values, errors, conflicts) for the form shown again after a conflicting merge: every field
    as the current version has it, except the ones this editor changed, which keep their value;
    a field both changed shows both values and a choice."""
    base = {**current, **{k: before for k, (before, _) in e.changed_since.items()}}
    merged = dict(current)
    for k, v in given.items():
        if k in VERSIONED_DEFAULTS and base.get(k) != v:
            merged[k] = v
    values = _form_values(merged, e.current_version)
    conflicts = [{"name": k, "label": label(k), "base": _field_text(k, c["base"]), "theirs": _field_text(k, c["theirs"]),
                  "mine": _field_text(k, c["mine"])} for k, c in e.conflicts.items()]
    kept = [label(k) for k in e.changed_since if k not in e.conflicts]
    text = (f"{current_by or 'Someone'} saved version {e.current_version} while you were editing version "
            f"{e.expected_version}, and changed {', '.join(c['label'] for c in conflicts)} too. Nothing is saved yet: "
            "choose below which value to keep for each, then save.")
    if kept:
        text += f" Their other changes ({', '.join(kept)}) are in the form and stay."
    errors = {"form": text, **{c["name"]: "choose which value to keep" for c in conflicts}}
    return values, errors, conflicts


@portal_view
def schedule_edit(request, pk):
    schedule = get_scoped(scope(Schedule.objects.select_related("tenant", "current"), request.user), request.user,
                          id=pk)
    require(request.user, "operate_schedules", schedule.tenant_id)
    ctx = dict(schedule=schedule, creating=False, prefixes=_prefixes([schedule.tenant]),
               owners=list(Owner.objects.filter(tenant_id=schedule.tenant_id).order_by("slug")))
    if request.method != "POST":
        values = _form_values(version_fields(schedule.current), schedule.version)
        values["owner"] = str(schedule.owner_id) if schedule.owner_id else "none"
        return render_view(request, "schedules/form.html", _form_context(request, values, {}, **ctx))
    given, errors = parse_form(request.POST)
    if "spread_seconds" not in request.POST:
        given.pop("spread_seconds", None)  # a form without the field leaves the spread as it is
    elif given.get("spread_seconds") is None:
        given["spread_seconds"] = 0  # cleared on an edit: none (a new schedule's blank is the tenant's default)
    values = _values_from_post(request.POST, given)
    owner = _owner_choice(request.POST, schedule.tenant, errors)
    owner_before = schedule.owner_id
    try:
        expected = int(request.POST.get("version", ""))
    except ValueError:
        expected = None
        errors["form"] = "reload the page: the form does not say which version it edits"
    shown = schedule.versions.filter(version=expected).first() if expected is not None else None
    shown_fields = version_fields(shown) if shown else version_fields(schedule.current)
    _resolve_choices(request, given, errors, shown_fields if shown else None)
    if errors and not request.POST.get("preview"):
        check_all(schedule.tenant, given, errors, base=shown_fields, schedule=schedule)
    if errors or request.POST.get("preview"):
        if request.POST.get("conflicts"):
            ctx["conflicts"] = _conflicts_again(request, shown_fields)
        return render_view(request, "schedules/form.html", _form_context(request, values, errors, **ctx),
                           status=400 if errors else 200)
    try:
        # merge: the form posts every field; a stale form writes only what its editor changed.
        schedule = actions.edit_schedule(schedule, expected_version=expected, changes=given,
                                         by=actor_for(request), merge=True, owner=owner)
    except EditConflict as e:
        current = Schedule.objects.select_related("current").get(id=schedule.id).current
        values, errors, conflicts = _conflict_context(e, given, version_fields(current), current.created_by)
        return render_view(request, "schedules/form.html",
                           _form_context(request, values, errors, conflicts=conflicts, **ctx), status=409)
    except StaleVersion as e:
        # The version the form was loaded from is not one this schedule has (an edited form).
        values["version"] = e.current_version
        return render_view(request, "schedules/form.html", _form_context(request, values, {
            "form": f"This form edits a version the schedule does not have; it is at version {e.current_version}. "
                    "Reload the page to edit the current version."}, **ctx), status=409)
    except ServiceError as e:
        return render_view(request, "schedules/form.html", _form_context(request, values, service_errors(e), **ctx),
                           status=400)
    merged = schedule.merged
    if merged and merged.mine:
        kept = f" The changes saved meanwhile ({', '.join(label(k) for k in merged.kept)}) were kept." if merged.kept else ""
        messages.success(request, f"Saved as version {schedule.version}, on top of the version saved while you were "
                                  f"editing: only the fields you changed were written "
                                  f"({', '.join(label(k) for k in merged.mine)}).{kept}")
    elif (schedule.version == expected or (merged and not merged.mine)) and schedule.owner_id != owner_before:
        messages.success(request, f"Owner: {schedule.owner.name}." if schedule.owner_id
                         else "This schedule has no owner now.")
    elif schedule.version == expected or (merged and not merged.mine):
        messages.info(request, "Nothing changed: you changed no field from the version you loaded.")
    else:
        messages.success(request, f"Saved as version {schedule.version}. Runs of older versions that had not "
                                  "started were canceled; runs in flight finish under their own version.")
    return redirect("schedules-detail", pk=schedule.id)


def _conflicts_again(request, shown: dict) -> list:
    """The conflict panel again when a resolving form came back with errors (a choice missing)."""
    out = []
    for name in request.POST.get("conflicts", "").split(","):
        if name in VERSIONED_DEFAULTS:
            out.append({"name": name, "label": label(name), "base": _text(request.POST, f"base_{name}"),
                        "theirs": _field_text(name, shown[name]), "mine": _text(request.POST, f"mine_{name}"),
                        "chosen": request.POST.get(f"keep_{name}", "")})
    return out
