"""Every workflow of the operator portal in Chromium, as an operator and as a tenant user, with
JavaScript on and, where a step must not depend on it, off: each checked on the page and in the
database. The seed and the browser are test_browser.py's (whose tests sign in through the form;
here each person gets a session made for them). These tests also write the README's screenshots of
a schedule, the schedule form and the workers page (SHOTS)."""

import re
import threading
from datetime import timedelta
from urllib.parse import urlencode
from zoneinfo import ZoneInfo

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.test import Client
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from dispatch.models import WorkerStat, software_version
from dispatch.worker import run_worker
from runs import actions
from runs.models import Run, RunKind, RunState
from scheduler_project.foundation.dbclock import db_now
from scheduler_project.web.portal.display import UTC, format_in
from schedules.models import ApiKey, Schedule, TargetPrefix, Tenant, TenantMembership
from schedules.tenants import add_target_prefix, create_api_key
from tests.helpers import ACTOR, make_schedule

from .conftest import make_run
from .test_browser import SHOTS, _django_beside_playwright, browser, seed  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.browser]

PASSWORDS = {"olga": "pw-olga-123", "alice": "pw-alice-123", "victor": "pw-victor-123", "root": "pw-root-123"}
DST_NOTE = re.compile(r"does not exist on \d{4}-03-\d\d; will fire at 03:00")


@pytest.fixture
def open_as(browser, live_server):  # noqa: F811
    """open_as(username, path="/", js=True, width=1360, timezone_id=None) -> a signed-in page at
    `path` (None: blank) in a context of its own (cookies, JavaScript setting, viewport, zone),
    closed after the test."""
    contexts = []

    def open_as(username, path="/", *, js=True, width=1360, timezone_id=None):
        ctx = browser.new_context(viewport={"width": width, "height": 900}, device_scale_factor=1,
                                  java_script_enabled=js, timezone_id=timezone_id)
        contexts.append(ctx)
        # Signed in by a session made here (test_browser.py signs in through the form).
        client = Client()
        client.force_login(User.objects.get(username=username))
        ctx.add_cookies([{"name": django_settings.SESSION_COOKIE_NAME, "url": live_server.url,
                          "value": client.cookies[django_settings.SESSION_COOKIE_NAME].value}])
        page = ctx.new_page()
        page.set_default_timeout(10_000)
        if path is not None:
            page.goto(live_server.url + path)
        return page

    yield open_as
    for ctx in contexts:
        ctx.close()


def mark_document(page):
    page.evaluate("window.__sameDocument = true")


def same_document(page) -> bool:
    return page.evaluate("window.__sameDocument === true")


def post(page, base, path, data: dict) -> int:
    """A form post from this person's session (their cookies and CSRF token), as a crafted request
    would be: the status, without following a redirect. A list value repeats its field."""
    token = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    return page.request.post(base + path, data=urlencode(data, doseq=True), max_redirects=0, headers={
        "X-CSRFToken": token, "Content-Type": "application/x-www-form-urlencoded"}).status


def viewer_of(tenant) -> User:
    victor = User.objects.create_user("victor", password=PASSWORDS["victor"])
    TenantMembership.objects.create(user=victor, tenant=tenant, role="viewer")
    return victor


# --------------------------------------------------------------------- create and edit, preview


def retype(field, text):
    """Replace the field's text as a person finishing it would: the last key typed (the preview
    listens to keystrokes)."""
    field.fill(text[:-1])
    field.press_sequentially(text[-1])


