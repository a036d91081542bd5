"""Owners, retry cost and the DLQ by owner in a real browser (Debian's Chromium through
Playwright), as an operator, a tenant admin and a tenant viewer: what each sees and may press.
Screenshots go to SCHEDULER_OWNER_SHOTS (a folder) when set, else to a temporary folder."""

import os
import tempfile
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from dispatch.activity import ActivityAggregator, drain
from dispatch.models import Notification
from runs.actions import trigger_schedule
from runs.models import Attempt, AttemptOutcome, Run, RunState
from scheduler_project.web.access import ROLE_OPERATOR, role
from schedules.models import MemberRole, Schedule, TenantMembership
from schedules.owners import create_owner, edit_owner, set_default_owner
from schedules.tenants import create_tenant
from tests.helpers import ACTOR, make_schedule

from .conftest import make_run
from .test_browser import _django_beside_playwright, browser, log_in, page  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SHOTS = Path(os.environ.get("SCHEDULER_OWNER_SHOTS") or tempfile.mkdtemp(prefix="scheduler-owner-shots-"))


def one_run(schedule, outcomes, *, ago):
    run = trigger_schedule(schedule, by=ACTOR)
    start = run.scheduled_time - ago
    Run.objects.filter(id=run.id).update(scheduled_time=start)
    for i, outcome in enumerate(outcomes):
        began = start + timedelta(seconds=40 * i)
        Attempt.objects.create(run_id=run.id, scheduled_time=start, generation=i + 1, worker_id="w:1",
                               started_at=began, finished_at=began + timedelta(seconds=7), outcome=outcome)


def seed():
    acme = create_tenant("acme", name="Acme Corp", allow_targets=["https://api.acme.example/"])
    User.objects.create_superuser("olga", "olga@example.com", "pw-olga-123").groups.add(role(ROLE_OPERATOR))
    for name, member_role in (("alice", MemberRole.ADMIN), ("vera", MemberRole.VIEWER)):
        u = User.objects.create_user(name, password=f"pw-{name}-123")
        TenantMembership.objects.create(user=u, tenant=acme, role=member_role)
    billing = create_owner(acme, {"slug": "billing", "name": "Billing team", "email": "billing@acme.example",
                                  "webhook_url": "https://hooks.acme.example/billing", "webhook_format": "slack"},
                           by=ACTOR)
    edit_owner(billing, {"time_zone": "Europe/Paris", "quiet_start": "22:00", "quiet_end": "07:00",
                         "max_per_hour": 10}, by=ACTOR)
    ops = create_owner(acme, {"slug": "ops", "name": "Operations"}, by=ACTOR)
    set_default_owner(acme, ops, by=ACTOR)
    export = make_schedule(acme, "https://api.acme.example/export", name="nightly-export", expression="0 2 * * *")
    invoices = make_schedule(acme, "https://api.acme.example/invoices", name="invoice-sync")
    cleanup = make_schedule(acme, "https://api.acme.example/cleanup", name="tmp-cleanup")
    Schedule.objects.filter(id__in=[export.id, invoices.id]).update(owner=billing)
    Schedule.objects.filter(id=cleanup.id).update(owner=None)
    F, S, U = AttemptOutcome.FAILED, AttemptOutcome.SUCCEEDED, AttemptOutcome.UNKNOWN
    for hours, outcomes in ((30, [F, F, S]), (20, [S]), (5, [F, U, F, S]), (2, [S])):
        one_run(export, outcomes, ago=timedelta(hours=hours))
    for hours in range(1, 12):
        one_run(invoices, [F, S] if hours % 4 == 0 else [S], ago=timedelta(hours=hours, minutes=5))
    one_run(cleanup, [S], ago=timedelta(hours=3))
    drain(ActivityAggregator(settle=timedelta(0)))
    for s, n in ((export, 3), (invoices, 1), (cleanup, 2)):
        for _ in range(n):
            make_run(s, RunState.DEAD, error="HTTP 503 from target")
    return {"acme": acme, "billing": billing, "export": export}


def shot(page, name):
    page.screenshot(path=str(SHOTS / name), full_page=True)


def test_each_role_sees_the_retry_cost_owner_page_and_dlq_by_owner(live_server, page):
    data = seed()
    base = live_server.url
    page.set_default_timeout(30_000)  # a shared, busy machine; nothing here is a speed goal
    billing, export = data["billing"], data["export"]
    for user in ("olga", "alice", "vera"):
        log_in(page, base, user, f"pw-{user}-123")
        page.goto(f"{base}/schedules/{export.id}/")
        cost = page.get_by_test_id("retry-cost")
        cost.wait_for()
        assert "last 24h" in cost.inner_text() and "last 7d" in cost.inner_text()
        shot(page, f"{user}-schedule.png")

        page.goto(f"{base}/owners/{billing.id}/")
        page.get_by_role("heading", name="Billing team").wait_for()
        assert "22:00 to 07:00 Europe/Paris" in page.get_by_test_id("quiet-hours").inner_text()
        button = page.get_by_role("button", name="Send a test notification")
        if user == "vera":
            assert button.count() == 0
        else:
            before = Notification.objects.count()
            button.click()
            page.get_by_text("A test notification is queued").wait_for()
            assert Notification.objects.count() == before + 2  # webhook and e-mail
            assert page.get_by_test_id("notifications").get_by_text("incident.test").first.is_visible()
        shot(page, f"{user}-owner.png")

        page.goto(f"{base}/retry-cost/?by=schedule&window=7d")
        ranking = page.get_by_test_id("retry-cost-ranking")
        ranking.wait_for()
        first_row = ranking.locator("tbody tr").first.inner_text()
        assert "nightly-export" in first_row  # the most retries first
        page.get_by_label("By", exact=True).select_option("owner")
        page.get_by_role("heading", name="acme: by owner, last 7d").wait_for()
        shot(page, f"{user}-retry-cost.png")

        page.goto(f"{base}/dlq/")
        by_owner = page.get_by_test_id("dlq-by-owner")
        by_owner.wait_for()
        assert "Billing team" in by_owner.inner_text() and "No owner" in by_owner.inner_text()
        by_owner.get_by_role("link", name="Show the 4 runs of this owner").click()
        page.wait_for_url(f"**owner={billing.id}**")
        assert page.locator("#results").get_by_text("tmp-cleanup").count() == 0
        shot(page, f"{user}-dlq.png")

        if user != "vera":
            page.goto(f"{base}/schedules/{export.id}/edit")
            owner_field = page.get_by_label("Owner")
            assert owner_field.input_value() == str(billing.id)
            shot(page, f"{user}-form.png")
        page.context.clear_cookies()
