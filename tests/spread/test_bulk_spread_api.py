"""Shaping a surge over the API: select a tenant's schedules (target host, expression), preview the
forecast before and with a spread window (counts, from the schedules), apply it as one audited bulk
change through the one edit entry point, in parts when the selection is larger than one change."""

from datetime import timedelta

import pytest

from dispatch import forecast as fc
from runs import actions
from scheduler_project.foundation.dbclock import db_now
from schedules.models import AuditEntry, Schedule, TargetPrefix
from schedules.spread import spread_offset
from tests.helpers import ACTOR

pytestmark = pytest.mark.django_db

PREVIEW = "/api/v1/forecast/spread/preview"
APPLY = "/api/v1/forecast/spread"


def _minute_ahead(minutes=30):
    return (db_now() + timedelta(minutes=minutes)).replace(second=0, microsecond=0)


def _make(tenant, url, expression, count):
    items = [{"expression": expression, "time_zone": "UTC", "target_url": url} for _ in range(count)]
    made = actions.create_schedules(tenant, items, by=ACTOR, now=db_now())
    assert all(isinstance(s, Schedule) for s in made), made[:1]
    return made


def _hour(body, minute):
    stamp = minute.strftime("%Y-%m-%dT%H:%M:%SZ")
    return next(b["due"] for b in body["tiers"]["hour"] if b["start"] == stamp)


def test_preview_counts_the_flattened_shape_and_apply_makes_it(tenant, other_tenant, target, api):
    TargetPrefix.objects.create(tenant=tenant, prefix=f"http://127.0.0.2:{target.port}/")
    minute = _minute_ahead()
    daily = f"{minute.minute} {minute.hour} * * *"
    a = _make(tenant, target.url + "/a", daily, 120)
    _make(tenant, f"http://127.0.0.2:{target.port}/b", daily, 30)  # another target host: not selected
    _make(other_tenant, target.url + "/a", daily, 40)  # another tenant: never selected, never counted
    host = f"127.0.0.1:{target.port}"

    r = api.post(PREVIEW, {"spreadSeconds": 600, "targetHost": host}, format="json")
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["selected"] == 120 and body["more"] is False and body["spreadSeconds"] == 600
    assert _hour(body["before"], minute) == 150 and body["before"]["method"] == "exact"
    # The selection's offsets, minute by minute, as spread_offset gives them; the other host stays.
    expected = [30 if i == 0 else 0 for i in range(10)]
    for s in a:
        expected[spread_offset(s.id, 600) // 60] += 1
    assert [_hour(body["after"], minute + timedelta(minutes=i)) for i in range(10)] == expected
    assert max(expected) < 150 and sum(expected) == 150
    assert set(Schedule.objects.filter(tenant=tenant).values_list("version", flat=True)) == {1}  # changed nothing

    r = api.post(APPLY, {"spreadSeconds": 600, "targetHost": host}, format="json")
    assert r.status_code == 200, r.content
    out = r.json()
    assert sorted(out["changed"]) == sorted(str(s.id) for s in a)
    assert out["refused"] == {} and out["unchanged"] == 0 and out["more"] is False
    for s in Schedule.objects.filter(tenant=tenant).select_related("current"):
        assert (s.version, s.current.spread_seconds) == ((2, 600) if s.current.target_url.endswith("/a") else (1, 0))
    entries = AuditEntry.objects.filter(tenant_id=tenant.id, action="schedule.bulk_spread")
    assert entries.count() == 1 and entries.get().after["changed"] == 120
    # The forecast now is the preview's "after".
    now = api.get("/api/v1/forecast").json()
    assert [_hour(now, minute + timedelta(minutes=i)) for i in range(10)] == expected
    # Applied again: nothing left to change.
    out = api.post(APPLY, {"spreadSeconds": 600, "targetHost": host}, format="json").json()
    assert out["changed"] == [] and out["more"] is False


def test_a_selection_larger_than_one_change_is_applied_in_parts(tenant, target, api, monkeypatch):
    monkeypatch.setattr(actions, "MAX_BULK_SPREAD", 40)
    minute = _minute_ahead()
    made = _make(tenant, target.url, f"{minute.minute} {minute.hour} * * *", 100)
    body = api.post(PREVIEW, {"spreadSeconds": 300}, format="json").json()
    assert body["more"] is True and body["selected"] == 41
    changed = []
    for more in (True, True, False):
        out = api.post(APPLY, {"spreadSeconds": 300}, format="json").json()
        assert out["more"] is more and len(out["changed"]) == (40 if more else 20)
        changed += out["changed"]
    assert sorted(changed) == sorted(str(s.id) for s in made)
    assert AuditEntry.objects.filter(tenant_id=tenant.id, action="schedule.bulk_spread").count() == 3


def test_a_window_that_does_not_fit_a_rule_leaves_it_and_says_why(tenant, target, api):
    _make(tenant, target.url, "*/5 * * * *", 3)
    minute = _minute_ahead()
    daily = _make(tenant, target.url, f"{minute.minute} {minute.hour} * * *", 2)
    out = api.post(APPLY, {"spreadSeconds": 600}, format="json").json()
    assert sorted(out["changed"]) == sorted(str(s.id) for s in daily)
    assert len(out["refused"]) == 3 and all("shortest interval" in why for why in out["refused"].values())
    # The expression selects as written.
    out = api.post(PREVIEW, {"spreadSeconds": 60, "expression": "*/5 * * * *"}, format="json").json()
    assert out["selected"] == 3


@pytest.mark.parametrize("body", [
    {"spreadSeconds": "600"}, {"spreadSeconds": -1}, {"spreadSeconds": 86_401}, {},
    {"spreadSeconds": 600, "targetHost": "not a host"}, {"spreadSeconds": 600, "expression": "a\x00b"},
    {"spreadSeconds": 600, "tenant": "x"},
])
def test_bad_input_is_refused_and_changes_nothing(tenant, target, api, body):
    _make(tenant, target.url, "0 0 * * *", 2)
    for path in (PREVIEW, APPLY):
        r = api.post(path, body, format="json")
        assert r.status_code == 400, (path, body, r.content)
    assert set(Schedule.objects.filter(tenant=tenant).values_list("version", flat=True)) == {1}
    assert not AuditEntry.objects.filter(action="schedule.bulk_spread").exists()


def test_the_preview_of_a_sampled_forecast_says_so(tenant, target, api, monkeypatch):
    monkeypatch.setattr(fc, "EXACT_SCHEDULES", 10)
    monkeypatch.setattr(fc, "SAMPLE_SCHEDULES", 10)
    _make(tenant, target.url, "0 0 * * *", 30)
    body = api.post(PREVIEW, {"spreadSeconds": 600}, format="json").json()
    assert body["after"]["method"] == "sampled" and body["after"]["statedError"].startswith("sampled")
