"""Schedule pages: search, filters, detail (versions, next occurrences with DST notes, recent
runs), and pause, resume, trigger now and backfill through the services."""

from django.urls import reverse

from runs.actions import edit_schedule, pause_schedule
from runs.models import Run, RunKind, RunState
from schedules.models import AuditEntry, Schedule
from tests.helpers import ACTOR, make_schedule, utc

from .conftest import make_run

HX = {"HTTP_HX_REQUEST": "true"}


def test_the_list_searches_by_name_and_id(operator, schedule, target):
    other = make_schedule(schedule.tenant, target.url + "/x", name="hourly-cleanup")
    html = operator.get(reverse("schedules-list"), {"q": "nightly"}).content.decode()
    assert "nightly-report" in html and "hourly-cleanup" not in html
    html = operator.get(reverse("schedules-list"), {"q": str(other.id)}).content.decode()
    assert "hourly-cleanup" in html and "nightly-report" not in html


def test_the_list_filters_by_status_and_tenant(operator, schedule, other_schedule):
    pause_schedule(schedule, by=ACTOR)
    html = operator.get(reverse("schedules-list"), {"status": "paused"}).content.decode()
    assert "nightly-report" in html and "globex-sync" not in html
    html = operator.get(reverse("schedules-list"), {"tenant": other_schedule.tenant_id}).content.decode()
    assert "globex-sync" in html and "nightly-report" not in html
    frag = operator.get(reverse("schedules-list"), {"status": "active"}, **HX).content.decode()
    assert frag.lstrip().startswith('<section id="results"')


def test_the_detail_shows_versions_with_what_changed_and_who(operator, schedule):
    edit_schedule(schedule, expected_version=1, changes={"expression": "30 2 * * *"}, by=ACTOR)
    html = operator.get(reverse("schedules-detail", args=[schedule.id])).content.decode()
    assert "Version 2" in html and "Version 1" in html
    assert "expression" in html and "0 2 * * *" in html and "30 2 * * *" in html
    assert "user:tests" in html


def test_the_next_occurrences_carry_dst_notes(operator, tenant, target):
    # Daily 02:30 in New York: on 2026-03-08 the wall time does not exist and the run moves.
    s = make_schedule(tenant, target.url + "/dst", name="dst", expression="30 2 * * *", tz="America/New_York",
                      now=utc(2026, 3, 5))
    html = operator.get(reverse("schedules-detail", args=[s.id])).content.decode()
    assert "2026-03-08 07:00:00" in html
    assert "rule meant 2026-03-08T02:30" in html


def test_the_detail_lists_recent_runs(operator, schedule):
    run = make_run(schedule, RunState.DEAD)
    html = operator.get(reverse("schedules-detail", args=[schedule.id])).content.decode()
    assert reverse("runs-detail", args=[run.id]) in html


def test_pause_and_resume_go_through_the_services(acme, schedule):
    asked = acme.post(reverse("schedules-pause", args=[schedule.id]), **HX).content.decode()
    assert "Pause nightly-report?" in asked and Schedule.objects.get(id=schedule.id).enabled
    r = acme.post(reverse("schedules-pause", args=[schedule.id]), {"confirm": "yes"}, **HX)
    html = r.content.decode()
    assert html.lstrip().startswith('<section id="schedule-actions"')
    assert 'data-testid="schedule-status">paused<' in html and ">Resume<" in html
    assert not Schedule.objects.get(id=schedule.id).enabled
    html = acme.post(reverse("schedules-resume", args=[schedule.id]), **HX).content.decode()
    assert 'data-testid="schedule-status">active<' in html
    assert Schedule.objects.get(id=schedule.id).enabled
    actions = list(AuditEntry.objects.filter(object_id=str(schedule.id)).values_list("action", "actor"))
    assert ("schedule.pause", "user:alice") in actions and ("schedule.resume", "user:alice") in actions


def test_pause_without_javascript_redirects_to_the_detail(operator, schedule):
    r = operator.post(reverse("schedules-pause", args=[schedule.id]), {"confirm": "yes"}, follow=True)
    assert r.redirect_chain[-1][0] == reverse("schedules-detail", args=[schedule.id])
    assert "Paused." in r.content.decode()


def test_trigger_now_makes_a_manual_run_and_links_it(operator, schedule):
    html = operator.post(reverse("schedules-trigger", args=[schedule.id]), **HX).content.decode()
    assert "Trigger nightly-report now?" in html and not Run.objects.filter(schedule=schedule).exists()
    html = operator.post(reverse("schedules-trigger", args=[schedule.id]), {"confirm": "yes"}, **HX).content.decode()
    run = Run.objects.get(schedule=schedule, kind=RunKind.MANUAL)
    assert reverse("runs-detail", args=[run.id]) in html


def test_an_archived_schedule_refuses_actions_with_the_services_message(operator, schedule):
    from runs.actions import archive_schedule

    archive_schedule(schedule, by=ACTOR)
    html = operator.post(reverse("schedules-trigger", args=[schedule.id]), **HX).content.decode()
    assert "this schedule is archived" in html
    assert not Run.objects.filter(schedule=schedule).exists()


def test_backfill_shows_the_count_before_it_creates_anything(operator, tenant, target):
    s = make_schedule(tenant, target.url + "/b", name="hourly", expression="0 * * * *", now=utc(2026, 1, 1))
    url = reverse("schedules-backfill", args=[s.id])
    assert "Count what it would create" in operator.get(url).content.decode()
    r = operator.post(url, {"start": "2025-12-31T00:00:00", "end": "2025-12-31T10:00:00"}, **HX)
    html = r.content.decode()
    assert 'data-testid="backfill-count">10<' in html
    assert not Run.objects.filter(schedule=s).exists()
    r = operator.post(url, {"start": "2025-12-31T00:00:00+00:00", "end": "2025-12-31T10:00:00+00:00",
                            "confirm": "yes"}, follow=True)
    assert "Backfill made 10 runs" in r.content.decode()
    assert Run.objects.filter(schedule=s, kind=RunKind.BACKFILL).count() == 10
    # The same range again: every instant already has a run, so the plan says 0.
    html = operator.post(url, {"start": "2025-12-31T00:00:00", "end": "2025-12-31T10:00:00"}, **HX).content.decode()
    assert 'data-testid="backfill-count">0<' in html


def test_a_bad_backfill_range_says_what_is_wrong(operator, schedule):
    url = reverse("schedules-backfill", args=[schedule.id])
    r = operator.post(url, {"start": "2026-01-02T00:00:00", "end": "2026-01-01T00:00:00"}, **HX)
    assert r.status_code == 400
    assert "must be after" in r.content.decode()
    r = operator.post(url, {"start": "", "end": ""}, **HX)
    assert r.status_code == 400


def test_the_expression_preview_answers_its_panel_even_when_opened_directly(acme):
    query = {"expression": "30 2 25-31 3 *", "time_zone": "Europe/Berlin", "dst_skipped": "next_valid",
             "dst_repeated": "earlier"}
    for headers in ({}, HX):  # htmx asks for it; a person may open the address (it was a 500)
        resp = acme.get(reverse("schedules-preview"), query, **headers)
        assert resp.status_code == 200
        html = resp.content.decode()
        assert html.lstrip().startswith('<section id="preview"') and "will fire at 03:00" in html
    resp = acme.get(reverse("schedules-preview"), {**query, "expression": "30 2 32 3 *"})
    assert resp.status_code == 400 and 'data-testid="preview-error"' in resp.content.decode()
