"""Bad input is a 4xx with a JSON body a person can act on: never a 500, never a stack trace.
Sizes: the raw body is capped before it is read (413), and so is the schedule's payload."""

import json

import pytest

pytestmark = pytest.mark.django_db


def post_raw(api, path, raw: bytes, content_type="application/json", **extra):
    return api.generic("POST", path, raw, content_type=content_type, **extra)


def base(target, **overrides):
    body = {"expression": "*/5 * * * *", "timeZone": "UTC", "target": {"url": target.url + "/hook"}}
    body.update(overrides)
    return body


def test_a_payload_over_the_limit_is_a_413(api, target, settings):
    settings.SCHEDULER_MAX_PAYLOAD_BYTES = 1000
    resp = api.post("/api/v1/schedules", base(target, payload={"blob": "x" * 1200}), format="json")
    assert resp.status_code == 413
    assert "1000" in resp.json()["error"]


def test_a_payload_at_the_limit_is_accepted(api, target, settings):
    settings.SCHEDULER_MAX_PAYLOAD_BYTES = 1000
    payload = {"blob": "x" * (1000 - len('{"blob":""}'))}
    resp = api.post("/api/v1/schedules", base(target, payload=payload), format="json")
    assert resp.status_code == 201, resp.content


def test_a_payload_over_the_limit_is_a_413_on_edit_too(api, target, schedule, settings):
    settings.SCHEDULER_MAX_PAYLOAD_BYTES = 1000
    resp = api.patch(f"/api/v1/schedules/{schedule.id}", {"expectedVersion": 1, "payload": ["y" * 2000]},
                     format="json")
    assert resp.status_code == 413


def test_a_huge_raw_body_is_refused_by_its_content_length_before_it_is_read(api, settings):
    settings.SCHEDULER_MAX_PAYLOAD_BYTES = 1000
    from scheduler_project.web.bodylimit import max_request_bytes

    raw = b'{"expression": "' + b"a" * (max_request_bytes() + 10) + b'"}'
    for path in ("/api/v1/schedules", "/api/v1/expressions/preview"):
        resp = post_raw(api, path, raw)
        assert resp.status_code == 413, path
        assert "limit" in resp.json()["error"]


def test_a_body_whose_content_length_understates_it_is_still_capped(api, settings):
    """A lying or missing Content-Length must not let the parser read an unbounded body."""
    from io import BytesIO

    from scheduler_project.foundation.errors import PayloadTooLarge
    from scheduler_project.web.api.errors import LimitedJSONParser
    from scheduler_project.web.bodylimit import max_request_bytes

    settings.SCHEDULER_MAX_PAYLOAD_BYTES = 100
    stream = BytesIO(b"[" + b"1," * max_request_bytes() + b"1]")

    class Req:
        META = {"CONTENT_LENGTH": "10"}

    with pytest.raises(PayloadTooLarge):
        LimitedJSONParser().parse(stream, "application/json", {"request": Req(), "encoding": "utf-8"})


@pytest.mark.parametrize("raw, needle", [
    (b'{"expression": ', "not usable JSON"),
    (b"{'single': 'quotes'}", "not usable JSON"),
    (b'{"n": NaN}', "not usable JSON"),
    (b'{"n": 1e400}', "finite"),
    (b'{"n": 99999999999999999999999}', "64 bits"),
    (b'{"s": "a\\u0000b"}', "NUL"),
    (b'{"s": "\\ud800"}', "Unicode"),
    (b'\xff\xfe{}', "not usable JSON"),
    (b"[" * 5000 + b"]" * 5000, "nested"),
    (b'{"payload": ' + b'{"a": ' * 70 + b"1" + b"}" * 70 + b"}", "nested"),
])
def test_malformed_or_unstorable_json_is_a_400_that_says_why(api, raw, needle):
    resp = post_raw(api, "/api/v1/schedules", raw)
    assert resp.status_code == 400, resp.content
    assert needle in resp.json()["error"]


@pytest.mark.parametrize("raw", [b"[]", b"[1, 2]", b'"a string"', b"42", b"true"])
def test_json_that_is_not_an_object_is_a_400(api, raw):
    resp = post_raw(api, "/api/v1/schedules", raw)
    assert resp.status_code == 400
    assert "body" in resp.json()["errors"]


def test_unknown_fields_are_a_400_at_the_top_level(api, target):
    resp = api.post("/api/v1/schedules", base(target, misfirePolicyy="skip"), format="json")
    assert resp.status_code == 400
    assert resp.json()["errors"] == {"misfirePolicyy": ["unknown field"]}


def test_unknown_fields_are_a_400_when_nested_and_named_by_path(api, target):
    body = base(target, retryPolicy={"maxAttempt": 3}, dstPolicy={"skiped": "skip"})
    body["target"]["timeout"] = 5
    resp = api.post("/api/v1/schedules", body, format="json")
    assert resp.status_code == 400
    assert resp.json()["errors"] == {
        "target.timeout": ["unknown field"],
        "retryPolicy.maxAttempt": ["unknown field"],
        "dstPolicy.skiped": ["unknown field"],
    }


