"""Issue 26, findings 7 and 11 in a real browser (Debian's Chromium through Playwright) at 1440 px:
filters set from drop-downs and page 2 are in the URL (reload and sharing keep them), an invalid
filter is said, archiving asks first, a viewer's refusal is a page, the edit conflict shows both
values. Screenshots go where test_browser.py puts its own (a temporary folder unless asked)."""

import re

import pytest
from django.contrib.auth.models import User

from runs.actions import edit_schedule
from scheduler_project.web.portal import common
from schedules.models import MemberRole, Schedule, ScheduleStatus, TenantMembership
from tests.helpers import ACTOR

from .test_browser import ARGS, CHROMIUM, SHOTS, _django_beside_playwright, browser, log_in, seed  # noqa: F401

pytestmark = [pytest.mark.browser]


@pytest.fixture
def wide(browser):  # noqa: F811
    ctx = browser.new_context(viewport={"width": 1440, "height": 900}, device_scale_factor=1)
    pg = ctx.new_page()
    pg.set_default_timeout(10_000)
    yield pg
    ctx.close()


def shot(page, name):
    page.screenshot(path=str(SHOTS / f"silences-{name}.png"), full_page=True)


def test_filters_from_drop_downs_and_page_2_are_in_the_url(live_server, wide, monkeypatch):
    monkeypatch.setattr(common, "PAGE_SIZE", 1)
    seed()
    base = live_server.url
    log_in(wide, base, "olga", "pw-olga-123")
    wide.goto(base + "/runs/")
    wide.locator("#f-state").select_option("succeeded")
    wide.wait_for_url(re.compile(r"[?&]state=succeeded"))
    wide.get_by_role("link", name="Older »").click()
    wide.wait_for_url(re.compile(r"[?&]after=.+"))
    assert "state=succeeded" in wide.url
    page_2 = wide.locator("#results tbody").inner_text()
    wide.reload()
    assert wide.locator("#f-state").input_value() == "succeeded"
    assert wide.locator("#results tbody").inner_text() == page_2
    shot(wide, "runs-page-2")

    wide.goto(base + "/schedules/")
    wide.locator("#f-status").select_option("active")
    wide.wait_for_url(re.compile(r"[?&]status=active"))
    wide.locator("#f-tenant").select_option(label="acme")
    wide.wait_for_url(re.compile(r"[?&]tenant=[0-9a-f-]{36}"))
    assert "status=active" in wide.url
    wide.get_by_role("link", name="Next »").click()
    wide.wait_for_url(re.compile(r"[?&]after=.+"))
    assert "status=active" in wide.url and "tenant=" in wide.url
    wide.reload()
    assert wide.locator("#f-status").input_value() == "active"
    shot(wide, "schedules-page-2")

    for path, older in (("/dlq/", "Older »"), ("/audit/", "Older »")):
        wide.goto(base + path)
        wide.locator("#f-tenant, #a-tenant").first.select_option(label="acme")
        wide.wait_for_url(re.compile(r"[?&]tenant=[0-9a-f-]{36}"))
        wide.get_by_role("link", name=older).click()
        wide.wait_for_url(re.compile(r"[?&]after=.+"))
        assert "tenant=" in wide.url, wide.url
        tenant = wide.locator("#f-tenant, #a-tenant").first.input_value()
        wide.reload()
        assert wide.locator("#f-tenant, #a-tenant").first.input_value() == tenant

    # Switching how times are shown returns to the filtered page 2, not to the page as first drawn.
    at = wide.url
    wide.locator("#tz-mode").select_option("browser")
    wide.wait_for_load_state()
    wide.locator("#tz-mode").filter(has=wide.locator("option[selected][value=browser]")).wait_for()
    assert wide.url == at, (wide.url, at)


def test_an_invalid_filter_is_said_in_the_page(live_server, wide):
    seed()
    base = live_server.url
    log_in(wide, base, "olga", "pw-olga-123")
    for path in ("/schedules/?status=bogus", "/runs/?state=exploded&from=yesterday", "/dlq/?tenant=acme",
                 "/audit/?tenant=acme"):
        resp = wide.goto(base + path)
        assert resp.status == 400
        assert wide.get_by_test_id("filter-errors").is_visible()
        assert wide.locator("#results table").count() == 0
        shot(wide, "invalid-filter-" + path.strip("/").split("/")[0])


