"""What the pages say, word for word where it used to be wrong: ages, counts, plurals, a success
without an error, a readable audit change, no live-update claim without JavaScript, and nothing
coming up for a paused schedule."""

from datetime import datetime, timedelta, timezone

import pytest
from django.urls import reverse

from runs.actions import pause_schedule
from runs.models import Run, RunState
from scheduler_project.web.portal.display import ago, change_lines, duration, plural
from schedules.services import SYSTEM
from schedules.tenants import update_tenant_settings
from tests.helpers import ACTOR

from .conftest import make_run

pytestmark = pytest.mark.django_db
NOW = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)


def test_an_age_under_a_minute_is_never_zero_minutes():
    assert ago(NOW, NOW) == "just now"
    assert ago(NOW - timedelta(seconds=42), NOW) == "42 s ago"
    assert ago(NOW - timedelta(minutes=3, seconds=5), NOW) == "3 min ago"
    assert ago(NOW - timedelta(hours=2, minutes=5), NOW) == "2 h 5 min ago"
    assert ago(NOW - timedelta(days=3), NOW) == "3 days ago"
    assert duration(0.25) == "250 ms" and duration(4.25) == "4.2 s"


def test_counts_are_plural_only_when_they_are_many():
    assert plural(1, "run") == "1 run" and plural(5, "run") == "5 runs" and plural(0, "run") == "0 runs"


def test_the_dashboard_says_died_just_now_for_a_run_that_just_died(operator, schedule):
    make_run(schedule, RunState.DEAD)
    html = operator.get(reverse("runs-dashboard")).content.decode()
    died = html.split("died <time", 1)[1].split("</time>", 1)[0]
    assert died.endswith(">just now") or died.endswith(" s ago"), died
    assert "0 minutes" not in html


def test_a_succeeded_run_shows_no_last_error_even_one_written_before_the_fix(operator, schedule):
    run = make_run(schedule, RunState.SUCCEEDED)
    # Rows written by older versions kept "HTTP 200" as the last error of a success.
    Run.objects.filter(id=run.id).update(last_error="HTTP 200")
    html = operator.get(reverse("runs-detail", args=[run.id])).content.decode()
    assert "Last error" not in html
    for page in (reverse("runs-list"), reverse("schedules-detail", args=[schedule.id])):
        assert "HTTP 200</td>" not in operator.get(page).content.decode()


def test_the_admin_says_audit_entries(client, django_user_model):
    root = django_user_model.objects.create_superuser("root", "root@example.com", "pw-root-123")
    client.force_login(root)
    html = client.get(reverse("admin:index")).content.decode()
    assert "Audit entries" in html and "entrys" not in html


def test_a_backfill_message_counts_its_runs_in_words(operator, tenant, target):
    from tests.helpers import make_schedule, utc

    s = make_schedule(tenant, target.url + "/b", expression="0 * * * *", now=utc(2026, 1, 1))
    r = operator.post(reverse("schedules-backfill", args=[s.id]),
                      {"start": "2025-12-31T00:00:00", "end": "2025-12-31T01:00:00", "confirm": "yes"}, follow=True)
    html = r.content.decode()
    assert "Backfill made 1 run, ready now." in html and "(s)" not in html


def test_the_audit_log_shows_a_change_as_field_before_and_after(operator, tenant):
    update_tenant_settings(tenant, max_in_flight="5", by=ACTOR)
    update_tenant_settings(tenant, max_in_flight="10", by=ACTOR)
    html = operator.get(reverse("schedules-audit")).content.decode()
    assert "<dt>max in flight</dt>" in html
    assert '<span class="was">5</span> → <ins>10</ins>' in html
    assert "{&#x27;" not in html and "<del>" not in html


def test_a_long_value_is_folded_whole_not_cut_mid_word():
    payload = {"report": "quarterly-revenue-by-region " * 10}
    (line,) = change_lines({"payload": {}}, {"payload": payload})
    assert line.long and "quarterly-revenue-by-region " * 10 in line.after.replace('"', "").replace("\\n", "")
    assert change_lines(None, {"prefix": "https://x/"})[0].before is None


def test_the_live_update_note_is_for_scripted_pages_only(operator):
    html = operator.get(reverse("runs-dashboard")).content.decode()
    note = html.split('data-testid="live-note"')[0].rsplit("<p", 1)[1]
    assert "js-only" in note  # shown only once portal.js has run
    assert "<noscript>" in html and "reload it for newer ones" in html


def test_a_paused_schedule_lists_nothing_coming_up(operator, schedule):
    pause_schedule(schedule, by=SYSTEM)
    html = operator.get(reverse("schedules-detail", args=[schedule.id])).content.decode()
    assert 'data-testid="no-occurrences">Paused: nothing is coming up' in html
    listing = operator.get(reverse("schedules-list")).content.decode()
    row = listing.split(">nightly-report<", 1)[1].split("</tr>", 1)[0]
    assert "UTC" not in row.split("paused", 1)[1].split("</td>", 2)[1]  # no next run for a paused schedule
