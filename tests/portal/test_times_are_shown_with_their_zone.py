"""Every time the portal shows carries its zone, in the zone the person chose (UTC, the schedule's,
the browser's); the schedule page's wall-time column is the rule's own zone, never UTC."""

from datetime import datetime, timezone

import pytest
from django.urls import reverse

from runs.models import RunState
from scheduler_project.web.portal.display import BROWSER_COOKIE, MODE_COOKIE, format_in, zone
from schedules.tenants import create_api_key
from tests.helpers import make_schedule, utc

from .conftest import make_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def berlin(tenant, target):
    # 02:30 every night in Berlin, made before the spring change so the next instants cross the spring change
    # (2026-03-29, when 02:30 does not exist there); made on 2026-03-21.
    return make_schedule(tenant, target.url + "/b", name="berlin-0230", expression="30 2 * * *",
                         tz="Europe/Berlin", now=utc(2026, 3, 21))


def test_the_wall_time_column_is_the_schedules_zone_not_utc(operator, berlin):
    html = operator.get(reverse("schedules-detail", args=[berlin.id])).content.decode()
    assert "Wall time in Europe/Berlin" in html
    assert "2026-03-21 01:30:00 UTC" in html  # the instant, in UTC
    assert "2026-03-21 02:30:00 CET" in html  # the rule's wall time in its zone
    assert "2026-03-29 03:00:00 CEST" in html  # moved out of the gap
    assert "2026-03-30 02:30:00 CEST" in html  # after the change: 02:30 again, now summer time


def test_dst_notes_of_coming_instants_are_in_the_future_tense(operator, berlin):
    html = operator.get(reverse("schedules-detail", args=[berlin.id])).content.decode()
    assert "does not exist on 2026-03-29; will fire at 03:00" in html
    assert "fired at" not in html


def test_the_chosen_zone_applies_to_run_times(client, operator_user, schedule):
    run = make_run(schedule, RunState.SUCCEEDED)
    client.force_login(operator_user)
    url = reverse("runs-list")
    utc_html = client.get(url).content.decode()
    assert format_in(run.scheduled_time, timezone.utc) in utc_html
    client.cookies[MODE_COOKIE] = "schedule"
    ny_html = client.get(url).content.decode()
    assert format_in(run.scheduled_time, zone("America/New_York")) in ny_html  # the schedule's zone
    assert " EST" in ny_html or " EDT" in ny_html


def test_the_browsers_zone_is_used_once_the_browser_has_said_it(client, operator_user, schedule):
    run = make_run(schedule, RunState.SUCCEEDED)
    client.force_login(operator_user)
    client.cookies[MODE_COOKIE] = "browser"
    before = client.get(reverse("runs-detail", args=[run.id])).content.decode()
    # Without the script's cookie (no JavaScript yet): UTC, and the page says why.
    assert "needs JavaScript" in before and 'data-tz-fallback="browser"' in before
    assert format_in(run.scheduled_time, timezone.utc) in before
    client.cookies[BROWSER_COOKIE] = "Asia/Tokyo"
    after = client.get(reverse("runs-detail", args=[run.id])).content.decode()
    assert format_in(run.first_started_at, zone("Asia/Tokyo")) in after and " JST" in after
    assert "needs JavaScript" not in after


def test_an_unknown_zone_in_a_cookie_falls_back_to_utc(client, operator_user, schedule):
    make_run(schedule, RunState.SUCCEEDED)
    client.force_login(operator_user)
    client.cookies[MODE_COOKIE] = "browser"
    client.cookies[BROWSER_COOKIE] = "Mars/Olympus_Mons"
    r = client.get(reverse("runs-list"))
    assert r.status_code == 200 and " UTC" in r.content.decode()


def test_the_choice_is_a_form_that_works_without_javascript(client, operator_user):
    client.force_login(operator_user)
    r = client.post(reverse("portal-time-preference"), {"mode": "schedule", "next": "/runs/?state=dead"})
    assert r.status_code == 302 and r["Location"] == "/runs/?state=dead"
    assert r.cookies[MODE_COOKIE].value == "schedule"
    r = client.post(reverse("portal-time-preference"), {"mode": "utc", "next": "https://evil.example/"})
    assert r["Location"] == reverse("runs-dashboard")
    page = client.get(reverse("runs-dashboard")).content.decode()
    assert 'action="/preferences/time"' in page and '<option value="utc" selected>' in page


def test_the_tenant_page_gives_key_and_allowlist_times_with_their_zone(operator, tenant):
    create_api_key(tenant, label="ci")
    html = operator.get(reverse("schedules-tenant-detail", args=[tenant.id])).content.decode()
    keys = html.split('id="keys"', 1)[1].split("</section>", 1)[0]
    allowlist = html.split('id="h-targets"', 1)[1].split("</section>", 1)[0]
    assert " UTC</time>" in keys and " UTC</time>" in allowlist


def test_admin_lists_give_times_with_their_zone(client, django_user_model, schedule):
    make_run(schedule, RunState.DEAD)
    create_api_key(schedule.tenant, label="ci")
    root = django_user_model.objects.create_superuser("root", "root@example.com", "pw-root-123")
    client.force_login(root)
    for name in ("admin:runs_run_changelist", "admin:runs_attempt_changelist", "admin:schedules_schedule_changelist",
                 "admin:schedules_auditentry_changelist", "admin:schedules_apikey_changelist"):
        html = client.get(reverse(name)).content.decode()
        assert "(UTC)" in html, name
    assert " UTC" in client.get(reverse("admin:runs_run_changelist")).content.decode()


def test_format_in_names_the_zone_of_the_instant():
    at = datetime(2026, 7, 1, 12, 0, tzinfo=timezone.utc)
    assert format_in(at, zone("Europe/Berlin")) == "2026-07-01 14:00:00 CEST"
    assert format_in(at, timezone.utc, "short") == "2026-07-01 12:00 UTC"
    assert format_in(at, zone("Asia/Kolkata")) == "2026-07-01 17:30:00 IST"
