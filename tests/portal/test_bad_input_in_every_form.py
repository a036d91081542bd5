"""Every portal form and filter fed the values that broke it from outside: NUL (PostgreSQL refuses
it in text), huge strings, 30-digit numbers, digits that are not ASCII (`²`, Arabic-Indic),
negative and zero numbers, dates at the ends of the calendar with offsets that push them past it.
The forms are found the way the crawl finds them (tests/portal/test_every_page_and_action.py), so
a form added later is fed them too. Nothing may answer 5xx, and every page still renders after."""

import re

import pytest
from django.test import Client

from .test_every_page_and_action import crawl, local, parse, user, world  # noqa: F401  (fixture)

pytestmark = [pytest.mark.django_db, pytest.mark.beside_soak]

BAD_VALUES = {
    "NUL": "a\x00b",
    "only NUL": "\x00",
    "huge": "x" * 100_000,
    "30 digits": "9" * 30,
    "superscript two": "²",
    "Arabic-Indic digits": "١٢٣",
    "minus one": "-1",
    "zero": "0",
    "year 1": "0001-01-01T00:00",
    "year 1 east of UTC": "0001-01-01T00:00:00+14:00",
    "year 1 west of UTC": "0001-01-01T00:00:00-12:00",
    "year 9999": "9999-12-31T23:59:59",
    "year 9999 west of UTC": "9999-12-31T23:59:59-12:00",
    "not a date": "2026-13-45T25:61",
    "replacement char": "\ufffd",
}
# Query parameters the pages read that no form carries (cursors, the dashboard poller's, a view),
# and the filters again on every list page; fed one kind of each bad value (the forms get them all).
EXTRA_PARAMS = ("after", "idle", "fp", "view", "tenant", "schedule", "state", "from", "to", "error", "q", "action",
                "actor", "object", "status")
EXTRA_VALUES = ("NUL", "huge", "30 digits", "superscript two", "year 1 east of UTC", "not a date")


def _shape(action: str) -> str:
    return re.sub(r"[0-9a-f-]{36}|/\d+/", "/ID/", action)


def forms_of(pages: dict) -> list[tuple[str, str, list]]:
    """One form of each kind (same method, action shape and field names) across the crawled pages."""
    seen, out = set(), []
    for path, (_, html) in pages.items():
        for form in parse(html).forms:
            action = local(form["action"], path) if form["action"] else path
            if action is None or action.startswith("/admin/"):
                continue
            fields = form["fields"] + form.get("buttons", [])[:1]
            key = (form["method"], _shape(action.split("?")[0]), tuple(sorted({n for n, _ in fields})))
            if key in seen:
                continue
            seen.add(key)
            out.append((form["method"], action, fields))
    return out


def send(client, method: str, action: str, fields: list, name: str, value: str):
    data = {}
    for n, v in fields:
        data.setdefault(n, []).append(value if n == name else v)
    if method == "get":
        return client.get(action.split("?")[0], data)
    resp = client.post(action, data)
    if resp.status_code == 200 and b'name="confirm"' in resp.content:
        resp = client.post(action, {**data, "confirm": ["yes"]})
    return resp


@pytest.mark.parametrize("persona", ["operator", "tenant user"])
def test_every_form_and_filter_fed_bad_values_answers_without_a_server_error(world, persona):
    acme = world[0]
    u = user("olga", staff=True, superuser=True) if persona == "operator" else user("alice", tenants=[acme])
    client = Client(raise_request_exception=False)  # every failure is collected, not only the first
    client.force_login(u)
    pages = crawl(client, budget=120)
    forms = forms_of(pages)
    assert len(forms) >= (8 if persona == "operator" else 5), forms
    failures = []
    for method, action, fields in forms:
        names = sorted({n for n, _ in fields if n not in ("csrfmiddlewaretoken",)})
        for name in names:
            for label, value in BAD_VALUES.items():
                resp = send(client, method, action, fields, name, value)
                if resp.status_code >= 500:
                    failures.append(f"{method.upper()} {action} {name}={label}: {resp.status_code}")
    lists = sorted({p.split("?")[0] for p in pages if p.count("/") <= 2})
    for path in lists:
        for label in EXTRA_VALUES:
            value = BAD_VALUES[label]
            for name in EXTRA_PARAMS:
                resp = client.get(path, {name: value})
                if resp.status_code >= 500:
                    failures.append(f"GET {path}?{name}={label}: {resp.status_code}")
            # The fragment an htmx request gets, with every parameter bad at once.
            resp = client.get(path, {name: value for name in EXTRA_PARAMS}, HTTP_HX_REQUEST="true")
            if resp.status_code >= 500:
                failures.append(f"GET {path} (htmx, every parameter {label}): {resp.status_code}")
    assert not failures, "\n".join(failures[:40])
    # Whatever was accepted along the way, every page still renders.
    crawl(client, budget=60)
