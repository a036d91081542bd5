"""The dashboard page and its poller: full figures on load, only a slower poller while nothing
changes, new figures out of band when something does, and a stop after a long quiet spell."""

from datetime import timedelta

from django.urls import reverse

from dispatch.activity import ActivityAggregator, drain
from runs.models import AttemptOutcome, RunState
from scheduler_project.web.portal import dashboard as dash

from .conftest import make_run

HX = {"HTTP_HX_REQUEST": "true"}


def test_the_dashboard_shows_every_figure(operator, schedule, other_schedule):
    make_run(schedule, RunState.DEAD, error="HTTP 503 from target")
    make_run(schedule, RunState.DEAD, outcome=AttemptOutcome.UNKNOWN)
    make_run(other_schedule, RunState.LEASED)
    make_run(schedule, RunState.READY)
    html = operator.get(reverse("runs-dashboard")).content.decode()
    for heading in ("Oldest overdue", "Start lag", "Dead letters", "Unknown outcomes", "Runs by state",
                    "Latest dead runs", "In flight and backlog by tenant", "Targets failing most"):
        assert heading in html
    assert "HTTP 503 from target" in html
    assert "acme" in html and "globex" in html
    assert reverse("runs-dlq") in html
    assert 'hx-trigger="every 5s"' in html


def test_failing_targets_are_summed_from_the_activity_loops_rows(operator, acme, schedule, other_schedule):
    ago = timedelta(minutes=1)  # started a minute ago: settled, so the activity loop counts them
    make_run(schedule, RunState.DEAD, age=ago)
    make_run(schedule, RunState.DEAD, age=ago)
    make_run(schedule, RunState.SUCCEEDED, age=ago)
    make_run(other_schedule, RunState.DEAD, age=ago)
    html = operator.get(reverse("runs-dashboard")).content.decode()
    assert "No failed attempts in the last hour." in html  # not counted yet
    drain(ActivityAggregator(settle=timedelta(0)))
    r = operator.get(reverse("runs-dashboard"))
    assert [(t.target_url, t.failed, t.attempts) for t in r.context["failing"]] == [
        (schedule.current.target_url, 2, 3), (other_schedule.current.target_url, 1, 1)]
    html = r.content.decode()
    assert schedule.current.target_url in html and other_schedule.current.target_url in html
    html = acme.get(reverse("runs-dashboard")).content.decode()
    assert schedule.current.target_url in html and other_schedule.current.target_url not in html


def test_a_tenant_user_sees_only_their_tenant_on_the_dashboard(acme, schedule, other_schedule):
    make_run(other_schedule, RunState.DEAD, error="globex secret failure")
    make_run(schedule, RunState.DEAD, error="acme failure")
    html = acme.get(reverse("runs-dashboard")).content.decode()
    assert "acme failure" in html
    assert "globex" not in html
    assert "your tenants only" in html


def test_an_unchanged_poll_returns_only_a_slower_poller(operator, schedule):
    fp = dash.fingerprint(None)
    r = operator.get(reverse("runs-dashboard"), {"fp": fp, "idle": 0}, **HX)
    html = r.content.decode()
    assert r.status_code == 200
    assert 'id="dash-poll"' in html and 'hx-trigger="every 10s"' in html
    assert "dash-figures" not in html  # the figures were not recomputed
    r = operator.get(reverse("runs-dashboard"), {"fp": fp, "idle": 3}, **HX)
    assert 'hx-trigger="every 60s"' in r.content.decode()


def test_a_changed_poll_sends_new_figures_out_of_band(operator, schedule):
    fp = dash.fingerprint(None)
    make_run(schedule, RunState.DEAD, error="fresh failure")
    r = operator.get(reverse("runs-dashboard"), {"fp": fp, "idle": 4}, **HX)
    html = r.content.decode()
    assert 'id="dash-figures" hx-swap-oob="true"' in html
    assert "fresh failure" in html
    assert 'hx-trigger="every 5s"' in html


def test_polling_stops_after_a_long_quiet_spell(operator, schedule):
    fp = dash.fingerprint(None)
    r = operator.get(reverse("runs-dashboard"), {"fp": fp, "idle": dash.STOP_AFTER_IDLE - 1}, **HX)
    assert r.status_code == 286
    html = r.content.decode()
    assert "hx-trigger" not in html.split("Resume")[0]
    assert "Resume live updates" in html


def test_a_forged_idle_count_is_clamped_not_a_server_error(operator, schedule):
    fp = dash.fingerprint(None)
    for idle, interval in (("-99999999999999999999", 10), ("-3", 10), ("99999999999999999999999", None), ("x", 10)):
        r = operator.get(reverse("runs-dashboard"), {"fp": fp, "idle": idle}, **HX)
        if interval is None:  # past the quiet spell: polling stops
            assert r.status_code == 286
        else:
            assert r.status_code == 200 and f'hx-trigger="every {interval}s"' in r.content.decode()


def test_a_kept_count_of_the_last_hour_says_when_it_was_made(operator, schedule, monkeypatch):
    from runs import stats

    make_run(schedule, RunState.READY)
    assert 'data-testid="recent-as-of"' not in operator.get(reverse("runs-dashboard")).content.decode()
    monkeypatch.setattr(stats, "RECENT_COUNT_SLOW_SECONDS", -1.0)  # every count is "slow"
    operator.get(reverse("runs-dashboard"))  # counts, and keeps the count
    html = operator.get(reverse("runs-dashboard")).content.decode()
    assert 'data-testid="recent-as-of"' in html and "The last hour's column was counted" in html
