"""check_json_value names where a bad value is (`body.schedules[3].payload.k`) only when it finds
one: the message must be the one the path spelled out at every step gives, for every kind of bad
value, at any depth, under long keys that are cut at 200 characters."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rest_framework import exceptions
from rest_framework.views import APIView  # noqa: F401  (DRF's settings first: they import the parser from errors)

from scheduler_project.web.api.errors import MAX_JSON_DEPTH, MAX_JSON_INT, check_json_value


def spelled_at_every_step(value, path="body") -> str | None:
    """The reference: every path spelled out as it is walked; the first problem's message."""
    stack = [(value, 1, path)]
    while stack:
        v, d, where = stack.pop()
        if d > MAX_JSON_DEPTH:
            return f"{where} is nested more than {MAX_JSON_DEPTH} levels deep"
        if isinstance(v, dict):
            for k, item in v.items():
                if (problem := string_problem(k, f"{where} key")) is not None:
                    return problem
                stack.append((item, d + 1, f"{where}.{k}"[:200]))
        elif isinstance(v, list):
            for i, item in enumerate(v):
                stack.append((item, d + 1, f"{where}[{i}]"[:200]))
        elif isinstance(v, str):
            if (problem := string_problem(v, where)) is not None:
                return problem
        elif isinstance(v, bool) or v is None:
            pass
        elif isinstance(v, int) and abs(v) > MAX_JSON_INT:
            return f"{where}: integers must fit in 64 bits"
        elif isinstance(v, float) and not math.isfinite(v):
            return f"{where}: numbers must be finite"
    return None


def string_problem(s, where):
    if "\x00" in s:
        return f"{where}: strings may not contain NUL (\\u0000)"
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return f"{where}: strings must be valid Unicode (a lone surrogate escape was sent)"
    return None


def message(value):
    try:
        check_json_value(value)
    except exceptions.ParseError as exc:
        return str(exc.detail)
    return None


texts = st.one_of(st.text(max_size=6), st.sampled_from(["a\x00", "\ud800", "é", "k" * 150, "é\udfff"]))
leaves = st.one_of(st.none(), st.booleans(), texts, st.integers(-(2**64), 2**64),
                   st.floats(allow_nan=True, allow_infinity=True))
values = st.recursive(leaves, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                      st.dictionaries(texts, inner, max_size=4)), max_leaves=25)


@settings(max_examples=500, deadline=None)
@given(value=values)
def test_the_message_names_the_place_as_the_path_spelled_at_every_step_would(value):
    assert message(value) == spelled_at_every_step(value)


def nested(depth, key):
    value = "fine"
    for _ in range(depth):
        value = {key: [value]}
    return value


@pytest.mark.parametrize("value", [
    nested(40, "x" * 30), nested(MAX_JSON_DEPTH, "k"), {"k" * 300: {"j": "\x00"}},
    {"a": [1, 2, {"b": float("inf")}]}, {"a\x00": 1}, [[[2**70]]], {"s": ["ok", "\ud83d"]},
])
def test_deep_and_long_paths_are_named_alike(value):
    ours = message(value)
    assert ours == spelled_at_every_step(value)
    assert ours is not None or value == nested(40, "x" * 30)
