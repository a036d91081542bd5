"""The audit log page: every change with who, when, from where; filters; tenant scope."""

from django.urls import reverse

from runs.models import RunState

from .conftest import make_run

HX = {"HTTP_HX_REQUEST": "true"}


def test_portal_actions_appear_with_who_and_from_where(operator, schedule):
    run = make_run(schedule, RunState.DEAD)
    operator.post(reverse("runs-retry", args=[run.id]), REMOTE_ADDR="10.1.2.3")
    html = operator.get(reverse("schedules-audit"), {"action": "run.retry"}).content.decode()
    assert "user:olga" in html and "from 10.1.2.3" in html
    assert reverse("runs-detail", args=[run.id]) in html
    assert "schedule.create" not in html


def test_the_filter_returns_a_fragment(operator, schedule):
    frag = operator.get(reverse("schedules-audit"), {"object": str(schedule.id)}, **HX).content.decode()
    assert frag.lstrip().startswith('<section id="results"')
    assert "schedule.create" in frag


def test_a_tenant_user_sees_only_their_tenants_entries(acme, schedule, other_schedule):
    html = acme.get(reverse("schedules-audit")).content.decode()
    assert str(schedule.id)[:10] in html
    assert str(other_schedule.id)[:10] not in html
    assert "globex" not in html
