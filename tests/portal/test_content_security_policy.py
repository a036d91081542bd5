"""Every response carries a Content-Security-Policy that allows scripts and styles from this server
only (plus three exact inline texts, each by its hash); and the portal, the admin and the API docs
work under it in a real browser without a single violation."""

import re

import pytest
from django.contrib.auth.models import User

from runs.models import RunState
from scheduler_project.web.csp import HTMX_INDICATOR_STYLE, SELECT_ON_FOCUS, sha256_source
from schedules.tenants import create_tenant
from tests.helpers import make_schedule

from .conftest import login, make_run
from .test_browser import ARGS, CHROMIUM, _django_beside_playwright, browser, log_in  # noqa: F401  (fixtures)


def directives(policy: str) -> dict:
    return {d.split()[0]: d.split()[1:] for d in (p.strip() for p in policy.split(";")) if d}


@pytest.mark.django_db
def test_portal_admin_and_api_answers_carry_the_policy(operator):
    for path in ("/", "/accounts/login/", "/admin/", "/api/v1/schedules", "/healthz"):
        policy = directives(operator.get(path)["Content-Security-Policy"])
        assert policy["default-src"] == ["'self'"] and policy["object-src"] == ["'none'"], path
        assert policy["frame-ancestors"] == ["'none'"]
        assert "'unsafe-inline'" not in policy["script-src"] and "'unsafe-eval'" not in policy["script-src"]
        assert policy["script-src"] == ["'self'", "'unsafe-hashes'", sha256_source(SELECT_ON_FOCUS)]
        assert policy["style-src"] == ["'self'", sha256_source(HTMX_INDICATOR_STYLE)]


@pytest.mark.django_db
def test_the_api_docs_page_allows_exactly_its_own_inline_blocks(client):
    resp = client.get("/api/docs/")
    assert resp.status_code == 200
    policy = directives(resp["Content-Security-Policy"])
    inline = re.findall(rb"<(script|style)>(.*?)</\1>", resp.content, re.S)
    assert inline, "the docs page has no inline block any more: this exception can go"
    for tag, body in inline:
        assert sha256_source(body) in policy[f"{tag.decode()}-src"]
    assert "'unsafe-inline'" not in policy["script-src"]


@pytest.mark.django_db
def test_the_policy_can_be_replaced_or_turned_off(client, settings):
    settings.SCHEDULER_CONTENT_SECURITY_POLICY = "default-src 'none'"
    assert client.get("/accounts/login/")["Content-Security-Policy"] == "default-src 'none'"
    settings.SCHEDULER_CONTENT_SECURITY_POLICY = ""
    assert "Content-Security-Policy" not in client.get("/accounts/login/")


# ------------------------------------------------------------------ in a real browser

COLLECT = """
window.__csp = [];
document.addEventListener('securitypolicyviolation',
  e => window.__csp.push(e.violatedDirective + ' ' + (e.blockedURI || 'inline') + ' ' + (e.sample || '')));
"""


@pytest.mark.browser
def test_the_portal_the_admin_and_the_api_docs_run_without_a_violation(live_server, browser):  # noqa: F811
    acme = create_tenant("acme", name="Acme", allow_targets=["https://api.acme.example/"])
    schedule = make_schedule(acme, "https://api.acme.example/hook", name="nightly", expression="0 2 * * *")
    dead = make_run(schedule, RunState.DEAD)
    User.objects.create_superuser("root", password="pw-root-123")
    ctx = browser.new_context()
    ctx.add_init_script(COLLECT)
    page = ctx.new_page()
    page.set_default_timeout(10_000)
    console = []
    page.on("console", lambda m: console.append(m.text) if "Content Security Policy" in m.text else None)
    base = live_server.url
    seen = {}
    try:
        log_in(page, base, "root", "pw-root-123")
        for path in ("/", "/schedules/", f"/schedules/{schedule.id}/", f"/runs/{dead.id}/", "/dlq/", "/audit/",
                     f"/tenants/{acme.id}/", "/admin/", "/admin/runs/run/", f"/admin/schedules/tenant/{acme.id}/change/",
                     "/api/docs/"):
            page.goto(base + path)
            page.wait_for_load_state("networkidle")
            seen[path] = page.evaluate("window.__csp")
        # htmx at work (its indicator style), and the new-key field with its focus handler.
        page.goto(f"{base}/tenants/{acme.id}/")
        page.get_by_label("New key label").fill("browser")
        page.get_by_role("button", name="Create key").click()
        page.locator("#new-key").focus()
        page.wait_for_load_state("networkidle")
        seen["create key"] = page.evaluate("window.__csp")
        page.goto(base + "/api/docs/")
        page.locator(".swagger-ui .info").wait_for()
        seen["docs rendered"] = page.evaluate("window.__csp")
    finally:
        ctx.close()
    violations = {path: v for path, v in seen.items() if v}
    assert not violations and not console, (violations, console)