def test_unknown_fields_are_a_400_on_edit_preview_and_backfill(api, schedule):
    assert api.patch(f"/api/v1/schedules/{schedule.id}", {"expectedVersion": 1, "colour": "red"},
                     format="json").status_code == 400
    assert api.post("/api/v1/expressions/preview", {"expression": "* * * * *", "timeZone": "UTC", "n": 1},
                    format="json").status_code == 400
    assert api.post(f"/api/v1/schedules/{schedule.id}/backfill",
                    {"from": "2026-01-01T00:00:00Z", "to": "2026-01-02T00:00:00Z", "dryRun": True},
                    format="json").status_code == 400


def test_wrong_types_are_field_errors(api, target):
    body = base(target, catchupLimit="many", enabled="perhaps", retryPolicy=[1])
    body["target"] = "https://x"
    resp = api.post("/api/v1/schedules", body, format="json")
    assert resp.status_code == 400
    errors = resp.json()["errors"]
    assert set(errors) == {"catchupLimit", "enabled", "target", "retryPolicy"}
    assert all(isinstance(m, str) for msgs in errors.values() for m in msgs)


def test_header_names_and_values_that_would_break_the_call_are_refused(api, target):
    for headers in ({"Bad Header": "x"}, {"X-Ok": "a\r\nInjected: 1"}):
        body = base(target)
        body["target"]["headers"] = headers
        resp = api.post("/api/v1/schedules", body, format="json")
        # The one header rule (schedules.targets) answers on `target`, as the service does.
        assert resp.status_code == 400 and "target" in resp.json()["errors"]


def test_a_body_that_is_not_json_is_a_415(api):
    resp = post_raw(api, "/api/v1/schedules", b"expression=x", content_type="application/x-www-form-urlencoded")
    assert resp.status_code == 415 and "error" in resp.json()


def test_an_unsupported_method_is_a_405_in_json(api, schedule):
    resp = api.put(f"/api/v1/schedules/{schedule.id}", {}, format="json")
    assert resp.status_code == 405 and "error" in resp.json()


def test_unknown_paths_and_non_uuid_ids_are_json_404s(api):
    for path in ("/api/v1/nothing", "/api/v1/runs/123", "/api/v1/schedules/x/trigger"):
        resp = api.get(path)
        assert resp.status_code == 404 and resp.json() == {"error": "not found"}


@pytest.mark.parametrize("params, field", [
    ({"limit": "0"}, "limit"), ({"limit": "201"}, "limit"), ({"limit": "ten"}, "limit"),
    ({"cursor": "not-a-cursor"}, "cursor"), ({"state": "exploded"}, "state"), ({"schedule": "abc"}, "schedule"),
    ({"from": "yesterday"}, "from"), ({"to": "2026-01-01T00:00:00"}, "to"),
    ({"from": "2026-01-02T00:00:00Z", "to": "2026-01-01T00:00:00Z"}, "to"),
])
def test_bad_list_parameters_are_field_errors(api, params, field):
    resp = api.get("/api/v1/runs", params)
    assert resp.status_code == 400
    assert field in resp.json()["errors"]


@pytest.mark.parametrize("path", ["/api/v1/runs", "/api/v1/schedules", "/api/v1/keys", "/api/v1/audit"])
@pytest.mark.parametrize("param", ["cursor", "limit"])
def test_an_empty_query_parameter_is_a_400_not_no_filter(api, path, param):
    # `?cursor=` used to mean the first page and `?limit=` the default: a client that sent an
    # empty value by mistake got an answer to another question.
    resp = api.get(path, {param: ""})
    assert resp.status_code == 400
    assert resp.json()["errors"][param] == ["give a value or leave the parameter out"]


@pytest.mark.parametrize("path, params", [
    ("/api/v1/runs", {"stat": "dead"}), ("/api/v1/schedules", {"format": "json"}), ("/api/v1/keys", {"": "x"}),
    ("/api/v1/audit", {"objectid": "x"}),
])
def test_an_unknown_query_parameter_is_a_400_that_lists_the_known_ones(api, path, params):
    # `?stat=dead` (a typo of state) used to list every run, as if no filter had been asked for.
    resp = api.get(path, params)
    assert resp.status_code == 400
    (name, messages), = resp.json()["errors"].items()
    assert name == (next(iter(params)) or "(unnamed)") and messages[0].startswith("unknown query parameter")