def create_and_edit(page, base, *, who, tenant_choice: bool, shot: str | None = None):
    name = f"spring-report-{who}"
    page.get_by_role("link", name="New schedule").click()
    page.get_by_role("heading", name="New schedule", level=1).wait_for()
    page.wait_for_load_state()  # htmx listens from here on
    if tenant_choice:
        page.get_by_label("Tenant", exact=True).select_option(label="acme")
    else:  # a tenant user of one tenant is not asked
        assert page.get_by_label("Tenant", exact=True).count() == 0
        assert page.get_by_text("Tenant: acme").is_visible()
    page.get_by_label("Name", exact=True).fill(name)
    page.get_by_label("Time zone (IANA)").fill("Europe/Berlin")
    preview = page.locator("#preview")
    expression = page.get_by_label("Expression")
    if tenant_choice:
        # As you type: a daily rule previews ten wall times without a DST note...
        expression.press_sequentially("30 2 * * *")
        preview.get_by_test_id("preview-table").wait_for()
        preview.get_by_text("in Europe/Berlin").wait_for()
        assert preview.locator("tbody tr").count() == 10
        assert "does not exist" not in preview.inner_text()
        # ...a mistake is said at once (the 400 is swapped in: base.html's htmx-config)...
        retype(expression, "30 2 32 3 *")
        preview.get_by_test_id("preview-error").wait_for()
    # ...and the days around the spring change show the one that moves.
    retype(expression, "30 2 25-31 3 *")
    preview.locator("td.note", has_text=DST_NOTE).first.wait_for()
    assert preview.locator("tr.dropped").count() == 0
    page.get_by_label("URL", exact=True).fill("https://api.acme.example/reports/spring")
    page.get_by_label("Payload (JSON, sent as the body of each call)").fill('{"report": "spring"}')
    if shot:
        page.evaluate("document.activeElement.blur(); window.scrollTo(0, 0)")
        page.screenshot(path=str(SHOTS / shot), full_page=True)
    assert not Schedule.objects.filter(name=name).exists()  # the preview saves nothing
    page.get_by_role("button", name="Create schedule").click()
    page.get_by_role("heading", name=name, level=1).wait_for()
    page.get_by_text("Created.").wait_for()
    schedule = Schedule.objects.select_related("tenant", "current").get(name=name)
    assert schedule.tenant.slug == "acme" and schedule.version == 1 and schedule.enabled
    assert (schedule.current.expression, schedule.current.time_zone) == ("30 2 25-31 3 *", "Europe/Berlin")
    assert schedule.current.payload == {"report": "spring"}
    assert schedule.current.created_by == f"user:{who}"
    assert page.url == f"{base}/schedules/{schedule.id}/"
    page.locator("#next-occurrences td.note", has_text=DST_NOTE).first.wait_for()

    page.get_by_role("link", name="Edit", exact=True).click()
    page.get_by_role("heading", name=f"Edit {name}", level=1).wait_for()
    page.wait_for_load_state()
    assert page.get_by_label("Expression").input_value() == "30 2 25-31 3 *"
    retype(page.get_by_label("Expression"), "45 2 25-31 3 *")
    page.locator("#preview td.note", has_text="02:45 does not exist").first.wait_for()
    page.get_by_role("button", name="Save as version 2").click()
    page.get_by_text("Saved as version 2.").wait_for()
    schedule.refresh_from_db()
    assert schedule.version == 2 and schedule.current.expression == "45 2 25-31 3 *"
    assert schedule.versions.count() == 2 and schedule.current.created_by == f"user:{who}"
    history = page.locator("#v2")
    assert "30 2 25-31 3 *" in history.inner_text() and "45 2 25-31 3 *" in history.inner_text()


def test_an_operator_and_a_tenant_admin_create_a_schedule_watching_its_preview_then_edit_it(live_server, open_as):
    seed()
    create_and_edit(open_as("olga", "/schedules/"), live_server.url, who="olga", tenant_choice=True,
                    shot="schedule-form.png")
    create_and_edit(open_as("alice", "/schedules/"), live_server.url, who="alice", tenant_choice=False)


# --------------------------------------------------------------------------------- backfill


def ask_backfill(page, base, schedule, start, end):
    page.goto(f"{base}/schedules/{schedule.id}/")
    page.get_by_role("link", name="Backfill…").click()
    page.get_by_label("From (UTC, inclusive)").fill(start.strftime("%Y-%m-%dT%H:%M:%S"))
    page.get_by_label("To (UTC, exclusive)").fill(end.strftime("%Y-%m-%dT%H:%M:%S"))
    mark_document(page)
    page.get_by_role("button", name="Count what it would create").click()


