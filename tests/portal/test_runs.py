"""Runs list (filters, keyset pages) and run detail (evidence, retry, cancel, polling)."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils.http import urlencode

from runs.models import AttemptOutcome, Run, RunState
from schedules.models import AuditEntry

from .conftest import make_run

HX = {"HTTP_HX_REQUEST": "true"}


def test_the_list_filters_by_state_and_schedule(operator, schedule, other_schedule):
    dead = make_run(schedule, RunState.DEAD)
    ok = make_run(schedule, RunState.SUCCEEDED)
    other = make_run(other_schedule, RunState.DEAD)
    html = operator.get(reverse("runs-list"), {"state": "dead"}).content.decode()
    assert str(dead.id) in html and str(other.id) in html and str(ok.id) not in html
    html = operator.get(reverse("runs-list"), {"state": "dead", "schedule": schedule.id}).content.decode()
    assert str(dead.id) in html and str(other.id) not in html


def test_the_list_filters_by_tenant_and_time(operator, schedule, other_schedule):
    old = make_run(schedule, age=timedelta(days=2))
    new = make_run(schedule)
    other = make_run(other_schedule)
    html = operator.get(reverse("runs-list"), {"tenant": schedule.tenant_id}).content.decode()
    assert str(new.id) in html and str(other.id) not in html
    since = (new.scheduled_time - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S")
    html = operator.get(reverse("runs-list"), {"from": since}).content.decode()
    assert str(new.id) in html and str(old.id) not in html


def test_an_htmx_filter_returns_only_the_results_fragment(operator, schedule):
    make_run(schedule)
    html = operator.get(reverse("runs-list"), {"state": "ready"}, **HX).content.decode()
    assert html.lstrip().startswith('<section id="results"')
    assert "<nav" in html and "<header" not in html


@pytest.mark.parametrize("who", ["operator", "acme"])
def test_keyset_pages_cover_every_run_once_in_order(request, who, schedule, other_schedule, monkeypatch):
    from scheduler_project.web.portal import common

    monkeypatch.setattr(common, "PAGE_SIZE", 4)
    client = request.getfixturevalue(who)
    made = [make_run(schedule, age=timedelta(minutes=i)) for i in range(6)]
    made += [make_run(other_schedule, age=timedelta(minutes=i, seconds=30)) for i in range(5)]
    expected = [r.id for r in sorted(made, key=lambda r: (r.scheduled_time, r.id), reverse=True)
                if who == "operator" or r.tenant_id == schedule.tenant_id]
    seen, url, pages = [], reverse("runs-list"), 0
    while url:
        resp = client.get(url)
        page = resp.context["page"]
        seen += [r.id for r in page.rows]
        pages += 1
        url = reverse("runs-list") + "?" + urlencode({"after": page.next_cursor}) if page.has_next else None
    assert seen == expected
    assert pages == -(-len(expected) // 4)


def test_the_list_never_counts_the_runs_table(operator, schedule):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    make_run(schedule)
    with CaptureQueriesContext(connection) as ctx:
        operator.get(reverse("runs-list"))
    assert not any("COUNT(" in q["sql"].upper() and '"runs_run"' in q["sql"] for q in ctx.captured_queries)


def test_the_detail_shows_the_evidence_of_every_attempt(operator, schedule):
    run = make_run(schedule, RunState.DEAD, error="HTTP 500 from target", excerpt='{"error": "database is down"}')
    html = operator.get(reverse("runs-detail", args=[run.id])).content.decode()
    for text in ("worker-a:1", "250 ms", "HTTP 500", "HTTP 500 from target", "database is down",
                 "Schedule version 1", "America/New_York", "manual trigger", "Retry run"):
        assert text in html, text
    assert "Cancel run" not in html  # dead runs cannot be canceled


def test_an_unknown_outcome_is_marked_as_such(operator, schedule):
    run = make_run(schedule, RunState.DEAD, outcome=AttemptOutcome.UNKNOWN, http_status=None, excerpt="")
    html = operator.get(reverse("runs-detail", args=[run.id])).content.decode()
    assert "outcome unknown" in html
    assert "may or may not have acted" in html


def test_retry_goes_through_the_service_and_returns_the_new_state(operator, schedule):
    run = make_run(schedule, RunState.DEAD)
    r = operator.post(reverse("runs-retry", args=[run.id]), **HX)
    html = r.content.decode()
    assert r.status_code == 200
    assert html.lstrip().startswith('<section id="run-live"')
    assert 'data-testid="run-state">ready<' in html
    assert 'hx-trigger="every 3s"' in html  # live again: it polls until the run ends
    run.refresh_from_db()
    assert run.state == RunState.READY and run.retried_by == "user:olga"
    assert AuditEntry.objects.filter(action="run.retry", object_id=str(run.id), actor="user:olga").exists()


def test_retry_without_javascript_redirects_back_with_a_message(acme, schedule):
    run = make_run(schedule, RunState.CANCELED)
    r = acme.post(reverse("runs-retry", args=[run.id]), follow=True)
    assert r.redirect_chain[-1][0] == reverse("runs-detail", args=[run.id])
    assert "Retried" in r.content.decode()
    assert Run.objects.get(id=run.id).state == RunState.READY


def test_a_refused_action_shows_the_services_message(operator, schedule):
    run = make_run(schedule, RunState.SUCCEEDED)
    html = operator.post(reverse("runs-retry", args=[run.id]), **HX).content.decode()
    assert "only dead or canceled runs can be retried; this run is succeeded" in html
    assert Run.objects.get(id=run.id).state == RunState.SUCCEEDED


def test_cancel_of_a_leased_run_abandons_its_attempt(operator, schedule):
    run = make_run(schedule, RunState.LEASED)
    html = operator.post(reverse("runs-cancel", args=[run.id]), **HX).content.decode()
    assert "Cancel this run?" in html and 'name="confirm" value="yes"' in html
    assert Run.objects.get(id=run.id).state == RunState.LEASED  # nothing done before the confirmation
    html = operator.post(reverse("runs-cancel", args=[run.id]), {"confirm": "yes"}, **HX).content.decode()
    assert 'data-testid="run-state">canceled<' in html
    assert run.attempts.get().canceled_in_flight


def test_actions_need_post(operator, schedule):
    run = make_run(schedule, RunState.DEAD)
    assert operator.get(reverse("runs-retry", args=[run.id])).status_code == 405
    assert Run.objects.get(id=run.id).state == RunState.DEAD


def test_polling_a_finished_run_stops_the_poller(operator, schedule):
    live = make_run(schedule, RunState.LEASED)
    done = make_run(schedule, RunState.SUCCEEDED)
    assert operator.get(reverse("runs-detail", args=[live.id]), **HX).status_code == 200
    r = operator.get(reverse("runs-detail", args=[done.id]), **HX)
    assert r.status_code == 286
    assert "hx-trigger" not in r.content.decode()
