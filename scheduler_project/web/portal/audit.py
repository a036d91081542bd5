"""The audit log: who did what, when, from where, to which object; scoped like everything else."""

from scheduler_project.web.access import can, is_operator, portal_view, scope, visible_tenants
from scheduler_project.web.pagination import AUDIT_PAGES
from scheduler_project.web.portal.common import FilterProblems, keyset_page, render_view
from schedules.models import AuditEntry


@portal_view
def audit_log(request):
    qs = scope(AuditEntry.objects.select_related("tenant"), request.user)
    f = {}
    for name, lookup in (("action", "action"), ("actor", "actor__icontains"), ("object", "object_id")):
        value = request.GET.get(name, "").strip()
        if value:
            qs = qs.filter(**{lookup: value})
            f[name] = value
    problems = FilterProblems()
    tenant = problems.uuid(request.GET, "tenant", "Tenant")
    if tenant:
        qs = qs.filter(tenant_id=tenant)
        f["tenant"] = str(tenant)
    page = keyset_page(AUDIT_PAGES, qs.none() if problems else qs, request.GET.get("after"))
    # Target header values (often credentials) only for those who may edit the schedule, as on
    # the schedule pages; everyone else sees them masked.
    allowed = {}
    for e in page.items:
        if e.tenant_id not in allowed:
            allowed[e.tenant_id] = can(request.user, "operate_schedules", e.tenant_id)
        e.reveal_headers = allowed[e.tenant_id]
    return render_view(request, "audit/list.html", {
        "page": page, "f": f, "tenants": visible_tenants(request.user), "is_operator": is_operator(request.user),
        "filter_errors": problems,
    }, partial="results", status=400 if problems else 200)
