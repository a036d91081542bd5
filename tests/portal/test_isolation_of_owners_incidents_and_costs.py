"""Tenant isolation on the pages about owners, incidents, retry cost and the forecast: another
tenant's owner or incident answers 404 to every page and action (never 403: its existence does not
leak) and changes nothing; the lists and rankings never show it, even when filtered by its ids.
The same pages show it to an operator, so the checks below look where the other tenant's data
really is."""

import re

import pytest
from django.urls import reverse

from dispatch.models import Incident, IncidentRule, IncidentState, Notification
from runs.models import Run, RunState
from scheduler_project.foundation.dbclock import db_now
from schedules.models import Owner, Schedule
from schedules.owners import create_owner
from tests.helpers import ACTOR

from .conftest import make_run

pytestmark = pytest.mark.django_db

SECRETS = ("globex-sync", "globex-owner", "globex-only incident", "globex-only error text")


@pytest.fixture
def theirs(other_tenant, other_schedule, target):
    owner = create_owner(other_tenant, {"slug": "globex-owner", "name": "globex-owner",
                                        "webhook_url": target.url + "/hooks/globex"}, by=ACTOR)
    # Their schedule is their owner's, so a filter by that owner would select their dead runs.
    Schedule.objects.filter(id=other_schedule.id).update(owner=owner)
    for _ in range(2):
        make_run(other_schedule, RunState.DEAD, error="globex-only error text")
    now = db_now()
    incident = Incident.objects.create(tenant=other_tenant, schedule=other_schedule, owner=owner,
                                       rule=IncidentRule.CONSECUTIVE_FAILURES, summary="globex-only incident",
                                       opened_at=now, last_seen_at=now)
    return {"owner": owner, "incident": incident, "schedule": other_schedule}


def test_another_tenants_owner_and_incident_answer_404_and_change_nothing(acme, owners_mine, theirs):
    o, i, s = theirs["owner"].id, theirs["incident"].id, theirs["schedule"].id
    notifications = Notification.objects.count()
    limit_before = theirs["owner"].max_per_hour
    for method, url, data in [
        ("get", reverse("incidents-owner", args=[o]), {}),
        ("post", reverse("incidents-owner-test", args=[o]), {}),
        ("post", reverse("incidents-owner-settings", args=[o]),
         {"webhook_url": "", "quiet_start": "01:00", "quiet_end": "02:00", "max_per_hour": "1"}),
        ("post", reverse("incidents-acknowledge", args=[i]), {}),
        ("post", reverse("incidents-resolve", args=[i]), {}),
        ("post", reverse("schedules-owner", args=[s]), {"owner": str(owners_mine.id)}),
    ]:
        r = getattr(acme, method)(url, data)
        assert r.status_code == 404, (method, url, r.status_code)
        for secret in SECRETS:
            assert secret.encode() not in r.content, (url, secret)
    owner = Owner.objects.get(id=o)
    assert owner.webhook_url.endswith("/hooks/globex") and owner.max_per_hour == limit_before
    assert owner.quiet_start is None
    assert Incident.objects.get(id=i).state == IncidentState.OPEN
    assert Incident.objects.get(id=i).acknowledged_at is None
    assert Schedule.objects.get(id=s).owner_id == o
    assert Notification.objects.count() == notifications


@pytest.mark.parametrize("name,params", [
    ("incidents-list", {}), ("incidents-list", {"state": "open"}),
    ("incidents-retry-cost", {}), ("incidents-retry-cost", {"window": "7d"}),
    ("incidents-retry-cost", {"by": "owner"}), ("incidents-retry-cost", {"by": "host"}),
    # The cost page takes the tenant to rank from the query: another tenant's id shows one's own.
    ("incidents-retry-cost", {"tenant": "THEIR_TENANT"}), ("incidents-retry-cost", {"tenant": "THEIR_TENANT", "by": "owner"}),
    ("dispatch-forecast", {}), ("dispatch-forecast", {"tenant": "THEIR_TENANT"}),
    ("runs-dlq", {"owner": "THEIR_OWNER"}), ("runs-dlq", {"group": "owner"}),
])
def test_the_lists_never_show_another_tenants_owners_incidents_or_costs(acme, operator, schedule, theirs,
                                                                        other_tenant, name, params):
    make_run(schedule, RunState.DEAD, error="acme error text")
    params = {k: {"THEIR_TENANT": str(other_tenant.id), "THEIR_OWNER": str(theirs["owner"].id)}.get(v, v)
              for k, v in params.items()}
    mine = acme.get(reverse(name), params)
    # The forecast answers another tenant's id with 403, as it does any id not one of the member's.
    refused = name == "dispatch-forecast" and "tenant" in params
    assert mine.status_code == (403 if refused else 200), (name, mine.status_code)
    # Forms echo the filter the user typed (as field values); only what the page found is checked.
    html = re.sub(r'value="[^"]*"', "", mine.content.decode())
    html = re.sub(r'\?[^"\s]*owner=[0-9a-f-]{36}', "", html)
    for secret in SECRETS + (str(theirs["schedule"].id), str(theirs["owner"].id)):
        assert secret not in html, (name, params, secret)
    if name.startswith("incidents-"):
        # The operator's page lists the other tenant's data: the check above is not looking at an empty page.
        seen = operator.get(reverse(name), {**params, "tenant": str(other_tenant.id)}).content.decode()
        assert any(secret in seen for secret in SECRETS), (name, params)


def test_a_bulk_retry_filtered_by_another_tenants_owner_retries_nothing_of_theirs(acme, schedule, theirs):
    their_dead = set(Run.objects.filter(schedule=theirs["schedule"], state=RunState.DEAD).values_list("id", flat=True))
    assert their_dead
    mine = make_run(schedule, RunState.DEAD)
    data = {"view": "dead", "action": "retry", "scope": "filter", "owner": str(theirs["owner"].id), "confirm": "yes"}
    acme.post(reverse("runs-dlq-action"), data)
    assert set(Run.objects.filter(id__in=their_dead, state=RunState.DEAD).values_list("id", flat=True)) == their_dead
    assert Run.objects.get(id=mine.id).state == RunState.DEAD  # the filter selected none of mine either


@pytest.fixture
def owners_mine(tenant):
    return create_owner(tenant, {"slug": "acme-team", "name": "Acme team"}, by=ACTOR)


def test_a_members_forecast_counts_only_their_tenants_schedules(acme, operator, schedule, theirs):
    mine = acme.get(reverse("dispatch-forecast")).context["f"]
    everyone = operator.get(reverse("dispatch-forecast")).context["f"]
    assert mine.schedules_counted == Schedule.objects.filter(tenant_id=schedule.tenant_id, enabled=True).count()
    assert everyone.schedules_counted == mine.schedules_counted + 1  # theirs
    assert sum(b.due for b in everyone.tiers["hour"]) > sum(b.due for b in mine.tiers["hour"])