def test_a_refused_backfill_says_why_with_javascript_on_and_a_good_one_makes_its_runs(live_server, open_as):
    data = seed()
    now = db_now().replace(microsecond=0)
    invoices = Schedule.objects.get(name="invoice-sync")  # */15 * * * *: 96 a day
    runs_before = Run.objects.count()
    for who in ("alice", "olga"):
        page = open_as(who, None)
        ask_backfill(page, live_server.url, invoices, now - timedelta(days=30), now - timedelta(days=1))
        page.locator("#plan").get_by_text("this range has more than 1000 occurrences").wait_for()
        assert same_document(page)  # the 400 answer was swapped into the page
        assert Run.objects.count() == runs_before
    # A range the limit allows: counted first, made on "Create".
    report = data["report"]  # 30 2 * * * in America/New_York: one a day (5 or, across a DST change, 4 to 6)
    start, end = now - timedelta(days=5, hours=1), now - timedelta(hours=1)
    expected = len(actions.plan_backfill(report, start, end)[0])
    assert 4 <= expected <= 6
    ask_backfill(page, live_server.url, report, start, end)
    assert int(page.get_by_test_id("backfill-count").inner_text()) == expected
    assert Run.objects.count() == runs_before
    page.get_by_role("button", name=f"Create {expected} runs").click()
    page.get_by_text(f"Backfill made {expected} runs, ready now.").wait_for()
    assert Run.objects.filter(schedule=report, kind=RunKind.BACKFILL, state=RunState.READY).count() == expected


# ------------------------------------------------------------------ actions that ask first


