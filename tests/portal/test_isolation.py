"""Tenant isolation on every tenant page: another tenant's object answers 404 (never 403, so its
existence does not leak) and lists never include it. Operators see everything."""

import re

import pytest
from django.urls import reverse

from runs.models import Run, RunState
from schedules.models import ApiKey, Schedule
from schedules.tenants import create_api_key

from .conftest import make_run


@pytest.fixture
def theirs(other_schedule, other_tenant):
    dead = make_run(other_schedule, RunState.DEAD, error="globex-only error text")
    key, _ = create_api_key(other_tenant, label="globex-key")
    return {"schedule": other_schedule, "run": dead, "tenant": other_tenant, "key": key}


def object_pages(t):
    s, r, tn, k = t["schedule"].id, t["run"].id, t["tenant"].id, t["key"].id
    return [
        ("get", reverse("schedules-detail", args=[s])),
        ("get", reverse("schedules-backfill", args=[s])),
        ("post", reverse("schedules-pause", args=[s])),
        ("post", reverse("schedules-resume", args=[s])),
        ("post", reverse("schedules-trigger", args=[s])),
        ("post", reverse("schedules-backfill", args=[s])),
        ("get", reverse("runs-detail", args=[r])),
        ("post", reverse("runs-retry", args=[r])),
        ("post", reverse("runs-cancel", args=[r])),
        ("get", reverse("schedules-tenant-detail", args=[tn])),
        ("post", reverse("schedules-key-create", args=[tn])),
        ("post", reverse("schedules-key-revoke", args=[tn, k])),
        ("post", reverse("schedules-tenant-settings", args=[tn])),
        ("post", reverse("schedules-target-add", args=[tn])),
    ]


def test_every_page_about_another_tenants_object_answers_404(acme, schedule, theirs):
    for method, url in object_pages(theirs):
        r = getattr(acme, method)(url, {"start": "2026-01-01T00:00", "end": "2026-01-02T00:00", "confirm": "yes"}
                                  if "backfill" in url and method == "post" else {})
        assert r.status_code == 404, (method, url, r.status_code)
        assert b"globex" not in r.content
    # and nothing changed
    assert Schedule.objects.get(id=theirs["schedule"].id).enabled
    assert Run.objects.get(id=theirs["run"].id).state == RunState.DEAD
    assert Run.objects.filter(schedule=theirs["schedule"]).count() == 1
    assert ApiKey.objects.get(id=theirs["key"].id).revoked_at is None
    assert not ApiKey.objects.filter(tenant=theirs["tenant"]).exclude(id=theirs["key"].id).exists()


def test_another_tenants_key_cannot_be_revoked_through_my_tenant(acme, tenant, theirs):
    r = acme.post(reverse("schedules-key-revoke", args=[tenant.id, theirs["key"].id]))
    assert r.status_code == 404
    assert ApiKey.objects.get(id=theirs["key"].id).revoked_at is None


@pytest.mark.parametrize("name,params", [
    ("runs-dashboard", {}), ("runs-list", {}), ("runs-list", {"state": "dead"}),
    ("runs-dlq", {}), ("schedules-list", {}), ("schedules-audit", {}),
    # Filtering by the other tenant's ids must not reveal them either.
    ("runs-list", {"tenant": "THEIR_TENANT"}), ("runs-list", {"schedule": "THEIR_SCHEDULE"}),
    ("runs-dlq", {"schedule": "THEIR_SCHEDULE"}), ("schedules-list", {"tenant": "THEIR_TENANT"}),
    ("schedules-audit", {"tenant": "THEIR_TENANT"}),
])
def test_lists_never_include_another_tenants_objects(acme, schedule, theirs, name, params):
    make_run(schedule, RunState.DEAD, error="acme error text")
    params = {k: {"THEIR_TENANT": theirs["tenant"].id, "THEIR_SCHEDULE": theirs["schedule"].id}.get(v, v)
              for k, v in params.items()}
    html = acme.get(reverse(name), params).content.decode()
    # Forms echo the filter the user typed (as field values); only what the page found is checked.
    html = re.sub(r'value="[^"]*"', "", html.split('id="results"', 1)[-1])
    assert "acme" in html or params or name == "schedules-audit"
    for secret in (str(theirs["run"].id), str(theirs["schedule"].id), "globex-sync", "globex-only error text", "globex-key"):
        assert secret not in html, (name, secret)


def test_a_tenant_user_can_act_on_their_own_objects(acme, schedule):
    run = make_run(schedule, RunState.DEAD)
    assert acme.get(reverse("runs-detail", args=[run.id])).status_code == 200
    assert acme.post(reverse("runs-retry", args=[run.id])).status_code == 302
    assert acme.post(reverse("schedules-trigger", args=[schedule.id]), {"confirm": "yes"}).status_code == 302
    assert Run.objects.get(id=run.id).state == RunState.READY


def test_operators_reach_every_tenants_objects(operator, theirs):
    for method, url in object_pages(theirs):
        if method == "get":
            assert operator.get(url).status_code == 200, url


def test_a_malformed_id_is_a_404_not_a_500(acme):
    assert acme.get("/runs/not-a-uuid/").status_code == 404
