"""A schedule's target headers are held to the one header rule (schedules.targets.header_problem),
the same one the worker's HTTP client applies to every call: headers that would break or hijack
the call, or override what the scheduler sets, are a 400 on `target` and store nothing; names that
merely start like a reserved one are ordinary headers."""

import json

import pytest

from schedules.models import Schedule
from schedules.targets import header_problem, target_header_problems
from tests.api.conftest import schedule_body

pytestmark = pytest.mark.django_db

CONNECTION_HEADERS = ["Transfer-Encoding", "Connection", "Keep-Alive", "TE", "Trailer", "Upgrade", "Content-Length",
                      "Host", "Expect", "Proxy-Authorization", "proxy-connection", "HTTP2-Settings"]
SCHEDULER_HEADERS = ["Content-Type", "idempotency-key", "Traceparent", "X-Scheduler-Run-Id", "x-scheduler-signature",
                     "X-Scheduler-Anything"]


def create(api, target, headers):
    body = schedule_body(target)
    body["target"]["headers"] = headers
    # Sent as raw JSON so that the values reach the API exactly as written.
    return api.post("/api/v1/schedules", json.dumps(body).encode(), content_type="application/json")


def assert_refused_on_target(resp, fragment):
    assert resp.status_code == 400, resp.content
    messages = resp.json()["errors"]["target"]
    assert any(fragment in m for m in messages), messages
    assert not Schedule.objects.exists()


@pytest.mark.parametrize("name", CONNECTION_HEADERS)
def test_connection_and_framing_headers_are_refused(api, target, name):
    # Transfer-Encoding and Connection used to be accepted, and then every run of the schedule died.
    assert_refused_on_target(create(api, target, {name: "x"}), f"header {name!r} belongs to the connection")


@pytest.mark.parametrize("name", SCHEDULER_HEADERS)
def test_headers_the_scheduler_sets_cannot_be_overridden(api, target, name):
    assert_refused_on_target(create(api, target, {name: "x"}), "set by the scheduler")


@pytest.mark.parametrize("name", ["Hostname", "Hosts", "Connection-Id", "Upgrade-Insecure-Requests", "Trailers",
                                  "X-Content-Type-Options", "Content-Typed", "Idempotency-Keys", "X-Scheduler",
                                  "X-Schedulers-Note", "Proxy", "TEA", "Authorization", "User-Agent"])
def test_names_that_only_start_like_a_reserved_one_are_ordinary_headers(api, target, name):
    # Reserved names were matched by prefix, so `Hostname` was refused as if it were `Host`.
    resp = create(api, target, {name: "v"})
    assert resp.status_code == 201, resp.content
    assert resp.json()["target"]["headers"] == {name: "v"}


@pytest.mark.parametrize("value, code", [
    ("a\x01b", "U+0001"), ("\x1b[31mred", "U+001B"), ("a\x7fb", "U+007F"), ("a\x85b", "U+0085"),
    ("a\u2028b", "U+2028"), ("a\u2029b", "U+2029"), ("a\x0bb", "U+000B"), ("a\x0cb", "U+000C"),
])
def test_control_characters_in_values_are_refused(api, target, value, code):
    # They used to be stored, and then sent raw.
    assert_refused_on_target(create(api, target, {"X-Note": value}), code)


@pytest.mark.parametrize("value", ["a\r\nX-Injected: 1", "a\nb", "a\rb", "a\x00b"])
def test_line_breaks_and_nul_in_values_are_a_400(api, target, value):
    # Refused before the service sees them (by the serializer or the JSON parser), with a message.
    resp = create(api, target, {"X-Note": value})
    assert resp.status_code == 400, resp.content
    assert resp.json().get("errors") or resp.json().get("error")
    assert not Schedule.objects.exists()


@pytest.mark.parametrize("value", ["a\tb", "café", "日本語", "emoji 🙂", "", "Bearer abc.def-ghi_jkl=="])
def test_tabs_and_non_ascii_text_in_values_are_accepted(api, target, value):
    resp = create(api, target, {"X-Note": value})
    assert resp.status_code == 201, resp.content
    assert resp.json()["target"]["headers"] == {"X-Note": value}


@pytest.mark.parametrize("value", [5, 0, -1, 1.5, True, False, None, [], {}, ["a"], {"a": "b"}])
def test_values_that_are_not_strings_are_a_400_on_target(api, target, value):
    # Numbers used to be stored as their text ("5"): a value is sent exactly as given, or refused.
    assert_refused_on_target(create(api, target, {"X-Note": value}), "the value of header 'X-Note' is not a string")


def test_a_name_given_twice_in_different_cases_is_refused(api, target):
    assert_refused_on_target(create(api, target, {"X-Tenant": "a", "x-tenant": "b"}), "more than once")


def test_every_problem_is_reported_at_once(api, target):
    resp = create(api, target, {"Connection": "close", "Content-Type": "text/plain", "X-Ok": "fine", "X-Bad": "a\x01"})
    assert resp.status_code == 400
    messages = resp.json()["errors"]["target"]
    assert len(messages) == 3, messages


def test_an_edit_is_held_to_the_same_rule(api, schedule):
    resp = api.patch(f"/api/v1/schedules/{schedule.id}",
                     {"expectedVersion": 1, "target": {"headers": {"Transfer-Encoding": "chunked"}}}, format="json")
    assert resp.status_code == 400
    assert any("belongs to the connection" in m for m in resp.json()["errors"]["target"])
    schedule.refresh_from_db()
    assert schedule.version == 1 and schedule.current.target_headers == {}

    resp = api.patch(f"/api/v1/schedules/{schedule.id}",
                     {"expectedVersion": 1, "target": {"headers": {"Hostname": "db-1"}}}, format="json")
    assert resp.status_code == 200, resp.content
    assert resp.json()["target"]["headers"] == {"Hostname": "db-1"}


# ------------------------------------------------------------------ the rule itself, without the API


def test_the_rule_allows_the_schedulers_own_names_only_to_the_scheduler():
    for name in ("Content-Type", "Idempotency-Key", "X-Scheduler-Generation"):
        assert header_problem(name, "v") is not None
        assert header_problem(name, "v", by_scheduler=True) is None
    for name in CONNECTION_HEADERS:
        assert header_problem(name, "v", by_scheduler=True) is not None


def test_the_rule_bounds_names_values_and_count():
    assert header_problem("X-" + "n" * 98, "v") is None
    assert "1 to 100 characters" in header_problem("X-" + "n" * 99, "v")
    assert header_problem("X-V", "v" * 2000) is None
    assert "over 2000 characters" in header_problem("X-V", "v" * 2001)
    assert target_header_problems({f"X-{i}": "v" for i in range(50)}) == []
    assert target_header_problems({f"X-{i}": "v" for i in range(51)}) == ["at most 50 headers"]


@pytest.mark.parametrize("name", ["", "X Bad", "X:Bad", "X-Ünï", "X\r\nY", "(x)", "X/Y", 'X"Y'])
def test_the_rule_wants_a_token_for_a_name(name):
    assert "not an HTTP token" in header_problem(name, "v")


@pytest.mark.parametrize("headers", [["X-A"], "X-A: b", 5])
def test_the_rule_wants_an_object_of_headers(headers):
    assert target_header_problems(headers) == ["headers must be an object of header names to string values"]


def test_the_rule_refuses_values_that_are_not_strings_or_cannot_be_encoded():
    assert "not a string" in header_problem("X-V", 5)
    assert "not a string" in header_problem(5, "v")
    assert "U+D800" in header_problem("X-V", "a\ud800")
