"""The dead-letter queue: dead runs grouped by schedule and error and by the schedules' owners,
filterable by owner, with bulk retry (dead runs) and bulk cancel (runs still retrying), over a
selection or the current filter.

Each bulk action first shows how many runs it will touch, then applies its bulk form
(runs.actions.retry_runs, cancel_runs): one transaction per run, so one run that changed state
meanwhile is reported, not fatal."""

from dataclasses import dataclass, field

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models.functions import Left
from django.http import HttpResponseNotAllowed
from django.shortcuts import redirect
from django.urls import reverse
from django.utils.http import urlencode

from runs import actions
from runs.models import Run, RunState
from scheduler_project.web.access import (
    actor_for,
    is_operator,
    operable_tenant_ids,
    portal_view,
    scope,
    visible_tenants,
)
from scheduler_project.web.portal.common import parse_uuid, render_view
from scheduler_project.web.portal.display import plural
from scheduler_project.web.portal.runs import _tenant_ids_for_merge, filter_problems, run_filters, runs_page
from schedules.models import Owner, Schedule

# A bulk action over a filter touches at most this many runs; a bigger set is done in steps, so
# no click starts an unbounded loop at 3 a.m.
BULK_LIMIT = 1000
ERROR_KEY_LEN = 120
GROUP_LIMIT = 50
# The groups count this many of the newest matching runs: enough to show what is failing now,
# and a page that costs the same with a queue of a hundred or of a hundred thousand.
GROUP_SAMPLE = 2000
NO_OWNER = "none"
VIEWS = {
    # dead: the queue itself. retrying: runs that failed and wait for another attempt, the ones a
    # cancel can still stop before they land here (cancel_run refuses dead runs).
    "dead": {"state": RunState.DEAD},
    "retrying": {"state": RunState.READY, "generation__gt": 0},
}
ACTIONS = {
    "retry": (actions.retry_runs, actions.RETRYABLE_FROM, "retried"),
    "cancel": (actions.cancel_runs, actions.CANCELABLE_FROM, "canceled"),
}


def _view_name(request) -> str:
    name = request.GET.get("view") or request.POST.get("view") or "dead"
    return name if name in VIEWS else "dead"


def _filtered(request, view_name, params):
    qs, values = run_filters(params, scope(Run.objects.filter(**VIEWS[view_name]), request.user))
    values.pop("state", None)
    error = params.get("error", "")
    if error:
        qs = qs.filter(last_error__startswith=error)
        values["error"] = error
    # By the schedule's owner now: its schedules' ids as a semi-join, so the page still reads the
    # queue's own index and checks each dead run's schedule by key.
    owner = str(params.get("owner", "") or "").strip()
    if owner == NO_OWNER:
        qs = qs.filter(schedule_id__in=Schedule.objects.filter(owner__isnull=True).values("id"))
        values["owner"] = owner
    elif parse_uuid(owner):
        qs = qs.filter(schedule_id__in=Schedule.objects.filter(owner_id=parse_uuid(owner)).values("id"))
        values["owner"] = owner
    return qs, values


@dataclass(frozen=True)
class Groups:
    rows: list
    sampled: int  # how many of the newest matching runs were counted
    more: bool  # older matching runs exist that the groups leave out
    owners: list = field(default_factory=list)  # the same runs counted by their schedules' owners


def _groups(qs, tenant_ids) -> Groups:
    """The newest GROUP_SAMPLE matching runs, counted by schedule and error.

    Cost: one range of run_dead_time_idx (one tenant in view) or run_dead_all_time_idx (the DLQ)
    and GROUP_SAMPLE heap rows, whatever the queue's size; then the groups' schedules by key.
    Counting every dead run read each one from the heap, which grows with the history."""
    if tenant_ids is not None and len(tenant_ids) == 1:
        qs = qs.filter(tenant_id=tenant_ids[0])  # the same rows, as runs_page reads them
    sample = list(
        qs.order_by("-scheduled_time", "-id")
        .annotate(error_key=Left("last_error", ERROR_KEY_LEN))
        .values_list("schedule_id", "error_key", "finished_at")[: GROUP_SAMPLE + 1]
    )
    more = len(sample) > GROUP_SAMPLE
    sample = sample[:GROUP_SAMPLE]
    counts: dict[tuple, list] = {}
    for schedule_id, error_key, finished_at in sample:
        g = counts.setdefault((schedule_id, error_key or ""), [0, finished_at])
        g[0] += 1
        if finished_at and (g[1] is None or finished_at > g[1]):
            g[1] = finished_at
    names = {s["id"]: s for s in Schedule.objects.filter(id__in={k[0] for k in counts})
             .values("id", "name", "tenant__slug", "owner_id", "owner__slug", "owner__name")}
    by_owner: dict = {}
    for (sid, _), (n, latest) in counts.items():
        sch = names.get(sid, {})
        g = by_owner.setdefault(sch.get("owner_id"), {
            "owner_id": sch.get("owner_id"), "slug": sch.get("owner__slug") or "", "name": sch.get("owner__name") or "",
            "tenant__slug": sch.get("tenant__slug", "") if sch.get("owner_id") else "", "n": 0, "schedules": set(),
            "latest": None})
        g["n"] += n
        g["schedules"].add(sid)
        if latest and (g["latest"] is None or latest > g["latest"]):
            g["latest"] = latest
    owners = sorted(by_owner.values(), key=lambda g: (-g["n"], g["slug"]))
    rows = [
        {"schedule_id": sid, "schedule__name": names.get(sid, {}).get("name", ""),
         "tenant__slug": names.get(sid, {}).get("tenant__slug", ""), "error_key": key, "n": n, "latest": latest}
        for (sid, key), (n, latest) in counts.items()
    ]
    rows.sort(key=lambda g: (-g["n"], g["schedule__name"], g["error_key"]))
    return Groups(rows=rows[:GROUP_LIMIT], sampled=len(sample), more=more, owners=owners[:GROUP_LIMIT])