def walk_risky_actions(page, base, *, js: bool, schedule, run, key, prefix=None, race_the_poll=False):
    """Trigger now, Pause, Cancel run, Revoke key (and Remove allowlist prefix, for an operator):
    each shows a confirmation, changes nothing until "Yes", then changes what it said."""

    def ask(button_name):
        page.get_by_role("button", name=button_name).click()
        box = page.get_by_role("alertdialog")
        box.wait_for()
        return box

    def ask_during_an_update(button_name):
        """`ask`, for a click raced against the panel's own update. A click that lands on the
        button just as the update replaces it sends nothing (htmx sends nothing for an element no
        longer in the page) and the person clicks again; so here. A click whose request went out
        must get its question: that is what is tested."""
        for _ in range(3):
            try:
                with page.expect_request(lambda r: r.method == "POST", timeout=2_000):
                    page.get_by_role("button", name=button_name).click()
                break
            except PlaywrightTimeoutError:
                continue
        box = page.get_by_role("alertdialog")
        box.wait_for()
        return box

    def asked_in_place():
        # With JavaScript the question is drawn inside the panel; without, it is a page of its own.
        if js:
            assert same_document(page)
        else:
            assert page.get_by_role("heading", name="Please confirm", level=1).is_visible()

    page.goto(f"{base}/schedules/{schedule.id}/")
    mark_document(page)
    before = set(Run.objects.filter(schedule=schedule).values_list("id", flat=True))
    box = ask("Trigger now…")
    assert schedule.current.target_url in box.inner_text()
    asked_in_place()
    assert set(Run.objects.filter(schedule=schedule).values_list("id", flat=True)) == before
    box.get_by_role("button", name="Yes, trigger a run now").click()
    page.get_by_text("Triggered: run").wait_for()
    (new_run,) = set(Run.objects.filter(schedule=schedule).values_list("id", flat=True)) - before
    assert Run.objects.get(id=new_run).kind == RunKind.MANUAL
    # The recent runs show it at once: in place with JavaScript (no reload), on the next page without.
    page.locator(f'#recent-runs a[href="/runs/{new_run}/"]').wait_for()
    if js:
        assert same_document(page)

    mark_document(page)
    box = ask("Pause…")
    assert "runs that have not started yet are canceled" in box.inner_text()
    asked_in_place()
    assert Schedule.objects.get(id=schedule.id).enabled
    assert Run.objects.get(id=new_run).state == RunState.READY
    box.get_by_role("button", name="Yes, pause it").click()
    page.get_by_test_id("schedule-status").filter(has_text="paused").wait_for()
    assert not Schedule.objects.get(id=schedule.id).enabled
    assert Run.objects.get(id=new_run).state == RunState.CANCELED  # it had not started
    if js:
        assert same_document(page)

    page.goto(f"{base}/runs/{run.id}/")
    mark_document(page)
    state = run.state
    box = ask("Cancel run…")
    asked_in_place()
    # "No" leaves it as it was.
    box.get_by_role("link", name="No, go back").click()
    page.get_by_role("button", name="Cancel run…").wait_for()
    assert Run.objects.get(id=run.id).state == state
    if js and race_the_poll:
        # The panel updates itself every 3 s while the run is live: a click while an update is on
        # its way must still get its question, not have it replaced by the update (hx-sync).
        with page.expect_request(lambda r: r.method == "GET" and r.headers.get("hx-request") == "true",
                                 timeout=5_000):
            pass
        box = ask_during_an_update("Cancel run…")
    else:
        box = ask("Cancel run…")
    assert Run.objects.get(id=run.id).state == state
    box.get_by_role("button", name="Yes, cancel the run").click()
    page.get_by_test_id("run-state").filter(has_text="canceled").wait_for()
    assert Run.objects.get(id=run.id).state == RunState.CANCELED
    assert page.get_by_text("reason: canceled").count() == 0  # the state says it; no echo

    page.goto(f"{base}/tenants/{key.tenant_id}/")
    mark_document(page)
    box = ask(f"Revoke key {key.prefix}")
    asked_in_place()
    assert ApiKey.objects.get(id=key.id).revoked_at is None
    box.get_by_role("button", name="Yes, revoke the key").click()
    page.get_by_text(f"Revoked key {key.prefix}").wait_for()
    assert ApiKey.objects.get(id=key.id).revoked_at is not None

    if prefix is None:  # operators manage allowlists: a tenant user has no such button
        assert page.get_by_role("button", name=re.compile("^Remove https:")).count() == 0
        return
    page.goto(f"{base}/tenants/{prefix.tenant_id}/")
    box = ask(f"Remove {prefix.prefix}")
    # Not drawn in place even with JavaScript: the allowlist is a plain form, the question a page.
    assert page.get_by_role("heading", name="Please confirm", level=1).is_visible()
    assert TargetPrefix.objects.filter(id=prefix.id).exists()
    box.get_by_role("button", name="Yes, remove the prefix").click()
    page.get_by_text(f"Removed {prefix.prefix}").wait_for()
    assert not TargetPrefix.objects.filter(id=prefix.id).exists()


def risky_objects():
    seed()
    acme, globex = Tenant.objects.get(slug="acme"), Tenant.objects.get(slug="globex")
    return {
        # A tenant admin of acme: acme's schedule, its ready run, its key.
        "alice": dict(schedule=Schedule.objects.get(name="invoice-sync"),
                      run=Run.objects.get(schedule__name="nightly-report", state=RunState.READY),
                      key=create_api_key(acme, label="ci-deploy", by=ACTOR)[0]),
        # The operator: another tenant's, a run in flight this time, and an allowlist prefix.
        "olga": dict(schedule=Schedule.objects.get(name="crm-sync"),
                     run=Run.objects.filter(schedule__name="crm-sync", state=RunState.LEASED).first(),
                     key=create_api_key(globex, label="crm-bridge", by=ACTOR)[0],
                     prefix=TargetPrefix.objects.get(tenant=globex), race_the_poll=True),
    }


@pytest.mark.parametrize("js", [True, False], ids=["javascript", "no-javascript"])
def test_pause_trigger_cancel_revoke_and_remove_prefix_ask_first_and_change_nothing_before_yes(live_server, open_as, js):
    objects = risky_objects()
    for who, these in objects.items():
        walk_risky_actions(open_as(who, None, js=js), live_server.url, js=js, **these)


# ------------------------------------------------------------------------ dead-letter queue


