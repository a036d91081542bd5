"""The portal in a real browser (Debian's Chromium through Playwright) against a live server,
as an operator and as a tenant user would use it. These tests also write the screenshots in
docs/screenshots/ that the README shows."""

import math
import os
import random
import re
import tempfile
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from dispatch.activity import lag_bucket, minute_of
from dispatch.models import ALL_TENANTS, LAG_BOUNDS, ActivityMinute, ScheduleActivity
from runs.models import Attempt, AttemptOutcome, Occurrence, Run, RunState
from scheduler_project.foundation.dbclock import db_now
from scheduler_project.web.access import ROLE_OPERATOR, role
from schedules.models import Schedule, TenantMembership
from schedules.tenants import create_tenant
from schedules.timeexpr import validate_time_zone
from tests.helpers import make_schedule

from .conftest import make_run

pytestmark = [pytest.mark.browser]

CHROMIUM = "/usr/bin/chromium"
# The README's screenshots are rewritten only when asked (SCHEDULER_WRITE_SCREENSHOTS=1), so a
# test run does not dirty the work tree; otherwise they go to a temporary folder.
SHOTS = (
    Path(__file__).resolve().parents[2] / "docs" / "screenshots"
    if os.environ.get("SCHEDULER_WRITE_SCREENSHOTS")
    else Path(tempfile.mkdtemp(prefix="scheduler-shots-"))
)
ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module", autouse=True)
def _django_beside_playwright():
    # Playwright's sync API keeps an event loop running in this thread, and Django refuses ORM
    # calls from a thread with a running loop. The test's ORM calls are plain synchronous code
    # that only looks async to that check; the live server runs in its own thread.
    old = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    yield
    if old is None:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    else:
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = old


@pytest.fixture(scope="module")
def browser(_django_beside_playwright):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    ctx = browser.new_context(viewport={"width": 1360, "height": 900}, device_scale_factor=1)
    pg = ctx.new_page()
    pg.set_default_timeout(10_000)
    yield pg
    ctx.close()


