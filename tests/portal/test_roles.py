"""Operator capability is explicit: the "Operator" role may do everything, the "Read-only operator"
role sees every tenant and changes nothing (buttons hidden, and the same requests refused with 403
if sent anyway), and a staff account without a role is no operator at all (it used to be a full
one: it minted an API key for a tenant and widened its allowlist). Tenant users keep operating
their own tenants through their membership."""

import pytest
from django.contrib.auth.models import Group, User
from django.urls import reverse

from runs.models import Run, RunState
from scheduler_project.web.access import ROLE_OPERATOR, ROLE_READ_ONLY, can, is_operator
from schedules.models import ApiKey, AuditEntry, Schedule, TargetPrefix, Tenant
from schedules.tenants import create_api_key

from .conftest import login, make_run

pytestmark = pytest.mark.django_db


def test_the_migration_makes_both_roles_with_their_permissions():
    operator = set(Group.objects.get(name=ROLE_OPERATOR).permissions.values_list("codename", flat=True))
    read_only = set(Group.objects.get(name=ROLE_READ_ONLY).permissions.values_list("codename", flat=True))
    assert operator == {"view_all_tenants", "operate_runs", "operate_schedules", "manage_api_keys", "manage_tenants"}
    assert read_only == {"view_all_tenants"}


def test_capabilities_follow_the_roles(operator_user, read_only_operator_user, staff_without_role_user, acme_user,
                                       tenant, other_tenant):
    superuser = User.objects.create_superuser("root", password="pw-root-123")
    for cap in ("view_all", "operate_runs", "operate_schedules", "manage_keys", "manage_tenants"):
        assert can(operator_user, cap) and can(superuser, cap)
        assert not can(staff_without_role_user, cap, tenant.id)
    assert can(read_only_operator_user, "view_all")
    for cap in ("operate_runs", "operate_schedules", "manage_keys", "manage_tenants"):
        assert not can(read_only_operator_user, cap, tenant.id)
    # A tenant member operates its own tenant, not another, and never manages tenant settings.
    assert can(acme_user, "operate_runs", tenant.id) and not can(acme_user, "operate_runs", other_tenant.id)
    assert can(acme_user, "manage_keys", tenant.id) and not can(acme_user, "manage_tenants", tenant.id)
    assert not is_operator(acme_user) and not is_operator(staff_without_role_user)


def test_a_staff_account_without_a_role_sees_nothing_and_changes_nothing(staff_without_role, tenant, schedule):
    dead = make_run(schedule, RunState.DEAD)
    assert staff_without_role.get("/").status_code == 403
    assert staff_without_role.get(reverse("schedules-tenant-detail", args=[tenant.id])).status_code == 403
    attempts = [
        (reverse("schedules-key-create", args=[tenant.id]), {"label": "minted"}),
        (reverse("schedules-target-add", args=[tenant.id]), {"prefix": "https://evil.example/"}),
        (reverse("schedules-tenant-settings", args=[tenant.id]), {"notification_url": "https://evil.example/"}),
        (reverse("runs-retry", args=[dead.id]), {}),
        (reverse("schedules-pause", args=[schedule.id]), {}),
    ]
    for path, data in attempts:
        assert staff_without_role.post(path, data).status_code in (403, 404), path
    assert not ApiKey.objects.filter(label="minted").exists()
    assert not TargetPrefix.objects.filter(prefix="https://evil.example/").exists()
    assert Tenant.objects.get(id=tenant.id).notification_url == ""
    assert Run.objects.get(id=dead.id).state == RunState.DEAD
    assert Schedule.objects.get(id=schedule.id).enabled


def action_pages(tenant, schedule, other_schedule):
    """Pages and the actions whose forms they show an operator (and must not show a read-only one)."""
    dead = make_run(schedule, RunState.DEAD)
    ready = make_run(other_schedule, RunState.READY)
    key, _ = create_api_key(tenant, label="service")
    return {
        reverse("runs-detail", args=[dead.id]): [reverse("runs-retry", args=[dead.id])],
        reverse("runs-detail", args=[ready.id]): [reverse("runs-cancel", args=[ready.id])],
        reverse("schedules-detail", args=[schedule.id]): [reverse(name, args=[schedule.id]) for name in (
            "schedules-pause", "schedules-trigger", "schedules-backfill")],
        reverse("runs-dlq"): [reverse("runs-dlq-action"), 'name="ids"'],
        reverse("schedules-tenant-detail", args=[tenant.id]): [
            reverse("schedules-key-create", args=[tenant.id]), reverse("schedules-key-revoke", args=[tenant.id, key.id]),
            reverse("schedules-target-add", args=[tenant.id]), reverse("schedules-tenant-settings", args=[tenant.id])],
    }


