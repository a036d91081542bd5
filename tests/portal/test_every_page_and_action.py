"""Every portal page and every action, as an operator, as a tenant user and as a user of two
tenants, over three tenants with runs in every state and schedules in every status: found by
following the pages' own links and submitting their own forms, so a page or button added later is
covered without being listed here. Nothing may answer 5xx; a tenant user never sees another
tenant's names. Runs on PostgreSQL and on the quickstart's SQLite database."""

from datetime import timedelta
from html.parser import HTMLParser
from urllib.parse import urldefrag, urlsplit

import pytest
from django.contrib.auth.models import User

from runs.actions import archive_schedule, pause_schedule
from runs.models import AttemptOutcome, RunState
from schedules.models import TenantMembership
from schedules.services import SYSTEM
from schedules.tenants import create_api_key, create_tenant
from tests.helpers import ACTOR, make_schedule

from .conftest import login, make_run

pytestmark = [pytest.mark.django_db, pytest.mark.beside_soak]

PAGE_BUDGET = 400
SKIP_PREFIXES = ("/accounts/logout", "/static/", "/api/", "/admin/logout", "/admin/jsi18n")


class Page(HTMLParser):
    """The links and forms of one page."""

    def __init__(self):
        super().__init__()
        self.links: list[str] = []
        self.forms: list[dict] = []
        self._form = None
        self._select = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
        elif tag == "form":
            self._form = {"action": a.get("action") or "", "method": (a.get("method") or "get").lower(), "fields": []}
            self.forms.append(self._form)
        elif self._form is not None and tag == "input" and a.get("name"):
            kind = (a.get("type") or "text").lower()
            if kind in ("checkbox", "radio") and "checked" not in a:
                if kind == "checkbox" and a["name"] == "ids":
                    self._form["fields"].append((a["name"], a.get("value", "on")))  # select rows for bulk actions
                return
            if kind not in ("submit", "button", "image"):
                self._form["fields"].append((a["name"], a.get("value", "")))
        elif self._form is not None and tag == "button" and a.get("name"):
            self._form.setdefault("buttons", []).append((a["name"], a.get("value", "")))
        elif self._form is not None and tag == "select" and a.get("name"):
            self._select = a["name"]
        elif self._form is not None and tag == "option" and self._select:
            if "selected" in a or not any(f[0] == self._select for f in self._form["fields"]):
                self._form["fields"] = [f for f in self._form["fields"] if f[0] != self._select]
                self._form["fields"].append((self._select, a.get("value", "")))
        elif self._form is not None and tag == "textarea" and a.get("name"):
            self._form["fields"].append((a["name"], ""))

    def handle_endtag(self, tag):
        if tag == "form":
            self._form = None
        elif tag == "select":
            self._select = None


def parse(html: str) -> Page:
    p = Page()
    p.feed(html)
    return p


def local(url: str, base: str) -> str | None:
    url = urldefrag(url)[0]
    if not url or url.startswith(("mailto:", "javascript:")):
        return None
    parts = urlsplit(url)
    if parts.scheme or parts.netloc:
        return None
    if not parts.path:
        path = urlsplit(base).path
    elif not parts.path.startswith("/"):
        path = urlsplit(base).path.rsplit("/", 1)[0] + "/" + parts.path
    else:
        path = parts.path
    if path.startswith(SKIP_PREFIXES):
        return None
    return path + (f"?{parts.query}" if parts.query else "")


@pytest.fixture
def world(target):
    """Three tenants; in each, schedules active, paused, completed and archived, and runs in every
    state (dead ones with failed and unknown outcomes)."""
    tenants = []
    for slug in ("acme", "globex", "initech"):
        t = create_tenant(slug, name=slug.title(), allow_targets=[target.url + "/"], by=SYSTEM)
        create_api_key(t, label=f"{slug}-service", by=SYSTEM)
        active = make_schedule(t, target.url + f"/{slug}/nightly", name=f"{slug}-nightly", expression="30 2 * * *",
                               tz="Europe/Berlin")
        for state in RunState.values:
            make_run(active, state)
        make_run(active, RunState.DEAD, outcome=AttemptOutcome.UNKNOWN, error="lease expired", age=timedelta(hours=1))
        paused = make_schedule(t, target.url + f"/{slug}/paused", name=f"{slug}-paused", expression="*/5 * * * *")
        make_run(paused, RunState.SUCCEEDED)
        pause_schedule(paused, by=ACTOR)
        archived = make_schedule(t, target.url + f"/{slug}/old", name=f"{slug}-archived", expression="@daily")
        archive_schedule(archived, by=ACTOR)
        tenants.append(t)
    return tenants


