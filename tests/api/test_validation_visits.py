"""The input serializers take shortcuts through DRF's validation: they skip the fields a body leaves
out that could only be skipped (StrictSerializer._writable_fields), run no serializer validators
when none are declared, and pass ASCII text within its bounds without running CharField's
validators one by one (StrictCharField.run_validators). The answer, the validated value or every
error with its code, must be the one DRF gives without them. Checked on generated bodies, for
creates and for partial edits, with text that fails each of those validators."""

from datetime import datetime, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework import serializers

from scheduler_project.web.api import schedule_serializers as S

SERIALIZERS = [S.ScheduleIn, S.SchedulePatchIn]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8), st.text(min_size=190, max_size=260, alphabet="ab\x00é\ud800"),
    st.sampled_from(["a\x00b", "\ud83d", "é" * 201, "x" * 201, "x" * 200, "x" * 64, "x" * 65, "", " ", "x", "UTC", "Europe/Berlin", "0 * * * *", "rate(5 minutes)", "http://127.0.0.1:9/x",
                     "2030-01-01T00:00:00Z", "2030-01-01T00:00:00", "skip", "allow", "run_once", "GET", "POST"]),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=4), inner, max_size=3)),
                      max_leaves=6)


def group(cls) -> st.SearchStrategy:
    names = list(cls().fields)
    return st.dictionaries(st.sampled_from(names + ["unknownField"]), scalars, max_size=len(names))


bodies = st.fixed_dictionaries({}, optional={
    **{name: values for name in S.ScheduleIn().fields},
    "target": st.one_of(group(S.TargetIn), values),
    "retryPolicy": st.one_of(group(S.RetryPolicyIn), values),
    "dstPolicy": st.one_of(group(S.DstPolicyIn), values),
    "expectedVersion": st.one_of(st.integers(-1, 3), scalars),
})


def answer(cls, body):
    try:
        return "valid", cls().run_validation(body)
    except serializers.ValidationError as exc:
        return "invalid", _codes(exc.detail)


def _codes(detail):
    if isinstance(detail, dict):
        return {k: _codes(v) for k, v in detail.items()}
    if isinstance(detail, list):
        return [_codes(v) for v in detail]
    return (str(detail), getattr(detail, "code", None))


def every_field_visited(monkeypatch):
    """DRF's own validation: every field visited, every validator run."""
    monkeypatch.setattr(S.StrictSerializer, "_writable_fields", serializers.Serializer._writable_fields)
    monkeypatch.setattr(S.StrictSerializer, "run_validators", serializers.Serializer.run_validators)
    monkeypatch.setattr(S.StrictCharField, "run_validators", serializers.CharField.run_validators)


@pytest.mark.parametrize("cls", SERIALIZERS)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies)
def test_generated_bodies_get_drfs_own_answer(cls, body, monkeypatch):
    ours = answer(cls, body)
    with monkeypatch.context() as m:
        every_field_visited(m)
        theirs = answer(cls, body)
    assert ours == theirs


@pytest.mark.parametrize("cls, body, outcome", [
    (S.ScheduleIn, {"expression": "0 * * * *", "timeZone": "UTC", "target": {"url": "http://h/x"}}, "valid"),
    (S.ScheduleIn, {"expression": "0 * * * *", "timeZone": "UTC"}, "invalid"),  # target is required
    (S.ScheduleIn, {}, "invalid"),
    (S.SchedulePatchIn, {"expectedVersion": 2, "name": "n"}, "valid"),
    (S.SchedulePatchIn, {"name": "n"}, "invalid"),
    (S.ScheduleIn, {"expression": "0 * * * *", "timeZone": "UTC", "target": {"url": "http://h/x"},
                    "startAt": "2030-01-01T00:00:00Z", "retryPolicy": {"maxAttempts": 3}}, "valid"),
])
def test_required_fields_left_out_are_still_errors_and_given_ones_still_read(cls, body, outcome, monkeypatch):
    ours = answer(cls, body)
    assert ours[0] == outcome
    with monkeypatch.context() as m:
        every_field_visited(m)
        assert answer(cls, body) == ours
    if outcome == "valid" and "startAt" in body:
        assert ours[1]["startAt"] == datetime(2030, 1, 1, tzinfo=timezone.utc)
        assert ours[1]["retryPolicy"] == {"maxAttempts": 3}


@pytest.mark.parametrize("name, code", [
    ("x" * 201, "max_length"), ("a\x00b", "null_characters_not_allowed"), ("a\ud800b", "surrogate_characters_not_allowed"),
])
def test_text_that_fails_a_char_validator_gets_its_message(name, code):
    kind, errors = answer(S.ScheduleIn, {"name": name, "expression": "0 * * * *", "timeZone": "UTC",
                                         "target": {"url": "http://h/x"}})
    assert kind == "invalid" and [c for _, c in errors["name"]] == [code]


def test_a_required_field_left_out_is_named_as_drf_names_it():
    kind, errors = answer(S.ScheduleIn, {"name": "n"})
    assert kind == "invalid"
    assert set(errors) == {"expression", "timeZone", "target"}
    assert errors["target"] == [("This field is required.", "required")]
