"""Incidents and owners in the portal: the incidents page (filtered by state, owner, schedule,
tenant), acknowledging and resolving (dispatch.incidents, audited; operate_runs), an owner's
page (its schedules, incidents and retry cost), and the retry-cost page (dispatch.retry_cost: a
tenant's schedules, owners or target hosts, the costliest first). Scoped like everything else."""

from django.contrib import messages
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from dispatch import incidents, retry_cost
from dispatch.models import CostDimension, Incident, IncidentRule, IncidentState, Notification
from runs.actions import edit_schedule
from scheduler_project.foundation.dbclock import db_now
from scheduler_project.web.access import (
    actor_for,
    can,
    get_scoped,
    is_operator,
    portal_view,
    require,
    scope,
    visible_tenants,
)
from scheduler_project.web.pagination import INCIDENT_PAGES, SCHEDULE_PAGES
from scheduler_project.web.portal.common import call_service, keyset_page, parse_uuid, render_view
from schedules import owners as owner_service
from schedules.models import Owner, Schedule, WebhookFormat


def _filtered(request, qs):
    f = {}
    state = request.GET.get("state", "unresolved")
    if state == "unresolved":
        qs = qs.exclude(state=IncidentState.RESOLVED)
    elif state in IncidentState.values:
        qs = qs.filter(state=state)
    f["state"] = state
    rule = request.GET.get("rule", "")
    if rule in IncidentRule.values:
        qs = qs.filter(rule=rule)
        f["rule"] = rule
    for name, column in (("owner", "owner_id"), ("schedule", "schedule_id"), ("tenant", "tenant_id")):
        value = parse_uuid(request.GET.get(name))
        if value:
            qs = qs.filter(**{column: value})
            f[name] = str(value)
    return qs, f


@portal_view
def incident_list(request):
    qs = scope(Incident.objects.select_related("tenant", "owner", "schedule"), request.user)
    qs, f = _filtered(request, qs)
    page = keyset_page(INCIDENT_PAGES, qs, request.GET.get("after"))
    return render_view(request, "incidents/list.html", {
        "page": page, "f": f, "tenants": visible_tenants(request.user), "is_operator": is_operator(request.user),
        "owners": scope(Owner.objects.select_related("tenant"), request.user),
        "states": ["unresolved", *IncidentState.values], "rules": IncidentRule.values,
        "can_act": {i.id for i in page.rows if can(request.user, "operate_runs", i.tenant_id)},
    }, partial="results")


def _incident_action(fn, done: str):
    @portal_view
    @require_POST
    def view(request, pk):
        inc = get_scoped(Incident.objects.all(), request.user, id=pk)
        require(request.user, "operate_runs", inc.tenant_id)
        call_service(request, fn, inc.id, tenant_id=inc.tenant_id, by=actor_for(request), success=done)
        back = request.POST.get("next", "")
        return redirect(back if back.startswith("/") and not back.startswith("//") else "incidents-list")

    return view


incident_acknowledge = _incident_action(incidents.acknowledge_incident, "Acknowledged: it stays open until it clears.")
incident_resolve = _incident_action(incidents.resolve_incident, "Resolved; the owner is told.")


@portal_view
def owner_detail(request, pk):
    owner = get_scoped(Owner.objects.select_related("tenant"), request.user, id=pk)
    schedules = keyset_page(SCHEDULE_PAGES, Schedule.objects.filter(owner=owner).select_related("current"),
                            request.GET.get("after"))
    open_incidents = Incident.objects.filter(owner=owner).exclude(state=IncidentState.RESOLVED).select_related(
        "schedule")[:50]
    # The newest notifications to the owner (by notification_owner_sent_idx for sent ones, the
    # unsent few by the relay's own index): what went out, what waits and why, what keeps failing.
    sent = list(Notification.objects.filter(owner=owner, published_at__isnull=False).order_by("-published_at")[:10])
    waiting = list(Notification.objects.filter(owner=owner, published_at__isnull=True).order_by("id")[:20])
    return render_view(request, "incidents/owner.html", {
        "owner": owner, "schedules": schedules, "incidents": open_incidents,
        "is_default": owner.tenant.default_owner_id == owner.id,
        "retry_cost": cost_windows(owner.tenant_id, CostDimension.OWNER, str(owner.id)),
        "sent": sent, "waiting": waiting, "can_test": can(request.user, "operate_schedules", owner.tenant_id),
        "webhook_formats": WebhookFormat.values,
    })


