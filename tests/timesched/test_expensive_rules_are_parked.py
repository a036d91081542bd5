"""A rule the time engine cannot evaluate within its work budget at scan time is parked with a
visible reason and looked at again later, and it does not hold another tenant's runs."""

from datetime import timedelta

import pytest

from runs import decisions
from runs.models import Run
from runs.queue import SCAN_PARK, materialise_due
from scheduler_project.foundation.dbclock import db_now
from schedules import timeexpr
from schedules.models import Schedule
from schedules.tenants import create_tenant
from tests.helpers import make_due, make_schedule

pytestmark = pytest.mark.django_db


@pytest.fixture
def costly(tenant, target, monkeypatch):
    """A due schedule whose rule the engine refuses as over its budget wherever it is evaluated."""
    from runs import actions

    schedule = make_schedule(tenant, target.url + "/costly")
    make_due(schedule)
    real = decisions.rule_for

    def rule_for(version, anchor):
        if version.schedule_id == schedule.id:
            raise timeexpr.TooExpensive("too expensive to evaluate: the next occurrence needed more than its budget")
        return real(version, anchor)

    monkeypatch.setattr(decisions, "rule_for", rule_for)
    monkeypatch.setattr(actions, "rule_for", rule_for)
    return schedule


def test_an_over_budget_rule_is_parked_with_its_reason_and_others_still_run(tenant, target, costly):
    other = create_tenant("globex", allow_targets=[target.url + "/"])
    fine = make_schedule(other, target.url + "/fine")
    make_due(fine)
    before = db_now()
    result = materialise_due(batch=10)
    assert Run.objects.filter(schedule=fine).count() == 1
    assert not Run.objects.filter(schedule=costly).exists()
    costly = Schedule.objects.get(id=costly.id)
    assert costly.last_error.startswith("parked until") and "too expensive to evaluate" in costly.last_error
    assert costly.next_run_at >= before + SCAN_PARK - timedelta(seconds=5)
    assert [sid for sid, _ in result.errors] == [costly.id]
    # Parked: the next passes leave it alone instead of paying its budget again and again.
    assert materialise_due(batch=10).locked == 0


def test_a_parked_schedule_can_still_be_paused_and_says_why_it_cannot_resume(costly):
    from runs.actions import pause_schedule, resume_schedule
    from scheduler_project.foundation.errors import ValidationFailed
    from tests.helpers import ACTOR

    materialise_due(batch=10)
    paused = pause_schedule(costly, by=ACTOR)
    assert paused.enabled is False
    with pytest.raises(ValidationFailed) as e:
        resume_schedule(costly, by=ACTOR)
    assert "cannot resume" in str(e.value.errors)
    assert Schedule.objects.get(id=costly.id).enabled is False
