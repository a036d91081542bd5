"""Issue 26, finding 11: the portal's silences. A filter value it cannot apply is said (400, no
list), a form shows all its errors at once, a schedule is archived from the portal and the admin
(with a confirmation, audited, never by a viewer), a refused action says which role it needs, the
day chart's labels do not overlap, and the admin names its rows."""

import re

from django.contrib import admin
from django.db import models
from django.urls import reverse

from runs.models import RunState
from schedules.models import AuditEntry, MemberRole, Schedule, ScheduleStatus, TenantMembership

from .conftest import login, make_run

HX = {"HTTP_HX_REQUEST": "true"}


# --- a filter value that cannot be applied ----------------------------------------------------

def assert_said_not_listed(resp, *absent):
    html = resp.content.decode()
    assert resp.status_code == 400, resp.status_code
    assert 'data-testid="filter-errors"' in html
    for text in absent:
        assert text not in html, f"{text!r} is listed as if the filter had applied"
    return html


def test_an_invalid_filter_value_is_said_and_no_unfiltered_list_is_shown(operator, schedule):
    run = make_run(schedule, RunState.DEAD)
    html = assert_said_not_listed(operator.get(reverse("schedules-list"), {"status": "bogus"}), "nightly-report")
    assert "Status &#x27;bogus&#x27; is not one of active, paused, completed, archived" in html
    assert_said_not_listed(operator.get(reverse("schedules-list"), {"tenant": "acme"}), "nightly-report")
    assert_said_not_listed(operator.get(reverse("schedules-list"), {"status": "bogus"}, **HX), "nightly-report")
    html = assert_said_not_listed(operator.get(reverse("runs-list"), {"state": "exploded"}), str(run.id))
    assert "State &#x27;exploded&#x27;" in html
    assert_said_not_listed(operator.get(reverse("runs-list"), {"from": "yesterday"}), str(run.id))
    assert_said_not_listed(operator.get(reverse("runs-list"), {"schedule": "nightly"}, **HX), str(run.id))
    assert_said_not_listed(operator.get(reverse("runs-dlq"), {"tenant": "x"}), str(run.id))
    assert_said_not_listed(operator.get(reverse("runs-dlq"), {"view": "everything"}), str(run.id))
    assert_said_not_listed(operator.get(reverse("schedules-audit"), {"tenant": "acme"}), "schedule.create")
    # Valid values still filter as before.
    assert operator.get(reverse("runs-list"), {"state": "dead"}).status_code == 200
    assert operator.get(reverse("schedules-list"), {"status": "paused"}).status_code == 200


def test_a_bulk_action_over_a_filter_that_cannot_be_applied_does_nothing(operator, schedule):
    run = make_run(schedule, RunState.DEAD)
    resp = operator.post(reverse("runs-dlq-action"), {"view": "dead", "scope": "filter", "action": "retry",
                                                      "from": "not a date", "confirm": "yes"}, follow=True)
    assert "Nothing was done" in resp.content.decode()
    run.refresh_from_db()
    assert run.state == RunState.DEAD


# --- all errors of a form at once -------------------------------------------------------------

def test_a_form_shows_all_its_errors_at_once(operator, tenant):
    resp = operator.post(reverse("schedules-create"), {
        "tenant": str(tenant.id), "expression": "not a rule", "time_zone": "UTC",
        "target_url": "https://elsewhere.example/hook", "max_attempts": "many", "payload": "{}",
    })
    assert resp.status_code == 400
    errors = resp.context["errors"]
    # The form's own check (attempts) and the service's (expression, allowlist) in one answer.
    assert {"max_attempts", "expression", "target_url"} <= set(errors), errors
    assert "allowlist" in errors["target_url"]


def test_an_edit_form_shows_all_its_errors_at_once(operator, schedule):
    v = schedule.current
    resp = operator.post(reverse("schedules-edit", args=[schedule.id]), {
        "version": "1", "name": v.name, "expression": "0 2 * * *", "time_zone": "Mars/Olympus",
        "target_url": v.target_url, "catchup_limit": "-3", "payload": "{",
    })
    assert resp.status_code == 400
    assert {"catchup_limit", "payload", "time_zone"} <= set(resp.context["errors"]), resp.context["errors"]


def test_the_tenant_settings_form_shows_all_its_errors_at_once(operator, tenant):
    resp = operator.post(reverse("schedules-tenant-settings", args=[tenant.id]),
                         {"notification_url": "ftp://x", "max_in_flight": "many", "max_schedules": "-1"}, follow=True)
    html = resp.content.decode()
    for field in ("Notification webhook URL", "Max runs in flight", "Schedule quota"):
        assert f"{field}:" in html, field
    html = operator.post(reverse("schedules-target-add", args=[tenant.id]),
                         {"prefix": "not a url", "max_concurrency": "0"}, follow=True).content.decode()
    assert "Prefix:" in html and "Max concurrency:" in html


# --- archiving --------------------------------------------------------------------------------