def test_a_dead_letter_bulk_action_keeps_the_filter_and_selects_all_matching(live_server, open_as):
    seed()
    base = live_server.url
    globex = Tenant.objects.get(slug="globex")
    crm = Schedule.objects.get(name="crm-sync")
    for _ in range(2):
        make_run(crm, RunState.DEAD, error="ConnectTimeout: no connection to hooks.globex.example:443 within 10 s",
                 http_status=None, excerpt="")
    invoices = list(Run.objects.filter(schedule__name="invoice-sync", state=RunState.DEAD).values_list("id", flat=True))
    assert len(invoices) == 3

    # A tenant admin without JavaScript: the group's link filters, "select all matching" asks on a page.
    page = open_as("alice", "/dlq/", js=False)
    assert page.get_by_text("crm-sync").count() == 0  # another tenant's
    page.get_by_role("link", name="Show the 3 runs of this group").click()
    page.get_by_test_id("select-all-matching").click()
    assert page.get_by_test_id("confirm-count").inner_text() == "3"
    assert Run.objects.filter(id__in=invoices, state=RunState.DEAD).count() == 3
    page.get_by_role("button", name="Yes, retry 3 runs").click()
    page.get_by_text("Retried 3 runs.").wait_for()
    assert f"schedule={Schedule.objects.get(name='invoice-sync').id}" in page.url
    assert "error=HTTP+503" in page.url
    assert page.get_by_label("Error starts with").input_value().startswith("HTTP 503")
    assert Run.objects.filter(id__in=invoices, state=RunState.READY).count() == 3
    assert Run.objects.filter(state=RunState.DEAD).count() == 5  # report's, crm-sync's 3, tps-reports'; untouched

    # The operator with JavaScript: the filter form (tenant, error text), then all 3 matching.
    page = open_as("olga", "/dlq/")
    page.get_by_label("Tenant").select_option(label="globex")
    page.wait_for_url(re.compile(f"tenant={globex.id}"))
    page.get_by_label("Error starts with").fill("ConnectTimeout")
    page.get_by_label("Error starts with").press("Enter")
    page.wait_for_url(re.compile("error=ConnectTimeout"))
    page.get_by_test_id("select-all-matching").filter(has_text="Select all 3 matching this filter").click()
    assert page.locator("#dlq-confirm").get_by_test_id("confirm-count").inner_text() == "3"
    assert Run.objects.filter(schedule=crm, state=RunState.DEAD).count() == 3
    page.get_by_role("button", name="Yes, retry 3 runs").click()
    page.get_by_text("Retried 3 runs.").wait_for()
    assert f"tenant={globex.id}" in page.url and "error=ConnectTimeout" in page.url
    assert page.get_by_label("Tenant").input_value() == str(globex.id)
    assert page.get_by_label("Error starts with").input_value() == "ConnectTimeout"
    assert Run.objects.filter(schedule=crm, state=RunState.DEAD).count() == 0
    assert set(Run.objects.filter(state=RunState.DEAD).values_list("schedule__name", flat=True)) == {
        "nightly-report", "tps-reports"}  # nothing outside the filters was touched


# --------------------------------------------------------------------------------- webhooks


def test_a_private_webhook_address_is_refused_when_it_is_saved(live_server, open_as, settings):
    seed()
    settings.SCHEDULER_TARGET_ALLOWED_NETWORKS = []  # as in production: no private network allowed
    base = live_server.url
    acme = Tenant.objects.get(slug="acme")
    page = open_as("olga", f"/tenants/{acme.id}/")
    for url in ("http://127.0.0.1/hook", "http://10.0.0.1/"):
        page.get_by_label("Notification webhook URL").fill(url)
        page.get_by_role("button", name="Save", exact=True).click()
        error = page.locator(".msg-error", has_text="Notification webhook URL")
        error.wait_for()
        assert "which the relay refuses to call" in error.inner_text()
        assert page.get_by_text("Settings saved.").count() == 0
        assert Tenant.objects.get(id=acme.id).notification_url == ""
    page.get_by_label("Notification webhook URL").fill("https://93.184.216.34/scheduler-events")
    page.get_by_role("button", name="Save", exact=True).click()
    page.get_by_text("Settings saved.").wait_for()
    assert Tenant.objects.get(id=acme.id).notification_url == "https://93.184.216.34/scheduler-events"

    # A tenant user reads the webhook but cannot change it, in the page or by a crafted post.
    page = open_as("alice", f"/tenants/{acme.id}/")
    assert page.get_by_label("Notification webhook URL").count() == 0
    assert page.get_by_text("https://93.184.216.34/scheduler-events").is_visible()
    assert post(page, base, f"/tenants/{acme.id}/settings", {"notification_url": "http://10.0.0.1/"}) == 404
    assert Tenant.objects.get(id=acme.id).notification_url == "https://93.184.216.34/scheduler-events"