def user(name, *, staff=False, superuser=False, tenants=()):
    u = User.objects.create_user(name, password=f"pw-{name}-123", is_staff=staff, is_superuser=superuser)
    for t in tenants:
        TenantMembership.objects.create(user=u, tenant=t)
    return u


def crawl(client, start: str = "/", *, budget: int = PAGE_BUDGET, within: str = "/"):
    """Visit every page under `within` reachable by links from `start` (GET), also as an htmx
    fragment; returns {path: (status, html)}. The admin is crawled on its own (`within="/admin/"`),
    without its changelists' sort and filter variants (Django's own, not ours)."""
    seen, queue, pages = set(), [start], {}
    while queue and len(pages) < budget:
        path = queue.pop(0)
        if path in seen:
            continue
        seen.add(path)
        r = client.get(path)
        assert r.status_code < 500, f"GET {path} answered {r.status_code}"
        frag = client.get(path, HTTP_HX_REQUEST="true")
        assert frag.status_code < 500, f"GET {path} (htmx) answered {frag.status_code}"
        html = r.content.decode("utf-8", "replace") if r.get("Content-Type", "").startswith("text/html") else ""
        pages[path] = (r.status_code, html)
        for link in parse(html).links:
            nxt = local(link, path)
            if not nxt or nxt in seen or not nxt.startswith(within):
                continue
            if within == "/" and nxt.startswith("/admin/"):
                continue
            if within == "/admin/" and "?" in nxt:
                continue
            queue.append(nxt)
    return pages


def submit_every_form(client, pages: dict) -> int:
    """POST every form the pages show (with their own values; a confirmation step is confirmed),
    GET every GET form; returns how many were sent."""
    sent = 0
    for path, (_, html) in list(pages.items()):
        for form in parse(html).forms:
            action = local(form["action"], path) if form["action"] else path
            if action is None:
                continue
            data = {}
            for name, value in form["fields"]:
                data.setdefault(name, []).append(value)
            for name, value in form.get("buttons", [])[:1]:
                data.setdefault(name, []).append(value)
            if form["method"] == "get":
                r = client.get(action.split("?")[0], {k: v for k, v in data.items()})
            else:
                r = client.post(action, data)
                if r.status_code == 200 and b'name="confirm"' in r.content:
                    r = client.post(action, {**data, "confirm": ["yes"]})
            sent += 1
            assert r.status_code < 500, f"{form['method'].upper()} {action} with {data} answered {r.status_code}"
    return sent


@pytest.mark.parametrize("persona", ["operator", "tenant user", "user of two tenants"])
def test_every_page_and_every_action_answers_without_a_server_error(world, persona):
    acme, globex, initech = world
    u = {
        "operator": lambda: user("olga", staff=True, superuser=True),
        "tenant user": lambda: user("alice", tenants=[acme]),
        "user of two tenants": lambda: user("tom", tenants=[acme, globex]),
    }[persona]()
    client = login(u)
    pages = crawl(client)
    visited = set(pages)
    # The crawl reached every kind of page (the detail pages of runs, schedules and tenants too).
    for prefix in ("/runs/", "/dlq/", "/schedules/", "/audit/", "/tenants/"):
        assert any(p.startswith(prefix) for p in visited), (prefix, sorted(visited)[:20])
    assert sum(1 for p in visited if p.startswith("/runs/") and p.count("/") == 3) >= 5  # run detail pages
    if persona == "operator":
        assert any(p.startswith("/admin/") for p in visited) or client.get("/admin/").status_code == 200
        pages.update(crawl(client, "/admin/", budget=100, within="/admin/"))
    hidden = {"operator": [], "tenant user": ["globex", "initech"], "user of two tenants": ["initech"]}[persona]
    for path, (status, html) in pages.items():
        for other in hidden:
            assert f"{other}-nightly" not in html, f"{persona} sees {other}'s schedule on {path}"
    assert submit_every_form(client, pages) > 10
    # After every action has been tried, every page still renders.
    crawl(client)