def seed():
    """A small but realistic picture: three tenants, runs in every state, failures with evidence,
    an unknown outcome, a backlog and work in flight."""
    acme = create_tenant("acme", name="Acme Corp", allow_targets=["https://api.acme.example/"])
    globex = create_tenant("globex", name="Globex", allow_targets=["https://hooks.globex.example/"])
    initech = create_tenant("initech", name="Initech", allow_targets=["https://tps.initech.example/"])
    report = make_schedule(acme, "https://api.acme.example/reports/nightly", name="nightly-report",
                           expression="30 2 * * *", tz="America/New_York", max_attempts=3)
    invoices = make_schedule(acme, "https://api.acme.example/billing/invoices", name="invoice-sync",
                             expression="*/15 * * * *", tz="Europe/Berlin")
    sync = make_schedule(globex, "https://hooks.globex.example/crm/sync", name="crm-sync")
    tps = make_schedule(initech, "https://tps.initech.example/cover-sheets", name="tps-reports",
                        expression="0 9 * * MON-FRI", tz="America/Chicago")
    for i in range(14):
        run = make_run([report, invoices, sync, tps][i % 4], RunState.SUCCEEDED, age=timedelta(minutes=3 * i + 1))
        Attempt.objects.filter(run=run).update(started_at=run.scheduled_time + timedelta(milliseconds=300 + 170 * i))
    # Runs end when their last attempt did (make_run ends them now), some minutes ago.
    for i in range(3):
        ended(make_run(invoices, RunState.DEAD, error="HTTP 503 from target: Service Unavailable",
                       excerpt='{"error": "upstream ledger is in maintenance", "retry_after": 600}', http_status=503,
                       age=timedelta(minutes=21 + 6 * i)))
    ended(make_run(sync, RunState.DEAD, error="ConnectTimeout: no connection to hooks.globex.example:443 within 10 s",
                   http_status=None, excerpt="", age=timedelta(minutes=9)))
    ended(make_run(tps, RunState.DEAD, outcome=AttemptOutcome.UNKNOWN, http_status=None, excerpt="",
                   error="lease expired while worker-b:7 held it: outcome unknown", age=timedelta(minutes=26)))
    for _ in range(2):
        make_run(sync, RunState.LEASED, age=timedelta(seconds=30))
    make_run(tps, RunState.READY, age=timedelta(minutes=4))
    make_run(report, RunState.READY, age=timedelta(seconds=40))
    make_run(report, RunState.CANCELED)
    make_run(tps, RunState.SKIPPED)
    # The run the operator will find: dead after three failed attempts, each with its evidence.
    dead = make_run(report, RunState.DEAD, error="HTTP 500 from target", http_status=500, age=timedelta(minutes=14),
                    excerpt='{"error": "report generator crashed", "detail": "division by zero in totals.py:88"}')
    first = Attempt.objects.get(run=dead)
    for gen, (status, cls, err, ms) in enumerate([
        (None, "LeaseExpired", "the lease expired before a result was recorded; the target may or may not have acted", None),
        (502, "HTTPError", "HTTP 502 from target", 1840),
    ], start=2):
        Attempt.objects.create(
            run=dead, generation=gen, worker_id=f"worker-{'ab'[gen % 2]}:{gen + 3}",
            started_at=first.started_at + timedelta(seconds=20 * gen), finished_at=first.started_at + timedelta(seconds=20 * gen + 2),
            outcome=AttemptOutcome.UNKNOWN if status is None else AttemptOutcome.FAILED, http_status=status,
            error_class=cls, error=err, latency_ms=ms,
            response_excerpt="" if status is None else "<html><body><h1>502 Bad Gateway</h1></body></html>",
        )
    Run.objects.filter(id=dead.id).update(generation=3, attempts_used=3, last_error="HTTP 502 from target",
                                          finished_at=first.started_at + timedelta(seconds=62))
    # The rule's wall time of its (moved) instant, as the run page shows it beside the instant.
    wall = dead.scheduled_time.astimezone(validate_time_zone(dead.occurrence.time_zone))
    Occurrence.objects.filter(id=dead.occurrence_id).update(local_wall_time=wall.strftime("%Y-%m-%dT%H:%M:%S"),
                                                            local_time=wall.isoformat())
    seed_activity([acme, globex, initech], {report: "f", invoices: "f", sync: "u", tps: "s"})
    staff = User.objects.create_user("olga", password="pw-olga-123", is_staff=True)
    staff.groups.add(role(ROLE_OPERATOR))
    alice = User.objects.create_user("alice", password="pw-alice-123")
    TenantMembership.objects.create(user=alice, tenant=acme)
    return {"dead": dead, "report": report, "globex_run": Run.objects.filter(schedule=sync).first(), "staff": staff}


def ended(run):
    Run.objects.filter(id=run.id).update(finished_at=Attempt.objects.filter(run=run).latest("generation").finished_at)


def seed_activity(tenants, schedules):
    """The last hour of activity as the activity loop (dispatch.activity) would have folded it: a
    row per minute per tenant and for all tenants together, with a target outage about 35 minutes
    ago (failures and slow starts); and each schedule's summary row (its last 50 attempts), whose
    last outcome is the one given. Written directly, as fixtures; the loop itself has its own tests."""
    rnd = random.Random(14)
    now = minute_of(db_now())
    rows, totals = [], {}
    for back in range(60, -1, -1):
        minute = now - timedelta(minutes=back)
        outage = 33 <= back <= 38
        for share, tenant in zip((0.5, 0.3, 0.2), tenants):
            ok = round((40 + 15 * math.sin(back / 9) + rnd.randint(-4, 4)) * share)
            failed = round((rnd.randint(9, 14) if outage else rnd.choice((0, 0, 0, 1))) * share * 2)
            unknown = 1 if tenant is tenants[1] and back in (12, 47) else 0
            lag = [0] * (len(LAG_BOUNDS) + 1)
            for _ in range(ok + failed):
                seconds = rnd.uniform(4, 25) if outage and rnd.random() < 0.4 else rnd.lognormvariate(-1.6, 0.7)
                lag[lag_bucket(seconds)] += 1
            rows.append(ActivityMinute(tenant_id=tenant.id, minute=minute, succeeded=ok, failed=failed,
                                       unknown=unknown, lag_counts=lag, latency_ms_sum=(ok + failed) * 180,
                                       latency_count=ok + failed))
            t = totals.setdefault(minute, [0, 0, 0, [0] * len(lag)])
            t[0], t[1], t[2] = t[0] + ok, t[1] + failed, t[2] + unknown
            t[3] = [a + b for a, b in zip(t[3], lag)]
    rows += [ActivityMinute(tenant_id=ALL_TENANTS, minute=m, succeeded=ok, failed=failed, unknown=unknown,
                            lag_counts=lag, latency_ms_sum=(ok + failed) * 180, latency_count=ok + failed)
             for m, (ok, failed, unknown, lag) in totals.items()]
    ActivityMinute.objects.bulk_create(rows)
    for schedule, last in schedules.items():
        recent = []
        for k in range(50):
            at = now - timedelta(minutes=15 * (50 - k))
            code = last if k == 49 else ("f" if rnd.random() < 0.08 else "s")
            recent.append([at.timestamp(), code, None if code == "u" else rnd.randint(90, 900)])
        successes = [r for r in recent if r[1] == "s"]
        ScheduleActivity.objects.create(
            schedule_id=schedule.id, tenant_id=schedule.tenant_id, succeeded=len(successes),
            failed=50 - len(successes), last_finished_at=now, last_outcome={"s": "succeeded", "f": "failed",
                                                                            "u": "unknown"}[last],
            last_http_status={"s": 200, "f": 503, "u": None}[last],
            last_error={"s": "", "f": "HTTP 503 from target", "u": "lease expired: outcome unknown"}[last],
            last_success_at=now - timedelta(minutes=15) if last != "s" else now, recent=recent)