# ------------------------------------------------------------------- secret, member roles


def test_a_tenant_admin_rotates_the_signing_secret_and_a_viewer_can_act_on_nothing(live_server, open_as):
    data = seed()
    base = live_server.url
    acme = Tenant.objects.get(slug="acme")
    key, _ = create_api_key(acme, label="ci-deploy", by=ACTOR)
    viewer_of(acme)
    old_secret = acme.signing_secret

    page = open_as("alice", "/tenants/")  # one tenant: straight to it
    page.get_by_role("heading", name="Acme Corp").wait_for()
    page.get_by_text("Show the secret").click()
    assert page.get_by_test_id("signing-secret").input_value() == old_secret
    page.get_by_role("button", name="Rotate the secret…").click()
    page.get_by_role("alertdialog").get_by_text("the old one stops working").wait_for()
    assert Tenant.objects.get(id=acme.id).signing_secret == old_secret
    page.get_by_role("button", name="Yes, rotate it").click()
    page.get_by_text("Rotated: give your targets the new secret below.").wait_for()
    new_secret = Tenant.objects.get(id=acme.id).signing_secret
    assert new_secret != old_secret
    page.get_by_text("Show the secret").click()
    assert page.get_by_test_id("signing-secret").input_value() == new_secret

    page = open_as("victor", f"/tenants/{acme.id}/")
    page.get_by_text("your role: viewer").wait_for()
    assert page.get_by_test_id("signing-secret").count() == 0
    for name in ("Rotate the secret…", f"Revoke key {key.prefix}", "Create key"):
        assert page.get_by_role("button", name=name).count() == 0, name
    report, dead = data["report"], data["dead"]
    page.goto(f"{base}/schedules/{report.id}/")
    page.get_by_role("heading", name="nightly-report").wait_for()
    for name in ("Pause…", "Trigger now…"):
        assert page.get_by_role("button", name=name).count() == 0, name
    for name in ("Edit", "Backfill…"):
        assert page.get_by_role("link", name=name, exact=True).count() == 0, name
    page.goto(f"{base}/runs/{dead.id}/")
    page.get_by_test_id("run-state").wait_for()
    assert page.get_by_role("button", name="Retry run").count() == 0
    page.goto(base + "/dlq/")
    page.get_by_role("heading", name="Dead-letter queue").wait_for()
    assert page.get_by_role("button", name="Review…").count() == 0 and page.locator("input[name=ids]").count() == 0
    page.goto(base + "/schedules/")
    assert page.get_by_role("link", name="New schedule").count() == 0

    runs_before = Run.objects.count()
    refused = {
        f"/tenants/{acme.id}/secret": {"confirm": "yes"},
        f"/tenants/{acme.id}/keys/{key.id}/revoke": {"confirm": "yes"},
        f"/tenants/{acme.id}/keys": {"label": "sneaky"},
        f"/schedules/{report.id}/pause": {"confirm": "yes"},
        f"/schedules/{report.id}/trigger": {"confirm": "yes"},
        f"/runs/{dead.id}/retry": {},
        "/dlq/action": {"action": "retry", "scope": "filter", "confirm": "yes"},
        "/schedules/new": {"tenant": str(acme.id), "expression": "* * * * *", "time_zone": "UTC",
                           "target_url": "https://api.acme.example/x"},
    }
    for path, form in refused.items():
        assert post(page, base, path, form) == 403, path
    assert Tenant.objects.get(id=acme.id).signing_secret == new_secret
    assert ApiKey.objects.get(id=key.id).revoked_at is None and ApiKey.objects.filter(tenant=acme).count() == 1
    assert Schedule.objects.get(id=report.id).enabled
    assert Run.objects.get(id=dead.id).state == RunState.DEAD and Run.objects.count() == runs_before
    assert not Schedule.objects.filter(current__target_url="https://api.acme.example/x").exists()


