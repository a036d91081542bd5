"""POST /api/v1/expressions/preview: the next instants of an expression, nothing stored."""

import pytest

from runs.models import Run
from schedules.models import Schedule

pytestmark = pytest.mark.django_db


def preview(api, **body):
    return api.post("/api/v1/expressions/preview", body, format="json")


def test_it_lists_the_next_instants_in_utc_with_local_times(api):
    resp = preview(api, expression="30 2 * * *", timeZone="America/New_York", **{"from": "2026-01-10T00:00:00Z"},
                   count=3)
    assert resp.status_code == 200
    occs = resp.json()["occurrences"]
    assert [o["at"] for o in occs] == ["2026-01-10T07:30:00Z", "2026-01-11T07:30:00Z", "2026-01-12T07:30:00Z"]
    assert occs[0]["local"] == "2026-01-10T02:30:00-05:00" and occs[0]["note"] is None
    assert Schedule.objects.count() == 0 and Run.objects.count() == 0


def test_a_wall_time_dst_skips_is_shifted_with_a_note(api):
    occs = preview(api, expression="30 2 * * *", timeZone="America/New_York",
                   **{"from": "2026-03-08T05:00:00Z"}, count=1).json()["occurrences"]
    assert occs[0]["at"] == "2026-03-08T07:00:00Z" and occs[0]["local"] == "2026-03-08T03:00:00-04:00"
    assert occs[0]["note"] and "02:30" in occs[0]["note"]


def test_the_dst_policy_is_applied(api):
    occs = preview(api, expression="30 2 * * *", timeZone="America/New_York", count=1,
                   dstPolicy={"skipped": "skip"}, **{"from": "2026-03-08T05:00:00Z"}).json()["occurrences"]
    assert occs[0]["dropped"] is True


def test_from_is_inclusive_and_anchors_rate(api):
    occs = preview(api, expression="rate(15 minutes)", timeZone="UTC", count=2,
                   **{"from": "2026-05-01T10:07:00Z"}).json()["occurrences"]
    assert [o["at"] for o in occs] == ["2026-05-01T10:07:00Z", "2026-05-01T10:22:00Z"]


def test_without_from_it_starts_after_now_with_ten_by_default(api):
    occs = preview(api, expression="* * * * *", timeZone="UTC").json()["occurrences"]
    assert len(occs) == 10 and occs[0]["at"] < occs[1]["at"]


@pytest.mark.parametrize("body, field", [
    ({"expression": "61 * * * *", "timeZone": "UTC"}, "expression"),
    ({"expression": "* * * * *", "timeZone": "Mars/Olympus"}, "timeZone"),
    ({"expression": "* * * * *", "timeZone": "UTC", "count": 101}, "count"),
    ({"expression": "* * * * *", "timeZone": "UTC", "dstPolicy": {"skipped": "never"}}, "dstPolicy.skipped"),
    ({"expression": "* * * * *", "timeZone": "UTC", "from": "2026-01-01T00:00:00"}, "from"),
    ({"timeZone": "UTC"}, "expression"),
])
def test_mistakes_are_field_errors(api, body, field):
    resp = api.post("/api/v1/expressions/preview", body, format="json")
    assert resp.status_code == 400
    assert field in resp.json()["errors"], resp.json()