def test_a_schedule_is_archived_from_the_portal_after_a_confirmation(operator, schedule):
    url = reverse("schedules-archive", args=[schedule.id])
    assert b"Archive\xe2\x80\xa6" in operator.get(reverse("schedules-detail", args=[schedule.id])).content
    asked = operator.post(url, **HX)
    assert asked.status_code == 200 and "Yes, archive it" in asked.content.decode()
    assert Schedule.objects.get(id=schedule.id).status == ScheduleStatus.ACTIVE
    done = operator.post(url, {"confirm": "yes"}, follow=True)
    assert "Archived." in done.content.decode()
    assert Schedule.objects.get(id=schedule.id).status == ScheduleStatus.ARCHIVED
    entry = AuditEntry.objects.get(action="schedule.archive", object_id=str(schedule.id))
    assert entry.actor == "user:olga"


def test_a_tenant_viewer_cannot_archive_and_is_told_which_role_it_needs(schedule, acme_user):
    TenantMembership.objects.filter(user=acme_user).update(role=MemberRole.VIEWER)
    viewer = login(acme_user)
    assert b"Archive\xe2\x80\xa6" not in viewer.get(reverse("schedules-detail", args=[schedule.id])).content
    resp = viewer.post(reverse("schedules-archive", args=[schedule.id]), {"confirm": "yes"})
    assert resp.status_code == 403
    html = resp.content.decode()
    assert "needs the Operator role, or the admin role in this tenant" in html
    assert "Your account is a viewer in this tenant" in html
    assert "<h1>" in html and "Dashboard" in html  # the portal's page, not a bare "403 Forbidden"
    assert Schedule.objects.get(id=schedule.id).status == ScheduleStatus.ACTIVE


def test_a_read_only_operator_gets_a_page_saying_which_role_is_needed(read_only_operator, schedule):
    resp = read_only_operator.post(reverse("schedules-pause", args=[schedule.id]), {"confirm": "yes"})
    assert resp.status_code == 403
    html = resp.content.decode()
    assert "needs the Operator role" in html and "Read-only operator" in html


def test_a_schedule_is_archived_from_the_admin_after_a_confirmation(operator, read_only_operator, schedule):
    url = reverse("admin:schedules_schedule_changelist")
    asked = operator.post(url, {"action": "archive", "_selected_action": [schedule.id]})
    assert asked.status_code == 200 and "Yes, archive them" in asked.content.decode()
    assert Schedule.objects.get(id=schedule.id).status == ScheduleStatus.ACTIVE
    # The read-only role has no such action.
    read_only_operator.post(url, {"action": "archive", "_selected_action": [schedule.id], "post": "yes"})
    assert Schedule.objects.get(id=schedule.id).status == ScheduleStatus.ACTIVE
    done = operator.post(url, {"action": "archive", "_selected_action": [schedule.id], "post": "yes"}, follow=True)
    assert "rchived 1 schedule" in done.content.decode()
    assert Schedule.objects.get(id=schedule.id).status == ScheduleStatus.ARCHIVED
    assert AuditEntry.objects.filter(action="schedule.archive", actor="user:olga").count() == 1


# --- the day chart ----------------------------------------------------------------------------

def test_the_day_charts_labels_do_not_overlap():
    from datetime import datetime, timedelta, timezone
    from zoneinfo import ZoneInfo

    from scheduler_project.web.portal import charts

    now = datetime(2026, 12, 1, 14, 23, tzinfo=timezone.utc)
    for name, (window, bucket) in charts.RANGES.items():
        n = int(window / bucket)
        points = [charts.Point(start=now - window + k * bucket) for k in range(n)]
        for tz in (ZoneInfo("UTC"), ZoneInfo("Europe/Berlin"), ZoneInfo("Asia/Kathmandu")):
            svg = charts.outcome_chart(charts.Series(name, window, bucket, points, now), tz)
            labels = re.findall(r'<text class="axis" x="([\d.]+)" y="[\d.]+" text-anchor="(\w+)">([^<]+)</text>', svg)
            axis = [(float(x), a, t) for x, a, t in labels if a != "end" or not t.strip().replace(",", "").isdigit()]
            axis = axis[-5:]  # the five time labels come last
            boxes = []
            for x, anchor, text in axis:
                width = len(text) * 7.2  # a 12-unit font, a little wider than its digits
                left = {"start": x, "middle": x - width / 2, "end": x - width}[anchor]
                boxes.append((left, left + width, text))
            for (l1, r1, t1), (l2, r2, t2) in zip(boxes, boxes[1:]):
                assert r1 + 4 <= l2, f"{name} chart in {tz}: {t1!r} overlaps {t2!r}"
            assert boxes[0][0] >= 0 and boxes[-1][1] <= charts.W


# --- the admin names its rows -----------------------------------------------------------------

def test_every_admin_model_has_a_readable_name(operator, acme_user, schedule):
    for model in admin.site._registry:
        assert model.__str__ is not models.Model.__str__, f"{model.__name__} shows as '{model.__name__} object (1)'"
    html = operator.get(reverse("admin:schedules_tenantmembership_changelist")).content.decode()
    assert "alice in acme (admin)" in html and "TenantMembership object" not in html
    entry = AuditEntry.objects.filter(object_id=str(schedule.id)).first()
    assert str(entry) == f"schedule.create of schedule {schedule.id} by user:tests"