# -------------------------------------------------------------------------- times and zones


def next_run_text(page) -> str:
    return page.locator("#schedule-actions .statebar").inner_text()


def test_the_time_display_choice_changes_the_times_shown(live_server, open_as):
    data = seed()
    base = live_server.url
    report = Schedule.objects.get(id=data["report"].id)  # 30 2 * * * in America/New_York
    shown = {zone: format_in(report.next_run_at, tz) for zone, tz in (
        ("utc", UTC), ("schedule", ZoneInfo("America/New_York")), ("browser", ZoneInfo("Asia/Tokyo")))}
    assert shown["schedule"].endswith(("EST", "EDT")) and shown["browser"].endswith("JST")

    page = open_as("olga", f"/schedules/{report.id}/", timezone_id="Asia/Tokyo")
    assert shown["utc"] in next_run_text(page)  # the default
    page.screenshot(path=str(SHOTS / "schedule.png"), full_page=True)
    for mode in ("schedule", "browser", "utc"):
        page.get_by_label("Times in").select_option(mode)  # submits itself with JavaScript
        page.wait_for_function(f"document.documentElement.dataset.tzMode === '{mode}'")
        assert shown[mode] in next_run_text(page), mode
        assert {c["name"]: c["value"] for c in page.context.cookies()}["portal_tz"] == mode
    assert {c["name"]: c["value"] for c in page.context.cookies()}["portal_browser_tz"] == "Asia/Tokyo"

    # Without JavaScript: the Set button; the browser's zone cannot be known, and the page says so.
    page = open_as("alice", f"/schedules/{report.id}/", js=False, timezone_id="Asia/Tokyo")
    assert shown["utc"] in next_run_text(page)
    page.get_by_label("Times in").select_option("schedule")
    page.get_by_role("button", name="Set", exact=True).click()
    page.wait_for_url(f"{base}/schedules/{report.id}/")
    assert shown["schedule"] in next_run_text(page)
    page.get_by_label("Times in").select_option("browser")
    page.get_by_role("button", name="Set", exact=True).click()
    page.get_by_text("your browser has not told us its zone yet (it needs JavaScript): times are in UTC").wait_for()
    assert shown["utc"] in next_run_text(page)


# ---------------------------------------------------------------------------------- workers