def test_archiving_asks_first_and_a_viewer_gets_a_page_saying_which_role(live_server, wide):
    data = seed()
    base = live_server.url
    log_in(wide, base, "olga", "pw-olga-123")
    wide.goto(base + f"/schedules/{data['report'].id}/")
    wide.get_by_role("button", name="Archive…").click()
    wide.get_by_role("alertdialog").get_by_text("Its history (versions, runs, audit) is kept").wait_for()
    shot(wide, "archive-confirm")
    assert Schedule.objects.get(id=data["report"].id).status == ScheduleStatus.ACTIVE
    wide.get_by_role("button", name="Yes, archive it").click()
    wide.get_by_test_id("schedule-status").filter(has_text="archived").wait_for()
    shot(wide, "archived")

    wide.goto(base + "/admin/schedules/schedule/")
    wide.locator("input[name=_selected_action]").first.check()
    wide.locator("select[name=action]").select_option("archive")
    wide.get_by_role("button", name="Go").click()
    wide.get_by_text("Yes, archive them").wait_for()
    shot(wide, "admin-archive-confirm")
    membership = TenantMembership.objects.get(user__username="alice")
    wide.goto(base + f"/admin/schedules/tenantmembership/{membership.id}/change/")
    assert wide.locator("#content h2, .breadcrumbs").filter(has_text="alice in acme (admin)").count() >= 1
    shot(wide, "admin-memberships")

    TenantMembership.objects.filter(user__username="alice").update(role=MemberRole.VIEWER)
    ctx = wide.context.browser.new_context(viewport={"width": 1440, "height": 900})
    viewer = ctx.new_page()
    log_in(viewer, base, "alice", "pw-alice-123")
    invoices = Schedule.objects.get(name="invoice-sync")
    resp = viewer.goto(base + f"/schedules/{invoices.id}/edit")
    assert resp.status == 403
    assert "admin role in this tenant" in viewer.get_by_test_id("forbidden-reason").inner_text()
    shot(viewer, "viewer-403")
    ctx.close()


def test_the_day_chart_and_the_edit_conflict_at_1440_px(live_server, wide):
    data = seed()
    base = live_server.url
    log_in(wide, base, "olga", "pw-olga-123")
    wide.goto(base + "/?range=day")
    wide.locator("svg.chart").first.wait_for()
    boxes = wide.evaluate("""() => [...document.querySelectorAll('svg.chart')].map(svg =>
        [...svg.querySelectorAll('text.axis')].filter(t => t.getAttribute('y') > 150)
          .map(t => { const r = t.getBoundingClientRect(); return [r.left, r.right, t.textContent]; }))""")
    for labels in boxes:
        for (l1, r1, t1), (l2, r2, t2) in zip(labels, labels[1:]):
            assert r1 <= l2, f"{t1!r} overlaps {t2!r}"
    shot(wide, "dashboard-day")

    report = data["report"]
    wide.goto(base + f"/schedules/{report.id}/edit")
    edit_schedule(report, expected_version=1, changes={"expression": "45 3 * * SUN", "name": "weekly-report"}, by=ACTOR)
    wide.locator("#s-expression").fill("15 4 * * SUN")
    wide.get_by_role("button", name="Save as version 2").click()
    wide.get_by_test_id("conflicts").wait_for()
    shot(wide, "edit-conflict")
    assert wide.locator("#s-name").input_value() == "weekly-report"
    wide.get_by_label(re.compile("Keep theirs")).check()
    wide.get_by_role("button", name="Save as version 3").click()
    wide.wait_for_url(re.compile(r"/schedules/[0-9a-f-]{36}/$"))
    v = Schedule.objects.select_related("current").get(id=report.id).current
    assert v.expression == "45 3 * * SUN" and v.name == "weekly-report" and v.version == 2


def test_all_errors_of_a_form_at_once_and_the_api_root(live_server, wide):
    seed()
    base = live_server.url
    log_in(wide, base, "olga", "pw-olga-123")
    wide.goto(base + "/schedules/new")
    wide.locator("#s-expression").fill("not a rule")
    wide.locator("#s-url").fill("https://elsewhere.example/hook")
    wide.locator("#s-attempts").fill("many")
    wide.get_by_role("button", name="Create schedule").click()
    wide.locator(".field-error").first.wait_for()
    errors = wide.locator(".field-error").all_inner_texts()
    assert len(errors) >= 3, errors
    assert any("allowlist" in e for e in errors) and any("whole number" in e for e in errors)
    shot(wide, "create-all-errors")

    from schedules.models import Tenant

    acme = Tenant.objects.get(slug="acme")
    wide.goto(base + f"/tenants/{acme.id}/")
    form = wide.locator("form[action$='/settings']")
    form.locator("[name=notification_url]").fill("ftp://nowhere")
    form.locator("[name=max_in_flight]").fill("many")
    form.locator("button[type=submit]").click()
    wide.get_by_text("Max runs in flight:").first.wait_for()
    assert wide.get_by_text("Notification webhook URL:").first.is_visible()
    shot(wide, "tenant-settings-all-errors")

    resp = wide.goto(base + "/api/v1/")
    assert resp.status == 200 and '"schedules"' in wide.content()
    shot(wide, "api-root")
