"""Every portal page renders for an operator, with data in every run state."""

import pytest
from django.urls import reverse

from runs.models import RunState

from .conftest import make_run


@pytest.fixture
def runs(schedule):
    return {s: make_run(schedule, s) for s in RunState.values}


@pytest.mark.parametrize("name", ["runs-dashboard", "runs-list", "runs-dlq", "schedules-list", "schedules-audit",
                                  "schedules-tenants"])
def test_every_list_page_renders_for_an_operator(operator, runs, name):
    r = operator.get(reverse(name))
    assert r.status_code == 200
    assert b"<main" in r.content and b"<h1>" in r.content
