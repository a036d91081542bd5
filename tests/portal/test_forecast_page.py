"""The forecast where users look (issue 28): the portal page with its charts (a tenant user sees
their own tenants only), the API endpoint, and the /metrics gauge."""

from datetime import timedelta

import pytest
from django.urls import reverse

from dispatch.metrics import exposition
from scheduler_project.dbclock import db_now
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
    html = operator.get(reverse("dispatch-forecast")).content.decode()
    assert 'data-testid="forecast-hour"' in html and 'data-testid="forecast-peak">2<' in html
    html = acme.get(reverse("dispatch-forecast")).content.decode()
    assert 'data-testid="forecast-peak">1<' in html  # a tenant user sees their own
    assert acme.get(reverse("dispatch-forecast"), {"tenant": str(other_tenant.id)}).status_code == 403
    text = exposition().decode()
    assert "scheduler_forecast_next_hour_peak_due 2.0" in text