@portal_view
def dlq(request):
    view_name = _view_name(request)
    problems = _problems(request.GET)
    qs, values = _filtered(request, view_name, request.GET)
    can_operate = operable_tenant_ids(request.user, "operate_runs") != []
    ctx = {"view": view_name, "f": values, "filter_errors": problems, "tenants": visible_tenants(request.user),
           "owners": scope(Owner.objects.select_related("tenant"), request.user).order_by("tenant__slug", "slug"),
           "is_operator": is_operator(request.user), "bulk_limit": BULK_LIMIT, "can_operate": can_operate,
           "back": _back_from(view_name, values)}
    if problems:
        return render_view(request, "runs/dlq.html", ctx, partial="results", status=400)
    tenant_ids = _tenant_ids_for_merge(request, values)
    page = runs_page(qs, request.GET.get("after"), tenant_ids)
    # Bounded: the count the "all matching" button states, at most one past the bulk limit.
    matching = qs.order_by()[: BULK_LIMIT + 1].count() if can_operate else 0
    return render_view(request, "runs/dlq.html", {
        **ctx, "groups": _groups(qs, tenant_ids), "page": page, "matching": matching,
    }, partial="results")


def _problems(params):
    """What filter_problems says, and a `view` that is not one of the queue's two."""
    problems = filter_problems(params)
    problems.pop("state", None)  # the view decides the state; a state parameter is not read here
    problems.choice(params, "view", "View", list(VIEWS))
    owner = str(params.get("owner", "") or "").strip()
    if owner and owner != NO_OWNER and parse_uuid(owner) is None:
        problems["owner"] = f"Owner {owner[:40]!r} is not an owner's id"
    return problems


def _back_from(view_name, values) -> str:
    return reverse("runs-dlq") + "?" + urlencode({"view": view_name, **values})


def _targets(request, view_name, action):
    """The runs an action will touch: the selected ids, or the current filter, narrowed to the
    states the service accepts, inside the user's scope; capped at BULK_LIMIT."""
    _, states, _ = ACTIONS[action]
    if request.POST.get("scope") == "filter":
        # The filter travels as hidden fields of the form, so the confirmation repeats it exactly.
        base, _ = _filtered(request, view_name, request.POST)
    else:
        ids = [u for u in (parse_uuid(x) for x in request.POST.getlist("ids")) if u]
        base = scope(Run.objects.filter(id__in=ids), request.user)
    valid = base.filter(state__in=states)
    operable = operable_tenant_ids(request.user, "operate_runs")
    if operable is not None:
        valid = valid.filter(tenant_id__in=operable)
    return valid.order_by("-scheduled_time", "-id")


def _back(request, view_name) -> str:
    """The queue as it was filtered when the action was asked for (the form repeats the filter)."""
    return _back_from(view_name, _filtered(request, view_name, request.POST)[1])


@portal_view
def dlq_action(request):
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    if operable_tenant_ids(request.user, "operate_runs") == []:
        raise PermissionDenied("your account may not retry or cancel runs")
    view_name = _view_name(request)
    action = request.POST.get("action", "")
    back = _back(request, view_name)
    if action not in ACTIONS:
        messages.error(request, "Choose retry or cancel.")
        return redirect(back)
    problems = _problems(request.POST) if request.POST.get("scope") == "filter" else None
    if problems:
        # Never "every run" in place of a filter that could not be read.
        messages.error(request, f"Nothing was done: {'; '.join(problems.values())}.")
        return redirect(reverse("runs-dlq") + "?" + urlencode({"view": view_name}))
    bulk, states, done_word = ACTIONS[action]
    targets = _targets(request, view_name, action)
    ids = list(targets.values_list("id", flat=True)[: BULK_LIMIT + 1])
    more = len(ids) > BULK_LIMIT
    ids = ids[:BULK_LIMIT]
    if request.POST.get("confirm") != "yes":
        return render_view(request, "runs/dlq_confirm.html", {
            "action": action, "count": len(ids), "more": more, "states": states, "view": view_name, "back": back,
            "post": request.POST, "selected": request.POST.getlist("ids"), "bulk_limit": BULK_LIMIT,
        }, partial="confirm")
    result = bulk(Run.objects.filter(id__in=ids), by=actor_for(request))
    done, refused = len(result.done), [message for _, message in result.refused]
    msg = f"{done_word.capitalize()} {plural(done, 'run')}."
    if refused:
        msg += (f" {plural(len(refused), 'run')} changed state meanwhile and {'was' if len(refused) == 1 else 'were'}"
                f" left alone ({refused[0]}).")
    if more:
        msg += f" More than {BULK_LIMIT} matched; run the action again for the rest."
    messages.success(request, msg)
    return redirect(back)