@pytest.mark.parametrize("persona", ["operator", "read_only_operator"])
def test_action_forms_are_shown_to_the_operator_role_only(persona, request, tenant, other_tenant, schedule,
                                                          other_schedule):
    client = request.getfixturevalue(persona)
    for path, actions in action_pages(tenant, schedule, other_schedule).items():
        resp = client.get(path)
        assert resp.status_code == 200, path
        html = resp.content.decode()
        for action in actions:
            assert (action in html) == (persona == "operator"), (persona, path, action)


def test_a_read_only_operator_sees_every_tenant(read_only_operator, tenant, other_tenant,
                                                schedule, other_schedule):
    dead = make_run(schedule, RunState.DEAD)
    ready = make_run(other_schedule, RunState.READY)
    for path in (reverse("runs-detail", args=[dead.id]), reverse("runs-detail", args=[ready.id]),
                 reverse("schedules-tenant-detail", args=[other_tenant.id]), reverse("schedules-audit")):
        assert read_only_operator.get(path).status_code == 200, path
    assert "globex-sync" in read_only_operator.get(reverse("schedules-list")).content.decode()
    assert "Operators manage this list" in read_only_operator.get(
        reverse("schedules-tenant-detail", args=[tenant.id])).content.decode()


def test_a_read_only_operator_is_refused_every_change_with_403_and_nothing_changes(read_only_operator, tenant,
                                                                                   schedule):
    dead = make_run(schedule, RunState.DEAD)
    ready = make_run(schedule, RunState.READY)
    key, _ = create_api_key(tenant, label="service")
    before = AuditEntry.objects.count()
    attempts = [
        (reverse("runs-retry", args=[dead.id]), {}),
        (reverse("runs-cancel", args=[ready.id]), {}),
        (reverse("runs-dlq-action"), {"action": "retry", "scope": "selected", "ids": [str(dead.id)], "confirm": "yes"}),
        (reverse("schedules-pause", args=[schedule.id]), {}),
        (reverse("schedules-trigger", args=[schedule.id]), {}),
        (reverse("schedules-backfill", args=[schedule.id]), {"start": "2026-01-01T00:00", "end": "2026-01-02T00:00",
                                                             "confirm": "yes"}),
        (reverse("schedules-key-create", args=[tenant.id]), {"label": "minted"}),
        (reverse("schedules-key-revoke", args=[tenant.id, key.id]), {}),
        (reverse("schedules-target-add", args=[tenant.id]), {"prefix": "https://wider.example/"}),
        (reverse("schedules-target-remove", args=[tenant.id, tenant.targets.get().id]), {}),
        (reverse("schedules-tenant-settings", args=[tenant.id]), {"notification_url": "https://x.example/",
                                                                  "max_in_flight": "5"}),
    ]
    for path, data in attempts:
        assert read_only_operator.post(path, data).status_code == 403, path
    assert read_only_operator.get(reverse("schedules-backfill", args=[schedule.id])).status_code == 403
    assert AuditEntry.objects.count() == before
    assert Run.objects.get(id=dead.id).state == RunState.DEAD and Run.objects.get(id=ready.id).state == RunState.READY
    assert ApiKey.objects.get(id=key.id).revoked_at is None and not ApiKey.objects.filter(label="minted").exists()
    assert tenant.targets.count() == 1 and Tenant.objects.get(id=tenant.id).max_in_flight is None


def test_the_operator_role_may_do_each_of_those(operator, tenant, schedule):
    dead = make_run(schedule, RunState.DEAD)
    assert operator.post(reverse("runs-retry", args=[dead.id])).status_code == 302
    assert Run.objects.get(id=dead.id).state == RunState.READY
    assert operator.post(reverse("schedules-key-create", args=[tenant.id]), {"label": "ops"}).status_code == 200
    assert ApiKey.objects.filter(label="ops", created_by="user:olga").exists()
    operator.post(reverse("schedules-target-add", args=[tenant.id]), {"prefix": "https://more.example/"})
    assert tenant.targets.filter(prefix="https://more.example/").exists()


def test_a_tenant_user_still_operates_its_own_tenant(acme, tenant, schedule):
    dead = make_run(schedule, RunState.DEAD)
    assert acme.post(reverse("runs-retry", args=[dead.id])).status_code == 302
    assert Run.objects.get(id=dead.id).state == RunState.READY
    assert acme.post(reverse("schedules-key-create", args=[tenant.id]), {"label": "mine"}).status_code == 200
    assert ApiKey.objects.filter(label="mine").exists()
    html = acme.get(reverse("schedules-detail", args=[schedule.id])).content.decode()
    assert "Pause" in html and "Trigger now" in html


def test_a_superuser_is_an_operator_without_a_role(tenant, schedule):
    root = login(User.objects.create_superuser("root", password="pw-root-123"))
    dead = make_run(schedule, RunState.DEAD)
    assert "Retry" in root.get(reverse("runs-detail", args=[dead.id])).content.decode()
    assert root.post(reverse("runs-retry", args=[dead.id])).status_code == 302
