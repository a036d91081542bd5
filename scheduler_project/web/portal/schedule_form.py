"""Creating and editing a schedule in the portal, with a live preview of the expression.

The form is plain HTML: a person types the rule, target, headers (one "Name: value" a line) and
payload (JSON); `runs.schedule_changes.create_schedule` / `edit_schedule` check every value, as
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

from runs import schedule_changes
from scheduler_project.dbclock import db_now
from scheduler_project.errors import PayloadTooLarge, ServiceError, StaleVersion, ValidationFailed
from scheduler_project.web.api.errors import check_json_value
from scheduler_project.web.access import actor_for, get_scoped, operable_tenant_ids, portal_view, require, scope
from scheduler_project.web.portal.common import parse_uuid, parse_when, render_view
from scheduler_project.web.portal.display import TimePrefs
from scheduler_project.web.textinput import long_value_limit
from schedules import timeexpr
from schedules.models import MisfirePolicy, OverlapPolicy, Schedule, Tenant
from schedules.services import TARGET_METHODS, VERSIONED_DEFAULTS, default_timeout_seconds

PREVIEW_COUNT = 10
DST_SKIPPED = ("next_valid", "shift", "skip")
DST_REPEATED = ("earlier", "later", "both")
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
                                 values.get("dst_skipped", "next_valid"), values.get("dst_repeated", "earlier"),
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
    if request.method != "POST":
        prefs = TimePrefs.of(request)
        chosen = parse_uuid(request.GET.get("tenant"))
        values = {**{k: v for k, v in VERSIONED_DEFAULTS.items() if v is not None}, "payload": "{}",
                  "target_headers": "", "time_zone": prefs.browser_zone or "UTC",
                  "tenant": str(chosen or (tenant_list[0].id if tenant_list else ""))}
        return render_view(request, "schedules/form.html", _form_context(
            request, values, {}, tenants=tenant_list, creating=True, prefixes=_prefixes(tenant_list)))
    given, errors = parse_form(request.POST)
    values = _values_from_post(request.POST, given)
    tenant = next((t for t in tenant_list if str(t.id) == request.POST.get("tenant")), None)
    if tenant is None:
        errors["tenant"] = "choose a tenant you may create schedules in"
    ctx = dict(tenants=tenant_list, creating=True, prefixes=_prefixes(tenant_list))
    if errors or request.POST.get("preview"):
        return render_view(request, "schedules/form.html", _form_context(request, values, errors, **ctx),
                           status=400 if errors else 200)
    require(request.user, "operate_schedules", tenant.id)
    try:
        schedule = schedule_changes.create_schedule(tenant, given, by=actor_for(request),
                                                    enabled=not request.POST.get("paused"), now=db_now())
    except ServiceError as e:
        return render_view(request, "schedules/form.html", _form_context(request, values, service_errors(e), **ctx),
                           status=400)
    messages.success(request, "Created." + (" It is paused: resume it to start." if not schedule.enabled else ""))
    return redirect("schedules-detail", pk=schedule.id)


def _prefixes(tenants) -> dict:
    """{tenant slug: its allowed prefixes}, for the URL field's suggestions and the text under it."""
    return {t.slug: [p.prefix for p in t.targets.all()] for t in tenants}


@portal_view
def schedule_edit(request, pk):
    schedule = get_scoped(scope(Schedule.objects.select_related("tenant", "current"), request.user), request.user,
                          id=pk)
    require(request.user, "operate_schedules", schedule.tenant_id)
    ctx = dict(schedule=schedule, creating=False, prefixes=_prefixes([schedule.tenant]))
    if request.method != "POST":
        v = schedule.current
        values = {name: getattr(v, name) for name in VERSIONED_DEFAULTS}
        values.update(payload=json.dumps(v.payload, indent=2, ensure_ascii=False),
                      target_headers=headers_text(v.target_headers), version=schedule.version,
                      start_at_text=v.start_at.strftime("%Y-%m-%dT%H:%M:%S") if v.start_at else "",
                      end_at_text=v.end_at.strftime("%Y-%m-%dT%H:%M:%S") if v.end_at else "")
        return render_view(request, "schedules/form.html", _form_context(request, values, {}, **ctx))
    given, errors = parse_form(request.POST)
    if "spread_seconds" not in request.POST:
        given.pop("spread_seconds", None)  # a form without the field leaves the spread as it is
    elif given.get("spread_seconds") is None:
        given["spread_seconds"] = 0  # cleared on an edit: none (a new schedule's blank is the tenant's default)
    values = _values_from_post(request.POST, given)
    try:
        expected = int(request.POST.get("version", ""))
    except ValueError:
        expected = None
        errors["form"] = "reload the page: the form does not say which version it edits"
    if errors or request.POST.get("preview"):
        return render_view(request, "schedules/form.html", _form_context(request, values, errors, **ctx),
                           status=400 if errors else 200)
    try:
        schedule_changes.edit_schedule(schedule, expected_version=expected, changes=given, by=actor_for(request))
    except StaleVersion as e:
        # Someone saved first: show what they typed against the new version, to save again on purpose.
        values["version"] = e.current_version
        return render_view(request, "schedules/form.html", _form_context(request, values, {
            "form": f"Someone else saved version {e.current_version} while you were editing. Your changes are "
                       "below, not saved: look at the schedule's version history, then save again to apply them "
                       "on top of it."}, **ctx), status=400)
    except ServiceError as e:
        return render_view(request, "schedules/form.html", _form_context(request, values, service_errors(e), **ctx),
                           status=400)
    schedule.refresh_from_db()
    if schedule.version == expected:
        messages.info(request, "Nothing changed: the form is the same as the current version.")
    else:
        messages.success(request, f"Saved as version {schedule.version}. Runs of older versions that had not "
                                  "started were canceled; runs in flight finish under their own version.")
    return redirect("schedules-detail", pk=schedule.id)
