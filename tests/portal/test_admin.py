"""The admin as the safe back office (item 7): run and attempt rows read-only, actions narrowed
to valid states and made by the same services as the API and the portal."""

from django.urls import reverse

from runs.models import Run, RunState
from schedules.models import AuditEntry, TargetPrefix

from .conftest import make_run


def superuser_client(client, django_user_model):
    admin = django_user_model.objects.create_superuser("root", password="pw-root-123")
    client.force_login(admin)
    return client


def test_run_rows_are_read_only(client, django_user_model, schedule):
    c = superuser_client(client, django_user_model)
    run = make_run(schedule, RunState.DEAD)
    page = c.get(reverse("admin:runs_run_change", args=[run.id]))
    assert page.status_code == 200 and b'name="state"' not in page.content
    c.post(reverse("admin:runs_run_change", args=[run.id]), {"state": "succeeded"})
    assert Run.objects.get(id=run.id).state == RunState.DEAD
    assert c.get(reverse("admin:runs_run_add")).status_code == 403
    assert c.get(reverse("admin:runs_attempt_change", args=[run.attempts.get().id])).status_code == 200
    assert b'name="outcome"' not in c.get(reverse("admin:runs_attempt_change", args=[run.attempts.get().id])).content


def test_the_retry_action_uses_the_service_and_skips_runs_in_other_states(client, django_user_model, schedule):
    c = superuser_client(client, django_user_model)
    dead = make_run(schedule, RunState.DEAD)
    ok = make_run(schedule, RunState.SUCCEEDED)
    r = c.post(reverse("admin:runs_run_changelist"), {"action": "retry", "_selected_action": [dead.id, ok.id]}, follow=True)
    assert b"etried 1 run; 1 left alone" in r.content
    assert Run.objects.get(id=dead.id).state == RunState.READY
    assert Run.objects.get(id=ok.id).state == RunState.SUCCEEDED
    assert AuditEntry.objects.filter(action="run.retry", actor="user:root").count() == 1


def test_the_tenant_allowlist_is_not_edited_behind_the_audit_log(client, django_user_model, tenant):
    c = superuser_client(client, django_user_model)
    page = c.get(reverse("admin:schedules_tenant_change", args=[tenant.id])).content.decode()
    assert 'name="targets-0-prefix"' not in page and 'name="notification_url"' not in page
    before = list(TargetPrefix.objects.filter(tenant=tenant).values_list("prefix", flat=True))
    assert before


def test_the_action_report_does_not_count_the_runs_it_just_changed(client, django_user_model, schedule):
    c = superuser_client(client, django_user_model)
    dead = make_run(schedule, RunState.DEAD)
    r = c.post(reverse("admin:runs_run_changelist"), {"action": "retry", "_selected_action": [dead.id]}, follow=True)
    assert b"etried 1 run" in r.content
    assert b"left alone" not in r.content
