"""A tenant's page says how much of its schedule quotas is in use, to its own users and to
operators, from the counts the database keeps (schedules.models.TenantScheduleCount)."""

import re

from django.urls import reverse

from runs import actions
from tests.helpers import ACTOR, make_schedule


def quota_use(html: str) -> str:
    start = html.index('data-testid="quota-use"')
    return re.sub(r"\s+", " ", html[start:html.index("</dl>", start)])


def test_the_tenant_page_says_how_much_of_its_quotas_is_used(acme, operator, tenant, other_tenant, target, settings):
    settings.SCHEDULER_MAX_SCHEDULES_PER_TENANT = 50
    settings.SCHEDULER_MAX_SUBMINUTE_SCHEDULES_PER_TENANT = 0
    url = target.url + "/hook"
    kept = make_schedule(tenant, url, expression="rate(1 hour)")
    make_schedule(tenant, url, expression="RRULE:FREQ=SECONDLY")
    gone = make_schedule(tenant, url, expression="rate(1 hour)")
    actions.archive_schedule(gone, by=ACTOR)
    make_schedule(other_tenant, url, expression="rate(1 hour)")
    assert kept.status == "active"
    for client in (acme, operator):
        part = quota_use(client.get(reverse("schedules-tenant-detail", args=[tenant.id])).content.decode())
        assert "Schedules in use</dt><dd>2 of 50</dd>" in part
        assert "Sub-minute in use</dt><dd>1 (no quota)</dd>" in part
