"""The compiled representation (scheduler_project/web/api/representation.py) gives exactly what
DRF's own walk of the serializer gives, for schedules in every state and with every optional part,
and refuses the serializers it cannot render the same way."""

from datetime import timedelta

import pytest
from rest_framework import serializers

from runs.actions import archive_schedule, edit_schedule, pause_schedule
from scheduler_project.foundation.dbclock import db_now
from scheduler_project.web.api.representation import compiled
from scheduler_project.web.api.schedule_serializers import ScheduleOut, schedule_json
from schedules.models import Schedule
from tests.helpers import ACTOR, make_schedule


@pytest.fixture
def schedules(tenant, target):
    url = target.url + "/hook"
    now = db_now()
    plain = make_schedule(tenant, url)
    full = make_schedule(
        tenant, url, expression="0 9 * * MON-FRI", tz="America/New_York", name="weekday-report",
        payload={"nested": {"list": [1, 2.5, None, True], "text": "é\u2028"}}, target_headers={"X-Team": "ops", "X-Empty": ""},
        target_method="PUT", start_at=now + timedelta(days=1), end_at=now + timedelta(days=30),
        misfire_policy="catch_up", catchup_limit=7, overlap_policy="allow",
    )
    paused = pause_schedule(make_schedule(tenant, url, name="paused"), by=ACTOR)
    archived = archive_schedule(make_schedule(tenant, url, name="archived"), by=ACTOR)
    edited = make_schedule(tenant, url, name="edited")
    edited = edit_schedule(edited, expected_version=1, changes={"expression": "rate(5 minutes)"}, by=ACTOR)
    once = make_schedule(tenant, url, expression="at(2030-01-01T00:00:00)", name="once")
    Schedule.objects.filter(id=once.id).update(last_error="the target's host does not resolve")
    return [Schedule.objects.select_related("current").get(id=s.id) for s in (plain, full, paused, archived, edited, once)]


def test_the_compiled_output_is_drfs_for_every_schedule(schedules):
    drf = ScheduleOut()
    for s in schedules:
        expected = drf.to_representation(s)
        got = schedule_json(s)
        assert got == expected and list(got) == list(expected), s.name
    # Every kind of value was met: nulls, times, nested objects, a changed version, an error.
    by_name = {s.name: schedule_json(s) for s in schedules}
    assert by_name["weekday-report"]["target"]["headers"] == {"X-Team": "ops", "X-Empty": ""}
    assert by_name["paused"]["pausedAt"] and by_name["archived"]["archivedAt"] and by_name["edited"]["version"] == 2
    assert by_name["once"]["lastError"] and by_name[""]["startAt"] is None


class _Inner(serializers.Serializer):
    x = serializers.IntegerField()


@pytest.mark.parametrize("field", [
    _Inner(many=True, source="items"),
    serializers.SerializerMethodField(),
    serializers.CharField(source="*"),
], ids=["list", "method", "whole-object"])
def test_what_it_cannot_render_the_same_way_is_refused(field):
    cls = type("Out", (serializers.Serializer,), {"f": field, "get_f": lambda self, obj: 1})
    with pytest.raises(TypeError):
        compiled(cls())


def test_a_serializer_with_its_own_to_representation_is_refused():
    class Own(serializers.Serializer):
        x = serializers.IntegerField()

        def to_representation(self, obj):
            return {"x": 1}

    with pytest.raises(TypeError):
        compiled(Own())
