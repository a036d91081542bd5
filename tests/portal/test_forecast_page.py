"""The forecast where users look (issue 28): the portal page with its charts (a tenant user sees
their own tenants only), the API endpoint, and the /metrics gauge."""

from datetime import timedelta

import pytest
from django.urls import reverse

from dispatch.metrics import exposition
from scheduler_project.foundation.dbclock import db_now
from tests.helpers import make_schedule

pytestmark = pytest.mark.django_db


def _minute_ahead(minutes=30):
    return (db_now() + timedelta(minutes=minutes)).replace(second=0, microsecond=0)


def test_the_page_the_api_and_metrics(tenant, other_tenant, target, api, operator, acme):
    minute = _minute_ahead()
    make_schedule(tenant, target.url + "/d", expression=f"{minute.minute} {minute.hour} * * *")
    make_schedule(other_tenant, target.url + "/d", expression=f"{minute.minute} {minute.hour} * * *")
    body = api.get("/api/v1/forecast").json()
    assert body["method"] == "exact" and body["nextHourPeak"]["due"] == 1  # its own tenant only
    assert len(body["tiers"]["hour"]) == 61 and len(body["tiers"]["day"]) == 289 and len(body["tiers"]["week"]) == 169
    assert api.get("/api/v1/forecast", {"bogus": "1"}).status_code == 400
    # A host that names no target (the fuzzer's NUL was a 500 from PostgreSQL) is a 400 with a message.
    bad = api.get("/api/v1/forecast", {"host": "a\x00b"})
    assert bad.status_code == 400 and "host:port" in str(bad.json()["errors"]["host"])
    assert api.get("/api/v1/forecast", {"host": f"127.0.0.1:{target.port}"}).json()["nextHourPeak"]["due"] == 1
    html = operator.get(reverse("dispatch-forecast")).content.decode()
    assert 'data-testid="forecast-hour"' in html and 'data-testid="forecast-peak">2<' in html
    html = acme.get(reverse("dispatch-forecast")).content.decode()
    assert 'data-testid="forecast-peak">1<' in html  # a tenant user sees their own
    assert acme.get(reverse("dispatch-forecast"), {"tenant": str(other_tenant.id)}).status_code == 403
    text = exposition().decode()
    assert "scheduler_forecast_next_hour_peak_due 2.0" in text


def test_shaping_a_surge_previews_the_flattened_forecast_then_applies_one_audited_change(operator, tenant, target):
    from runs import actions
    from schedules.models import AuditEntry, Schedule
    from tests.helpers import ACTOR

    minute = _minute_ahead()
    expr = f"{minute.minute} {minute.hour} * * *"
    items = [{"expression": expr, "time_zone": "UTC", "target_url": target.url + "/d"} for _ in range(300)]
    actions.create_schedules(tenant, items, by=ACTOR, now=db_now())
    other = make_schedule(tenant, target.url + "/d", expression="0 0 * * *")  # not selected
    query = {"shape": "1", "shape_tenant": str(tenant.id), "shape_expression": expr, "spread": "600"}
    html = operator.get(reverse("dispatch-forecast"), query).content.decode()
    assert "<strong>300</strong> schedules" in html
    assert 'data-testid="shape-before">300<' in html
    after = int(html.split('data-testid="shape-after">')[1].split("<")[0])
    assert after <= 60  # at most twice a tenth of them in any one minute of the ten
    assert not Schedule.objects.filter(tenant=tenant, current__spread_seconds=600).exists()  # a preview changes nothing
    resp = operator.post(reverse("dispatch-forecast-spread"),
                         {"tenant": str(tenant.id), "expression": expr, "host": "", "spread": "600"})
    assert resp.status_code == 302
    assert Schedule.objects.filter(tenant=tenant, current__spread_seconds=600, version=2).count() == 300
    other.refresh_from_db()
    assert other.version == 1
    (entry,) = AuditEntry.objects.filter(action="schedule.bulk_spread")
    assert entry.after["changed"] == 300 and entry.after["spreadSeconds"] == 600
    # The forecast now shows the flattened shape the preview showed.
    html = operator.get(reverse("dispatch-forecast"), {"tenant": str(tenant.id)}).content.decode()
    assert f'data-testid="forecast-peak">{after}<' in html


def test_a_tenant_viewer_may_preview_but_not_apply(tenant, target, acme_user):
    from schedules.models import MemberRole, TenantMembership
    from tests.portal.conftest import login

    TenantMembership.objects.filter(user=acme_user).update(role=MemberRole.VIEWER)
    client = login(acme_user)
    make_schedule(tenant, target.url + "/d", expression="0 0 * * *")
    html = client.get(reverse("dispatch-forecast"), {"shape": "1", "shape_tenant": str(tenant.id),
                                                     "spread": "600"}).content.decode()
    assert 'data-testid="shape-preview"' in html and "Apply a 600 s spread" not in html
    resp = client.post(reverse("dispatch-forecast-spread"), {"tenant": str(tenant.id), "spread": "600"})
    assert resp.status_code == 403