@portal_view
@require_POST
def owner_test_notification(request, pk):
    """Queues a test message on each of the owner's channels through the notification outbox
    (dispatch.incidents.send_test_notification: audited, delivered by the relay like any other)."""
    owner = get_scoped(Owner.objects.select_related("tenant"), request.user, id=pk)
    require(request.user, "operate_schedules", owner.tenant_id)
    if not (owner.webhook_url or owner.email):
        messages.error(request, "This owner has no webhook and no e-mail address: nothing to send to.")
    else:
        call_service(request, incidents.send_test_notification, owner, by=actor_for(request),
                     success="A test notification is queued on each of the owner's channels; the relay sends it "
                             "within seconds (see below).")
    return redirect("incidents-owner", owner.id)


# The owner's delivery settings the page edits; blank means none (no quiet hours, no limit).
OWNER_SETTINGS = ("email", "webhook_url", "webhook_format", "time_zone", "quiet_start", "quiet_end", "max_per_hour")


@portal_view
@require_POST
def owner_settings(request, pk):
    """The owner's channels, quiet hours and hourly limit, through schedules.owners.edit_owner (the
    API's PATCH: validated field by field, audited); an error names the field and changes nothing."""
    owner = get_scoped(Owner.objects.select_related("tenant"), request.user, id=pk)
    require(request.user, "operate_schedules", owner.tenant_id)
    fields = {}
    for key in OWNER_SETTINGS:
        if key not in request.POST:
            continue
        value = request.POST[key].strip()
        if key in ("quiet_start", "quiet_end", "max_per_hour") and not value:
            fields[key] = None
        elif key == "max_per_hour":
            fields[key] = int(value) if value.isascii() and value.isdigit() else value  # else the service says why
        else:
            fields[key] = value
    call_service(request, owner_service.edit_owner, owner, fields, by=actor_for(request), success="Owner settings saved.")
    return redirect("incidents-owner", owner.id)


def cost_windows(tenant_id, dimension: str, key: str) -> list:
    """[(window, RetryCost, complete)] over both windows, for the schedule and owner pages."""
    now = db_now()
    return [(window, *retry_cost.figures_for(tenant_id, dimension, key, window=window, now=now))
            for window in retry_cost.WINDOWS]


COST_BY = {"schedule": CostDimension.SCHEDULE, "owner": CostDimension.OWNER, "target": CostDimension.TARGET}


@portal_view
def retry_cost_page(request):
    """One tenant's ranking (an operator picks the tenant; a member of one sees theirs)."""
    tenants = list(visible_tenants(request.user).order_by("slug"))
    chosen = parse_uuid(request.GET.get("tenant"))
    tenant = next((t for t in tenants if t.id == chosen), tenants[0] if tenants else None)
    window = request.GET.get("window") if request.GET.get("window") in retry_cost.WINDOWS else "24h"
    by = request.GET.get("by") if request.GET.get("by") in COST_BY else "schedule"
    rows, figures, names = [], None, {}
    if tenant is not None:
        figures = retry_cost.ranking(tenant.id, COST_BY[by], window=window, now=db_now(), limit=100)
        keys = [c.key for c in figures.rows]
        if by == "schedule":
            names = {str(s.id): s for s in Schedule.objects.filter(tenant=tenant, id__in=keys)}
        elif by == "owner":
            names = {str(o.id): o for o in Owner.objects.filter(tenant=tenant, id__in=[k for k in keys if k])}
        rows = [(c, names.get(c.key)) for c in figures.rows]
    return render_view(request, "incidents/retry_cost.html", {
        "tenants": tenants, "tenant": tenant, "window": window, "by": by, "rows": rows, "figures": figures,
        "windows": list(retry_cost.WINDOWS), "bys": list(COST_BY),
    }, partial="results")


@portal_view
def schedule_owner(request, pk):
    """Choose a schedule's owner: a page of its own (GET the form, POST the change), which goes
    through runs.actions.edit_schedule like every schedule change (audited, no version)."""
    schedule = get_scoped(Schedule.objects.select_related("tenant", "owner"), request.user, id=pk)
    owners = list(Owner.objects.filter(tenant_id=schedule.tenant_id))
    if request.method == "POST":
        require(request.user, "operate_schedules", schedule.tenant_id)
        chosen = parse_uuid(request.POST.get("owner"))
        owner = next((o for o in owners if o.id == chosen), None)
        if chosen and owner is None:
            messages.error(request, "Owner: not an owner of this schedule's tenant.")
        else:
            call_service(request, edit_schedule, schedule, expected_version=schedule.version, changes={},
                         owner=owner, by=actor_for(request),
                         success=f"Owner: {owner.name}." if owner else "This schedule has no owner now.")
            return redirect("schedules-detail", schedule.id)
    return render_view(request, "incidents/schedule_owner.html", {
        "schedule": schedule, "owners": owners,
        "can_change": can(request.user, "operate_schedules", schedule.tenant_id)})
