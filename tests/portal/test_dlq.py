"""The dead-letter queue: groups, and bulk retry/cancel that show their count first and then
loop the single-run services."""

from django.urls import reverse

from runs.actions import retry_run
from runs.models import Run, RunState
from schedules.models import AuditEntry
from tests.helpers import ACTOR

from .conftest import make_run

HX = {"HTTP_HX_REQUEST": "true"}


def test_dead_runs_are_grouped_by_schedule_and_error(operator, schedule, other_schedule):
    for _ in range(3):
        make_run(schedule, RunState.DEAD, error="HTTP 503 from target")
    make_run(schedule, RunState.DEAD, error="ConnectTimeout: no answer")
    make_run(other_schedule, RunState.DEAD, error="HTTP 404 from target")
    r = operator.get(reverse("runs-dlq"))
    groups = {(g["schedule__name"], g["error_key"]): g["n"] for g in r.context["groups"].rows}
    assert groups == {("nightly-report", "HTTP 503 from target"): 3, ("nightly-report", "ConnectTimeout: no answer"): 1,
                      ("globex-sync", "HTTP 404 from target"): 1}
    assert len(r.context["page"].rows) == 5


def test_groups_count_the_newest_runs_and_say_so_when_older_ones_are_left_out(operator, schedule, monkeypatch):
    from datetime import timedelta

    from scheduler_project.web.portal import dlq

    monkeypatch.setattr(dlq, "GROUP_SAMPLE", 3)
    for days in (3, 2):
        make_run(schedule, RunState.DEAD, error="ConnectTimeout: no answer", age=timedelta(days=days))
    for _ in range(3):
        make_run(schedule, RunState.DEAD, error="HTTP 503 from target")
    r = operator.get(reverse("runs-dlq"))
    groups = r.context["groups"]
    assert [(g["error_key"], g["n"]) for g in groups.rows] == [("HTTP 503 from target", 3)]
    assert groups.more and groups.sampled == 3
    assert 'data-testid="groups-sampled"' in r.content.decode()
    assert len(r.context["page"].rows) == 5  # the list still has every run
    # Narrowed by the filter, the older group is counted whole and nothing is said about a sample.
    r = operator.get(reverse("runs-dlq"), {"error": "ConnectTimeout"})
    assert [(g["error_key"], g["n"]) for g in r.context["groups"].rows] == [("ConnectTimeout: no answer", 2)]
    assert 'data-testid="groups-sampled"' not in r.content.decode()


def test_a_group_link_filters_to_that_group(operator, schedule):
    make_run(schedule, RunState.DEAD, error="HTTP 503 from target")
    other = make_run(schedule, RunState.DEAD, error="ConnectTimeout")
    r = operator.get(reverse("runs-dlq"), {"schedule": schedule.id, "error": "HTTP 503"}, **HX)
    assert len(r.context["page"].rows) == 1
    assert str(other.id) not in r.content.decode()


def test_bulk_retry_of_a_selection_confirms_the_count_first(operator, schedule):
    dead = [make_run(schedule, RunState.DEAD) for _ in range(3)]
    succeeded = make_run(schedule, RunState.SUCCEEDED)
    data = {"action": "retry", "scope": "selected", "view": "dead", "ids": [str(r.id) for r in dead[:2]] + [str(succeeded.id)]}
    r = operator.post(reverse("runs-dlq-action"), data, **HX)
    html = r.content.decode()
    assert 'data-testid="confirm-count">2<' in html
    assert Run.objects.filter(state=RunState.DEAD).count() == 3  # nothing done yet
    r = operator.post(reverse("runs-dlq-action"), {**data, "confirm": "yes"}, follow=True)
    assert "Retried 2 runs." in r.content.decode()
    assert {r.state for r in Run.objects.filter(id__in=[d.id for d in dead[:2]])} == {RunState.READY}
    assert Run.objects.get(id=dead[2].id).state == RunState.DEAD
    assert AuditEntry.objects.filter(action="run.retry").count() == 2


def test_bulk_retry_over_the_filter_touches_only_the_filtered_runs(operator, schedule, other_schedule):
    mine = [make_run(schedule, RunState.DEAD, error="HTTP 503") for _ in range(2)]
    theirs = make_run(other_schedule, RunState.DEAD, error="HTTP 503")
    data = {"action": "retry", "scope": "filter", "view": "dead", "schedule": str(schedule.id)}
    html = operator.post(reverse("runs-dlq-action"), data).content.decode()
    assert 'data-testid="confirm-count">2<' in html
    assert f'name="schedule" value="{schedule.id}"' in html  # the filter is repeated on confirm
    operator.post(reverse("runs-dlq-action"), {**data, "confirm": "yes"})
    assert all(Run.objects.get(id=r.id).state == RunState.READY for r in mine)
    assert Run.objects.get(id=theirs.id).state == RunState.DEAD


def test_bulk_cancel_applies_to_runs_still_retrying(operator, schedule):
    failing = make_run(schedule, RunState.DEAD)
    retry_run(failing, by=ACTOR)  # ready again at generation 1: shows under "still retrying"
    r = operator.get(reverse("runs-dlq"), {"view": "retrying"})
    assert [x.id for x in r.context["page"].rows] == [failing.id]
    data = {"action": "cancel", "scope": "filter", "view": "retrying"}
    assert 'data-testid="confirm-count">1<' in operator.post(reverse("runs-dlq-action"), data).content.decode()
    operator.post(reverse("runs-dlq-action"), {**data, "confirm": "yes"})
    assert Run.objects.get(id=failing.id).state == RunState.CANCELED


def test_a_bulk_action_on_nothing_says_so(operator, schedule):
    make_run(schedule, RunState.DEAD)
    html = operator.post(reverse("runs-dlq-action"), {"action": "retry", "scope": "selected", "view": "dead"}).content.decode()
    assert "Nothing to retry" in html


def test_a_tenant_user_cannot_bulk_retry_another_tenants_runs(acme, schedule, other_schedule):
    theirs = make_run(other_schedule, RunState.DEAD)
    mine = make_run(schedule, RunState.DEAD)
    data = {"action": "retry", "scope": "selected", "view": "dead", "ids": [str(theirs.id), str(mine.id)]}
    assert 'data-testid="confirm-count">1<' in acme.post(reverse("runs-dlq-action"), data).content.decode()
    acme.post(reverse("runs-dlq-action"), {**data, "confirm": "yes"})
    assert Run.objects.get(id=theirs.id).state == RunState.DEAD
    assert Run.objects.get(id=mine.id).state == RunState.READY
    filt = {"action": "retry", "scope": "filter", "view": "dead", "confirm": "yes"}
    other = make_run(other_schedule, RunState.DEAD)
    acme.post(reverse("runs-dlq-action"), filt)
    assert Run.objects.get(id=other.id).state == RunState.DEAD


def test_the_action_endpoint_needs_post(operator):
    assert operator.get(reverse("runs-dlq-action")).status_code == 405