def log_in(page, base, username, password):
    page.goto(base + "/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(base + "/")


def test_an_operator_finds_a_dead_run_reads_its_evidence_and_retries_it(live_server, page):
    data = seed()
    base = live_server.url
    log_in(page, base, "olga", "pw-olga-123")
    page.get_by_role("heading", name="Dashboard", level=1).wait_for()
    page.screenshot(path=str(SHOTS / "dashboard.png"), full_page=True)

    page.locator("section[aria-labelledby=h-dead]").get_by_role("link", name="nightly-report").first.click()
    page.wait_for_url(re.compile(r"/runs/[0-9a-f-]{36}/$"))
    assert str(data["dead"].id) in page.url
    evidence = page.locator("#run-live")
    for text in ("HTTP 500", "report generator crashed", "outcome unknown", "HTTP 502", "1840 ms", "worker-a:1"):
        assert evidence.get_by_text(text).first.is_visible(), text
    assert page.get_by_test_id("run-state").inner_text() == "dead"
    # The occurrence beside it: the zone and tz database it was computed with.
    assert page.get_by_text("Wall time in America/New_York").is_visible()
    assert page.get_by_text(data["dead"].occurrence.tzdata_version, exact=True).is_visible()
    page.screenshot(path=str(SHOTS / "run-evidence.png"), full_page=True)

    page.evaluate("window.__sameDocument = true")
    page.get_by_role("button", name="Retry run").click()
    page.get_by_test_id("run-state").filter(has_text="ready").wait_for()
    assert page.evaluate("window.__sameDocument") is True  # changed in place, no reload
    assert page.get_by_text("Retried").is_visible()
    assert Run.objects.get(id=data["dead"].id).state == RunState.READY


def test_an_operator_pauses_and_resumes_a_schedule(live_server, page):
    data = seed()
    base = live_server.url
    log_in(page, base, "olga", "pw-olga-123")
    page.get_by_role("link", name="Schedules", exact=True).click()
    page.get_by_role("link", name="nightly-report").click()
    page.get_by_role("heading", name="nightly-report", level=1).wait_for()
    page.get_by_role("button", name="Pause…").click()
    # Pausing cancels runs that have not started: it asks first, and nothing changes until then.
    page.get_by_role("alertdialog").get_by_text("runs that have not started yet are canceled").wait_for()
    assert Schedule.objects.get(id=data["report"].id).enabled
    page.get_by_role("button", name="Yes, pause it").click()
    page.get_by_test_id("schedule-status").filter(has_text="paused").wait_for()
    assert not Schedule.objects.get(id=data["report"].id).enabled
    page.get_by_role("button", name="Resume").click()
    page.get_by_test_id("schedule-status").filter(has_text="active").wait_for()
    assert Schedule.objects.get(id=data["report"].id).enabled


def test_an_operator_reviews_and_bulk_retries_the_dead_letter_queue(live_server, page):
    seed()
    base = live_server.url
    log_in(page, base, "olga", "pw-olga-123")
    page.get_by_role("link", name="Dead letters").click()
    page.get_by_role("heading", name="Dead-letter queue").wait_for()
    page.screenshot(path=str(SHOTS / "dlq.png"), full_page=True)
    # Show only the 503 group, then retry everything the filter matches.
    page.get_by_role("link", name="Show the 3 runs of this group").click()
    page.wait_for_url(re.compile(r"error=HTTP"))
    page.get_by_label("Apply to").select_option("filter")
    page.get_by_role("button", name="Review…").click()
    assert page.get_by_test_id("confirm-count").inner_text() == "3"
    assert Run.objects.filter(state=RunState.DEAD).count() == 6  # nothing done before the confirmation
    page.get_by_role("button", name="Yes, retry 3 runs").click()
    page.get_by_text("Retried 3 runs.").wait_for()
    assert "error=HTTP" in page.url  # back on the queue as it was filtered
    assert Run.objects.filter(state=RunState.DEAD).count() == 3


def test_a_tenant_user_cannot_reach_another_tenants_run(live_server, page):
    data = seed()
    base = live_server.url
    log_in(page, base, "alice", "pw-alice-123")
    response = page.goto(f"{base}/runs/{data['globex_run'].id}/")
    assert response.status == 404
    assert page.get_by_role("heading", name="Not found").is_visible()
    page.goto(base + "/runs/")
    assert page.locator("#results").get_by_text("crm-sync").count() == 0
    assert page.locator("#results").get_by_text("nightly-report").count() > 0
    # Their own dead run can be retried.
    page.goto(f"{base}/runs/{data['dead'].id}/")
    page.get_by_role("button", name="Retry run").click()
    page.get_by_test_id("run-state").filter(has_text="ready").wait_for()


def test_the_portal_works_from_the_keyboard(live_server, page):
    seed()
    base = live_server.url
    log_in(page, base, "olga", "pw-olga-123")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "main"
    # Navigation is plain links: reachable with Tab and followed with Enter.
    page.get_by_role("link", name="Runs", exact=True).focus()
    page.keyboard.press("Enter")
    page.wait_for_url(base + "/runs/")
    page.get_by_label("State").select_option("dead")
    page.wait_for_url(re.compile(r"state=dead"))  # the filter pushed its URL (htmx, no reload)
    assert page.locator("#results .badge.s-dead").count() == 6


def test_the_database_unavailable_is_said_on_a_live_page_and_on_a_new_one(live_server, page, monkeypatch):
    """While the database cannot serve (here: the run page's load raises what a terminated session
    raises), the live panel's polls get 503s, which htmx swaps nowhere: the page says so, and
    stops saying so once a poll is answered again. A page opened meanwhile is the 503 page."""
    import psycopg
    from django.db import OperationalError

    from scheduler_project.web.portal import runs as portal_runs

    seed()
    run = Run.objects.filter(state=RunState.READY).first()
    base = live_server.url
    log_in(page, base, "olga", "pw-olga-123")
    page.goto(f"{base}/runs/{run.id}/")
    page.get_by_test_id("run-state").filter(has_text="ready").wait_for()

    def unavailable(request, pk):
        exc = OperationalError("terminating connection due to administrator command")
        exc.__cause__ = psycopg.errors.AdminShutdown("terminating connection due to administrator command")
        raise exc

    monkeypatch.setattr(portal_runs, "_load", unavailable)
    notice = page.get_by_role("alert").filter(has_text="The database is unavailable")
    notice.wait_for(timeout=10_000)  # the panel polls every 3 s
    page.screenshot(path=str(SHOTS / "database-unavailable-notice.png"), full_page=True)
    assert page.get_by_test_id("run-state").inner_text() == "ready"  # the stale panel stays as it was

    other = page.context.new_page()
    resp = other.goto(f"{base}/runs/{run.id}/")
    assert resp.status == 503 and resp.headers["retry-after"] == "5"
    other.get_by_role("heading", name="The database is unavailable", level=1).wait_for()
    other.screenshot(path=str(SHOTS / "database-unavailable-page.png"), full_page=True)
    other.close()

    monkeypatch.undo()
    notice.wait_for(state="detached", timeout=10_000)
    assert page.get_by_test_id("run-state").inner_text() == "ready"