@pytest.mark.parametrize("path, query", [
    ("/api/v1/retry-cost", "by=owner&by=target"), ("/api/v1/retry-cost", "by=owner&by=owner"),
    ("/api/v1/runs", "limit=5&limit=6"), ("/api/v1/schedules", "enabled=true&enabled=false"),
])
def test_a_query_parameter_given_twice_is_a_400_not_the_last_one_wins(api, path, query):
    # Django's QueryDict answers the last value: `?by=owner&by=target` ranked by target unheard.
    resp = api.get(f"{path}?{query}")
    assert resp.status_code == 400
    (name, messages), = resp.json()["errors"].items()
    assert name == query.split("=")[0] and messages == ["give this parameter once"]


def test_an_action_takes_no_query_parameter(api, schedule):
    resp = api.post(f"/api/v1/schedules/{schedule.id}/trigger?force=1")
    assert resp.status_code == 400 and "takes none" in resp.json()["errors"]["force"][0]


def test_creating_a_key_needs_a_json_object_even_an_empty_one(api):
    resp = api.post("/api/v1/keys")
    assert resp.status_code == 400 and "send a JSON object" in resp.json()["errors"]["body"][0]
    assert api.post("/api/v1/keys", {}, format="json").status_code == 201


@pytest.mark.parametrize("params, field", [({"action": "0"}, "action"), ({"action": "Schedule.Edit"}, "action"),
                                           ({"objectId": "0"}, "objectId"), ({"objectId": "run-1"}, "objectId")])
def test_audit_filters_must_look_like_what_they_filter(api, params, field):
    resp = api.get("/api/v1/audit", params)
    assert resp.status_code == 400 and field in resp.json()["errors"]


@pytest.mark.parametrize("value", ["1", "0", "yes", "True", "FALSE", ""])
def test_enabled_is_true_or_false_exactly(api, value):
    assert api.get("/api/v1/schedules", {"enabled": value}).status_code == 400
    assert api.get("/api/v1/schedules", {"enabled": "true"}).status_code == 200


def test_a_cursor_from_another_list_is_refused(api, target):
    for _ in range(2):
        api.post("/api/v1/schedules", base(target), format="json")
    cursor = api.get("/api/v1/schedules", {"limit": 1}).json()["next"]
    assert cursor
    resp = api.get("/api/v1/runs", {"cursor": cursor})
    assert resp.status_code == 400 and "cursor" in resp.json()["errors"]


def test_a_nul_in_a_query_parameter_is_a_400(api):
    assert api.get("/api/v1/audit", {"objectId": "a\x00b"}).status_code == 400


def test_an_idempotency_key_that_is_not_printable_ascii_is_a_400(api, target):
    resp = api.post("/api/v1/schedules", base(target), format="json", HTTP_IDEMPOTENCY_KEY="k\x01y")
    assert resp.status_code == 400 and "Idempotency-Key" in resp.json()["errors"]


def test_an_internal_error_is_json_without_a_trace(api, schedule, monkeypatch):
    from scheduler_project.web.api import schedules as schedules_api

    def boom(*args, **kwargs):
        raise RuntimeError("secret internals")

    monkeypatch.setattr(schedules_api, "schedule_json", boom)
    resp = api.get(f"/api/v1/schedules/{schedule.id}")
    assert resp.status_code == 500
    assert resp.json() == {"error": "internal error; it has been logged"}
    assert "secret" not in resp.content.decode()


def test_error_bodies_are_json_content(api):
    resp = post_raw(api, "/api/v1/schedules", b"{")
    assert resp["Content-Type"].startswith("application/json")
    json.loads(resp.content)


@pytest.mark.parametrize("field, value, where", [
    ("name", 5, "name"), ("expression", 0, "expression"), ("catchupLimit", "5", "catchupLimit"),
    ("catchupLimit", 5.0, "catchupLimit"), ("catchupLimit", True, "catchupLimit"), ("enabled", "yes", "enabled"),
    ("enabled", 1, "enabled"), ("target", {"url": "http://127.0.0.1:9/hook", "timeoutSeconds": "30"}, "target.timeoutSeconds"),
    ("retryPolicy", {"backoffBaseSeconds": "1.5"}, "retryPolicy.backoffBaseSeconds"),
])
def test_values_of_the_wrong_json_type_are_refused_not_converted(api, target, field, value, where):
    # DRF converts 5 to "5", "5" to 5 and "yes" to true; a client that sends the wrong type is told.
    body = base(target)
    body[field] = value
    resp = api.post("/api/v1/schedules", body, format="json")
    assert resp.status_code == 400, resp.content
    assert where in resp.json()["errors"]


def test_wrong_types_elsewhere_are_refused_too(api, schedule):
    assert api.post("/api/v1/keys", {"label": 0}, format="json").status_code == 400
    assert api.patch(f"/api/v1/schedules/{schedule.id}", {"expectedVersion": "1"}, format="json").status_code == 400
    assert api.post("/api/v1/expressions/preview", {"expression": "* * * * *", "timeZone": "UTC", "count": "3"},
                    format="json").status_code == 400