def test_the_workers_page_lists_a_live_worker_with_its_heartbeat_version_and_calls(live_server, open_as, target):
    """A real worker (dispatch.worker) in a thread, calling a target that holds the call until the
    test lets it go; the tenant's in-flight cap of 1 keeps a second due run waiting."""
    seed()
    base = live_server.url
    acme = Tenant.objects.get(slug="acme")
    Run.objects.filter(state=RunState.READY).update(state=RunState.CANCELED, next_eligible_at=None,
                                                    finished_at=db_now(), reason="canceled")  # only ours is due
    add_target_prefix(acme, target.url + "/", by=ACTOR)
    Tenant.objects.filter(id=acme.id).update(max_in_flight=1)
    warehouse = make_schedule(acme, target.url + "/warehouse/sync", name="warehouse-sync", expression="0 4 * * *")
    release = threading.Event()
    target.responder = lambda delivery: (release.wait(30), (200, b'{"ok": true}'))[1]
    calls = [actions.trigger_schedule(warehouse, by=ACTOR) for _ in range(2)]
    WorkerStat.objects.create(worker_id="old-host:4711", started_at=db_now() - timedelta(hours=5),
                              seen_at=db_now() - timedelta(hours=3), claimed_runs=5120, version="0.9.0")
    stop = threading.Event()
    worker = threading.Thread(target=run_worker, args=("browser-host:1",),
                              kwargs={"stop": stop, "poll_seconds": 0.1, "grace_seconds": 2, "concurrency": 4})
    worker.start()
    try:
        for _ in range(200):
            if target.deliveries and WorkerStat.objects.filter(worker_id="browser-host:1").exists():
                break
            threading.Event().wait(0.05)
        leased = Run.objects.get(id__in=[c.id for c in calls], state=RunState.LEASED)
        assert leased.lease_owner == "browser-host:1"
        for who in ("olga", "alice"):
            page = open_as(who)
            page.get_by_role("link", name="Workers").click()
            row = page.locator("table.workers tbody tr", has_text="browser-host:1")
            row.wait_for()
            cells = row.locator("td")
            assert cells.nth(0).inner_text() == software_version()
            assert re.fullmatch(r"just now|\d+(\.\d)? s ago", row.get_by_test_id("heartbeat").inner_text())
            assert cells.nth(3).inner_text() == "1"  # in flight
            call = row.get_by_role("link", name="warehouse-sync")
            assert call.get_attribute("href") == f"/runs/{leased.id}/"
            assert "acme → 127.0.0.1" in row.inner_text()
            waiting = page.locator("section[aria-labelledby=h-backlog] tbody tr", has_text="acme")
            assert "the tenant's cap: 1 of 1 runs in flight" in waiting.inner_text()
            if who == "olga":
                assert page.get_by_text("old-host:4711").is_visible()  # gone, listed apart
                page.screenshot(path=str(SHOTS / "workers.png"), full_page=True)
    finally:
        release.set()
        for _ in range(200):
            if Run.objects.filter(id__in=[c.id for c in calls], state=RunState.SUCCEEDED).count() == 2:
                break
            threading.Event().wait(0.05)
        stop.set()
        worker.join(15)
    assert not worker.is_alive()
    assert Run.objects.filter(id__in=[c.id for c in calls], state=RunState.SUCCEEDED).count() == 2


# ------------------------------------------------------------------------------ small screens


def test_no_page_is_wider_than_a_phone(live_server, open_as):
    data = seed()
    base = live_server.url
    acme = Tenant.objects.get(slug="acme")
    pages = {
        "dashboard": "/", "runs": "/runs/", "a run": f"/runs/{data['dead'].id}/", "schedules": "/schedules/",
        "a schedule": f"/schedules/{data['report'].id}/", "the form": "/schedules/new",
        "the edit form": f"/schedules/{data['report'].id}/edit", "dead letters": "/dlq/", "workers": "/workers/",
        "tenant": f"/tenants/{acme.id}/", "audit": "/audit/", "backfill": f"/schedules/{data['report'].id}/backfill",
    }
    for who in ("olga", "alice"):
        page = open_as(who, None, width=390)
        too_wide = {}
        for name, path in pages.items():
            response = page.goto(base + path)
            assert response.status == 200, (who, name)
            width = page.evaluate("document.documentElement.scrollWidth")
            if width > 390:
                too_wide[name] = width
        assert too_wide == {}, who


# -------------------------------------------------------------------------------- the admin


def test_the_admin_offers_no_bulk_delete_of_schedules(live_server, open_as):
    seed()
    base = live_server.url
    User.objects.create_superuser("root", password=PASSWORDS["root"])
    schedules = list(Schedule.objects.values_list("id", flat=True))
    for who in ("root", "olga"):
        page = open_as(who, "/admin/schedules/schedule/")
        action = page.get_by_role("combobox", name="Action")
        options = action.locator("option").all_inner_texts()
        assert options and not any("Delete" in o for o in options), (who, options)
        # Posted anyway: nothing is deleted.
        status = post(page, base, "/admin/schedules/schedule/",
                      {"action": "delete_selected", "_selected_action": [str(s) for s in schedules]})
        assert status in (200, 302)
        assert sorted(Schedule.objects.values_list("id", flat=True)) == sorted(schedules)
    page = open_as("alice", "/admin/schedules/schedule/")
    assert "/admin/login/" in page.url  # tenant users have no admin
