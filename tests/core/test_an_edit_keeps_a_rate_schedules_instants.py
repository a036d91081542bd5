"""An edit that does not touch a schedule's timing keeps its instants: a rate() schedule is
anchored at the create's database time, and a payload edit must not re-anchor it at created_at
(the web process's clock at the save, a few milliseconds off). bench/soak.py found the drift: an
API-made every-minute schedule, edited while it ran, had no run at any of its rule's instants
afterwards (its runs came a few milliseconds later)."""

from datetime import timedelta

import pytest

from runs import actions
from schedules.models import Schedule
from schedules.services import rule_for
from schedules.tenants import create_tenant
from tests.helpers import ACTOR, make_schedule

pytestmark = pytest.mark.django_db

URL = "https://jobs.example.com/"


def test_a_payload_edit_keeps_the_anchor_and_the_instants_of_a_rate_schedule():
    tenant = create_tenant("anchor-kept", allow_targets=[URL])
    s = make_schedule(tenant, URL + "tick", expression="rate(1 minute)")
    s.refresh_from_db()
    anchor, next_at = s.anchor_at, s.next_run_at
    before = [o.at for o in rule_for(s.current, s.anchor_at).between(next_at, next_at.replace(year=next_at.year + 1), 5)]

    edited = actions.edit_schedule(s, expected_version=1, changes={"payload": {"edited": True}}, by=ACTOR)
    edited = Schedule.objects.select_related("current").get(id=edited.id)

    assert edited.version == 2
    assert edited.anchor_at == anchor
    after = [o.at for o in rule_for(edited.current, edited.anchor_at).between(next_at, next_at.replace(year=next_at.year + 1), 5)]
    assert after == before
    assert edited.next_run_at in before


def test_an_edit_that_gives_a_start_still_anchors_the_rule_there():
    tenant = create_tenant("anchor-start", allow_targets=[URL])
    s = make_schedule(tenant, URL + "tick", expression="rate(1 minute)")
    s.refresh_from_db()
    start = s.anchor_at.replace(microsecond=0) + timedelta(hours=1, seconds=7)
    edited = actions.edit_schedule(s, expected_version=1, changes={"start_at": start}, by=ACTOR)
    edited.refresh_from_db()
    assert edited.anchor_at == start
