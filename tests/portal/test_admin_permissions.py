"""The admin's actions need the capability they exercise (scheduler_project.web.access): a staff
user with only `view_apikey` used to revoke another tenant's live key, and one with only
`view_run` to retry a dead run. Such an action is neither offered nor carried out if posted; a
read-only operator reads every model and acts on none; an operator does both."""

import pytest
from django.contrib.auth.models import Permission, User

from runs.models import Run, RunState
from schedules.models import ApiKey, Schedule
from schedules.tenants import create_api_key

from .conftest import login, make_run

pytestmark = pytest.mark.django_db


def staff_with(*codenames) -> User:
    u = User.objects.create_user("viewer", password="pw-viewer-123", is_staff=True)
    u.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return u


def post_action(client, path, action, ids):
    return client.post(path, {"action": action, "_selected_action": [str(i) for i in ids]})


def test_view_apikey_alone_cannot_revoke_a_key(other_tenant):
    key, _ = create_api_key(other_tenant, label="live")
    client = login(staff_with("view_apikey"))
    page = client.get("/admin/schedules/apikey/")
    assert page.status_code == 200 and b'value="revoke"' not in page.content
    post_action(client, "/admin/schedules/apikey/", "revoke", [key.id])
    assert ApiKey.objects.get(id=key.id).revoked_at is None


def test_view_run_alone_cannot_retry_or_cancel_a_run(schedule):
    dead = make_run(schedule, RunState.DEAD)
    ready = make_run(schedule, RunState.READY)
    client = login(staff_with("view_run"))
    page = client.get("/admin/runs/run/")
    assert page.status_code == 200
    assert b'value="retry"' not in page.content and b'value="cancel"' not in page.content
    post_action(client, "/admin/runs/run/", "retry", [dead.id])
    post_action(client, "/admin/runs/run/", "cancel", [ready.id])
    assert Run.objects.get(id=dead.id).state == RunState.DEAD
    assert Run.objects.get(id=ready.id).state == RunState.READY


def test_view_schedule_alone_cannot_pause_a_schedule(schedule):
    client = login(staff_with("view_schedule"))
    post_action(client, "/admin/schedules/schedule/", "pause", [schedule.id])
    assert Schedule.objects.get(id=schedule.id).enabled


def test_a_read_only_operator_reads_every_model_and_acts_on_none(read_only_operator, schedule, tenant):
    dead = make_run(schedule, RunState.DEAD)
    key, _ = create_api_key(tenant, label="live")
    for path in ("/admin/", "/admin/runs/run/", f"/admin/runs/run/{dead.id}/change/", "/admin/runs/attempt/",
                 "/admin/schedules/tenant/", "/admin/schedules/apikey/", "/admin/schedules/schedule/",
                 f"/admin/schedules/schedule/{schedule.id}/change/", "/admin/schedules/auditentry/"):
        assert read_only_operator.get(path).status_code == 200, path
    runs_page = read_only_operator.get("/admin/runs/run/").content
    assert b'value="retry"' not in runs_page
    post_action(read_only_operator, "/admin/runs/run/", "retry", [dead.id])
    post_action(read_only_operator, "/admin/schedules/apikey/", "revoke", [key.id])
    post_action(read_only_operator, "/admin/schedules/schedule/", "pause", [schedule.id])
    assert Run.objects.get(id=dead.id).state == RunState.DEAD
    assert ApiKey.objects.get(id=key.id).revoked_at is None
    assert Schedule.objects.get(id=schedule.id).enabled
    # Tenant memberships are managed with manage_tenants, which this role does not have.
    assert read_only_operator.get("/admin/schedules/tenantmembership/add/").status_code == 403


def test_an_operator_retries_revokes_and_pauses_through_the_admin(operator, schedule, tenant):
    dead = make_run(schedule, RunState.DEAD)
    key, _ = create_api_key(tenant, label="live")
    assert b'value="retry"' in operator.get("/admin/runs/run/").content
    post_action(operator, "/admin/runs/run/", "retry", [dead.id])
    post_action(operator, "/admin/schedules/apikey/", "revoke", [key.id])
    post_action(operator, "/admin/schedules/schedule/", "pause", [schedule.id])
    assert Run.objects.get(id=dead.id).state == RunState.READY
    assert ApiKey.objects.get(id=key.id).revoked_at is not None
    assert not Schedule.objects.get(id=schedule.id).enabled
    assert operator.get("/admin/schedules/tenantmembership/add/").status_code == 200


def test_keys_and_schedules_cannot_be_deleted_through_the_admin(operator, schedule, tenant):
    key, _ = create_api_key(tenant, label="live")
    assert operator.get(f"/admin/schedules/apikey/{key.id}/delete/").status_code == 403
    assert operator.get(f"/admin/schedules/schedule/{schedule.id}/delete/").status_code == 403
