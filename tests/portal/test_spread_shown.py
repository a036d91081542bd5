"""Spread where users look (issue 28): the API's schedule, preview and run fields, and the portal's
schedule form, schedule page and run page ("due 00:00, starts 00:07:13 within its 10-minute
spread")."""

from datetime import timedelta

import pytest
from django.urls import reverse

from runs.models import Run
from scheduler_project.foundation.dbclock import db_now
from schedules.models import Schedule
from schedules.spread import spread_offset
from tests.portal.test_schedule_form_refuses_what_the_api_refuses import form
from tests.timesched.support import scan_until_idle

pytestmark = pytest.mark.django_db


def _body(target, **over):
    return {"expression": "0 0 * * *", "timeZone": "UTC", "target": {"url": target.url + "/hook"}, **over}


def test_the_api_takes_spread_seconds_and_shows_the_offset_and_each_occurrences_start(api, target):
    resp = api.post("/api/v1/schedules", _body(target, spreadSeconds=600), format="json")
    assert resp.status_code == 201, resp.content
    body = resp.json()
    offset = spread_offset(body["id"], 600)
    assert body["spreadSeconds"] == 600 and body["spreadOffsetSeconds"] == offset
    occs = api.get(f"/api/v1/schedules/{body['id']}/occurrences?count=3").json()["occurrences"]
    assert len(occs) == 3
    for o in occs:
        at = o["at"].replace("Z", "+00:00")
        from datetime import datetime
        assert datetime.fromisoformat(o["startsAt"].replace("Z", "+00:00")) == \
            datetime.fromisoformat(at) + timedelta(seconds=offset)


@pytest.mark.parametrize("value, words", [(86_400, "shortest interval"), (-1, "greater than or equal"),
                                          ("600", "valid integer"), (600.5, "valid integer")])
def test_the_api_refuses_a_spread_that_does_not_fit_with_a_message(api, target, value, words):
    resp = api.post("/api/v1/schedules", _body(target, spreadSeconds=value), format="json")
    assert resp.status_code == 400, resp.content
    assert "spreadSeconds" in resp.json()["errors"] and words in str(resp.json()["errors"]["spreadSeconds"])
    assert not Schedule.objects.exists()


def test_a_patch_of_spread_seconds_makes_a_new_version(api, target):
    sid = api.post("/api/v1/schedules", _body(target), format="json").json()["id"]
    resp = api.patch(f"/api/v1/schedules/{sid}", {"expectedVersion": 1, "spreadSeconds": 1800}, format="json")
    assert resp.status_code == 200, resp.content
    assert (resp.json()["version"], resp.json()["spreadSeconds"]) == (2, 1800)
    assert resp.json()["spreadOffsetSeconds"] == spread_offset(sid, 1800)


def _spread_run(api, target):
    """A scheduled run of a spread schedule, its nominal minute a little in the past."""
    minute = (db_now() - timedelta(minutes=1)).replace(second=0, microsecond=0)
    sid = api.post("/api/v1/schedules", _body(target, expression=f"{minute.minute} {minute.hour} * * *",
                                              spreadSeconds=600, misfireGraceSeconds=3600), format="json").json()["id"]
    Schedule.objects.filter(id=sid).update(next_run_at=minute)
    scan_until_idle()
    return Run.objects.get(schedule_id=sid), minute, spread_offset(sid, 600)


def test_a_run_shows_its_nominal_and_eligible_times(api, target):
    run, minute, offset = _spread_run(api, target)
    body = api.get(f"/api/v1/runs/{run.id}").json()
    z = minute.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert body["scheduledTime"] == body["nominalTime"] == z
    assert body["eligibleAt"] == (minute + timedelta(seconds=offset)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert (body["spreadSeconds"], body["spreadOffsetSeconds"]) == (600, offset)
    manual = api.post(f"/api/v1/schedules/{run.schedule_id}/trigger").json()
    assert manual["spreadSeconds"] == 0 and manual["eligibleAt"] == manual["scheduledTime"]


def test_the_portal_run_page_says_due_and_starts_within_its_spread(operator, api, target):
    run, minute, offset = _spread_run(api, target)
    html = operator.get(reverse("runs-detail", args=[run.id])).content.decode()
    starts = (minute + timedelta(seconds=offset)).strftime("%H:%M:%S")
    assert f"due <time datetime=\"{minute.strftime('%Y-%m-%dT%H:%M:%SZ')}\">{minute.strftime('%H:%M:%S')} UTC</time>" in html
    assert f"{starts} UTC</time> within its 10-minute spread" in html


def test_the_portal_schedule_page_shows_the_spread_and_when_each_occurrence_starts(operator, api, target):
    sid = api.post("/api/v1/schedules", _body(target, spreadSeconds=600), format="json").json()["id"]
    html = operator.get(reverse("schedules-detail", args=[sid])).content.decode()
    offset = spread_offset(sid, 600)
    assert f"10-minute window: each run starts {offset} s after its nominal time" in html
    assert 'data-testid="starts-at"' in html


def test_the_portal_form_sets_and_clears_the_spread_and_refuses_one_too_long(operator, tenant, target):
    resp = operator.post(reverse("schedules-create"), form(target, tenant, spread_seconds="600"))
    assert resp.status_code == 302, resp.content[:500]
    s = Schedule.objects.get(tenant=tenant)
    assert s.current.spread_seconds == 600
    resp = operator.post(reverse("schedules-edit", args=[s.id]), form(target, version="1", spread_seconds="90000"))
    assert resp.status_code == 400 and "spreadSeconds must be between 0 and 86400" in resp.content.decode()
    resp = operator.post(reverse("schedules-edit", args=[s.id]), form(target, version="1", spread_seconds=""))
    assert resp.status_code == 302
    s.refresh_from_db()
    assert (s.version, s.current.spread_seconds) == (2, 0)
    # A form without the field leaves it as it is.
    resp = operator.post(reverse("schedules-edit", args=[s.id]), form(target, version="2", name="renamed"))
    s.refresh_from_db()
    assert (s.version, s.current.spread_seconds, s.current.name) == (3, 0, "renamed")


def test_the_tenant_page_sets_the_default_spread(operator, tenant):
    resp = operator.post(reverse("schedules-tenant-settings", args=[tenant.id]), {"default_spread_seconds": "300"})
    assert resp.status_code in (200, 302)
    tenant.refresh_from_db()
    assert tenant.default_spread_seconds == 300
