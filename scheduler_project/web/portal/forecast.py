"""The forecast page: runs becoming eligible ahead (dispatch.forecast) as bar charts, the next hour
per minute, the day per 5 minutes and the week per hour, for every tenant (operators), the
viewer's tenants, one tenant or one target host, beside the capacity the fleet showed, with the
warnings. A tenant user sees only their own tenants' schedules and runs."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import redirect
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_POST

from dispatch import forecast as fc
from runs import actions
from scheduler_project.foundation.errors import ServiceError
from scheduler_project.web.access import (
    actor_for,
    can,
    get_scoped,
    is_operator,
    portal_view,
    require,
    visible_tenant_ids,
)
from scheduler_project.web.portal.charts import BOTTOM, LEFT, RIGHT, TOP, H, W, _count, _nice_max
from scheduler_project.web.portal.common import parse_uuid, render_view, service_message
from scheduler_project.web.portal.display import TimePrefs, format_in
from schedules.models import Tenant

TIER_WORDS = {"hour": "next hour, per minute", "day": "next 24 hours, per 5 minutes", "week": "next 7 days, per hour"}


def forecast_chart(name: str, buckets: list, tz) -> str:
    """Bars of due runs per bucket, on a linear scale from 0 to a round maximum."""
    plot_w, plot_h = W - LEFT - RIGHT, H - TOP - BOTTOM
    top = _nice_max(max((b.due for b in buckets), default=0))
    n = max(1, len(buckets))
    bw = plot_w / n
    total = sum(b.due for b in buckets)
    parts = [format_html(
        '<svg class="chart" viewBox="0 0 {} {}" role="img" aria-labelledby="fc-{}-t fc-{}-d" data-testid="forecast-{}">'
        '<title id="fc-{}-t">Runs due, {}</title><desc id="fc-{}-d">{} due in all</desc>',
        W, H, name, name, name, name, TIER_WORDS[name], name, _count(total))]
    for frac in (0, 0.5, 1):
        y = TOP + plot_h * (1 - frac)
        parts.append(format_html('<line class="grid" x1="{}" x2="{}" y1="{}" y2="{}"/>'
                                 '<text class="axis" x="{}" y="{}" text-anchor="end">{}</text>',
                                 LEFT, W - RIGHT, f"{y:.1f}", f"{y:.1f}", LEFT - 4, f"{y + 4:.1f}", _count(top * frac)))
    for i, b in enumerate(buckets):
        if b.due <= 0:
            continue
        h = plot_h * b.due / top
        parts.append(format_html(
            '<rect class="ok" x="{}" y="{}" width="{}" height="{}"><title>{}: {} due</title></rect>',
            f"{LEFT + i * bw + bw * 0.1:.1f}", f"{TOP + plot_h - h:.1f}", f"{max(bw * 0.8, 0.8):.1f}",
            f"{max(h, 0.5):.1f}", format_in(b.start, tz, "short"), _count(b.due)))
    for k in range(5):
        i = min(n - 1, k * n // 4)
        if not buckets:
            break
        text = format_in(buckets[i].start, tz, "short")
        text = text[11:] if name != "week" else text[5:]
        anchor = "start" if k == 0 else ("end" if k == 4 else "middle")
        x = LEFT if k == 0 else (W - RIGHT if k == 4 else LEFT + (i + 0.5) * bw)
        parts.append(format_html('<text class="axis" x="{}" y="{}" text-anchor="{}">{}</text>',
                                 f"{x:.1f}", H - 6, anchor, text))
    parts.append("</svg>")
    return mark_safe("".join(parts))


def _shaping(request, tenants_visible, f, tz):
    """The "shape this surge" panel's preview: the selection (a tenant's schedules, optionally of
    one target host and one expression) and the forecast as it would be with the window applied."""
    g = request.GET
    values = {"tenant": g.get("shape_tenant", ""), "host": (g.get("shape_host") or "").strip(),
              "expression": (g.get("shape_expression") or "").strip()[:2000], "window": (g.get("spread") or "").strip()[:9]}
    if not g.get("shape"):
        return {"v": values}
    tenant = next((t for t in tenants_visible if str(t.id) == values["tenant"]), None)
    if tenant is None:
        return {"v": values, "error": "choose one of your tenants"}
    if values["host"] and fc.host_problem(values["host"]):
        return {"v": values, "error": fc.host_problem(values["host"])}
    if "\x00" in values["expression"]:
        return {"v": values, "error": "an expression cannot contain NUL"}
    if not (values["window"].isascii() and values["window"].isdigit()):
        return {"v": values, "error": "give the spread window as a whole number of seconds"}
    window = int(values["window"])
    selected = actions.schedules_for_spread(tenant, host=values["host"] or None,
                                            expression=values["expression"] or None, without_window=window)
    too_many = len(selected) > actions.MAX_BULK_SPREAD  # applied in parts
    after = fc.forecast(tenant_ids=[tenant.id], respread=fc.Respread(tenant.id, window, values["host"] or None,
                                                                     values["expression"] or None))
    before = fc.forecast(tenant_ids=[tenant.id])
    return {"v": values, "tenant": tenant, "window": window, "selected": len(selected), "too_many": too_many,
            "max": actions.MAX_BULK_SPREAD, "before_peak": before.peak(), "after_peak": after.peak(),
            "after": after, "can_apply": can(request.user, "operate_schedules", tenant.id) and bool(selected),
            "chart": forecast_chart("hour", after.tiers["hour"], tz)}


@portal_view
@require_POST
def forecast_spread(request):
    """Apply the previewed spread: one bulk change through the edit entry point, audited."""
    p = request.POST
    tenant = get_scoped(Tenant.objects.all(), request.user, field="id", id=parse_uuid(p.get("tenant")))
    require(request.user, "operate_schedules", tenant.id)
    raw = (p.get("spread") or "").strip()
    if not (raw.isascii() and raw.isdigit()):
        messages.error(request, "give the spread window as a whole number of seconds")
        return redirect("dispatch-forecast")
    host, expression = (p.get("host") or "").strip() or None, (p.get("expression") or "").strip() or None
    if (host and fc.host_problem(host)) or (expression and "\x00" in expression):
        messages.error(request, fc.host_problem(host or "") if host else "an expression cannot contain NUL")
        return redirect("dispatch-forecast")
    # The next part of the selection: those without the window yet, at most one bulk change's worth.
    selected = actions.schedules_for_spread(tenant, host=host, expression=expression, without_window=int(raw))
    more = len(selected) > actions.MAX_BULK_SPREAD
    try:
        out = actions.spread_schedules(tenant, selected[:actions.MAX_BULK_SPREAD], int(raw),
                                       by=actor_for(request), selection={"host": host, "expression": expression})
    except ServiceError as e:
        messages.error(request, service_message(e))
        return redirect("dispatch-forecast")
    text = f"Spread {len(out['changed'])} schedule(s) over {raw} s"
    if out["unchanged"]:
        text += f"; {out['unchanged']} already had it"
    if out["refused"]:
        text += f"; {len(out['refused'])} left as they were (the window does not fit their rule, or they changed)"
    if more:
        text += f"; more of the selection remain: apply again for the next {actions.MAX_BULK_SPREAD}"
    messages.success(request, text + ".")
    return redirect(f"{reverse('dispatch-forecast')}?tenant={tenant.id}")


@portal_view
def forecast_page(request):
    visible = visible_tenant_ids(request.user)
    tenant_ids = visible
    chosen = parse_uuid(request.GET.get("tenant"))
    if chosen:
        if visible is not None and chosen not in visible:
            raise PermissionDenied("not one of your tenants")
        tenant_ids = [chosen]
    host = (request.GET.get("host") or "").strip() or None
    if host and fc.host_problem(host):
        messages.error(request, fc.host_problem(host))
        host = None
    f = fc.forecast(tenant_ids=tenant_ids, host=host)
    tz = TimePrefs.of(request).zone_for(None)
    tenants = Tenant.objects.all() if visible is None else Tenant.objects.filter(id__in=visible)
    peak = f.peak()
    shaping = _shaping(request, list(tenants), f, tz)
    return render_view(request, "dispatch/forecast.html", {
        "shaping": shaping,
        "f": f, "peak": peak, "host": host or "", "chosen": str(chosen or ""), "tenants": tenants[:500],
        "is_operator": is_operator(request.user),
        "charts": [(name, TIER_WORDS[name], forecast_chart(name, f.tiers[name], tz)) for name, _, _ in fc.TIERS],
    })
