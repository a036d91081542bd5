"""The forecast (issue 28): runs becoming eligible per bucket ahead, from the schedules and the runs
made ahead, exact within its budget and sampled beyond; the 2,000 schedules of one minute before a
spread, and their flattened shape after it; portal page, API and /metrics."""

from datetime import timedelta

import pytest
from django.urls import reverse

from dispatch import forecast as fc
from runs import actions
from scheduler_project.foundation.dbclock import db_now
from schedules.models import Schedule
from tests.helpers import ACTOR, make_schedule
from tests.timesched.support import scan_until_idle

pytestmark = [pytest.mark.django_db, pytest.mark.beside_soak]

MANY = 2_000


def _minute_ahead(minutes=30):
    return (db_now() + timedelta(minutes=minutes)).replace(second=0, microsecond=0)


def _daily(tenant, url, minute, count, **fields):
    made = []
    for start in range(0, count, 1000):
        items = [{"expression": f"{minute.minute} {minute.hour} * * *", "time_zone": "UTC", "target_url": url, **fields}
                 for _ in range(min(1000, count - start))]
        made += actions.create_schedules(tenant, items, by=ACTOR, now=db_now())
    return made


def _hour_bucket(f, minute):
    return next(b for b in f.tiers["hour"] if b.start == minute)


def test_the_forecast_shows_the_minutes_surge_and_the_flattened_shape_after_a_spread(tenant, target):
    minute = _minute_ahead()
    made = _daily(tenant, target.url + "/d", minute, MANY)
    f = fc.forecast(tenant_ids=[tenant.id])
    assert f.exact and f.method == "exact"
    assert _hour_bucket(f, minute).due == MANY
    assert f.peak().start == minute and f.peak().due == MANY
    day = sum(b.due for b in f.tiers["day"])
    week = sum(b.due for b in f.tiers["week"])
    assert day == MANY and week == 7 * MANY  # once a day for a week
    for s in made:
        actions.edit_schedule(s, expected_version=1, changes={"spread_seconds": 600}, by=ACTOR)
    f = fc.forecast(tenant_ids=[tenant.id])
    counts = [_hour_bucket(f, minute + timedelta(minutes=i)).due for i in range(10)]
    assert sum(counts) == MANY and max(counts) <= 2 * MANY / 10, counts
    # And it is what the scanner then makes: each minute's forecast count is the runs eligible in it.
    scan_until_idle(horizon=timedelta(hours=1), batch=1000)
    from runs.models import Run
    eligible = list(Run.objects.filter(tenant=tenant).values_list("next_eligible_at", flat=True))
    assert len(eligible) == MANY
    made_counts = [sum(1 for e in eligible if minute + timedelta(minutes=i) <= e < minute + timedelta(minutes=i + 1))
                   for i in range(10)]
    assert made_counts == counts
    # Made ahead, they are counted from the runs now, not twice.
    after = fc.forecast(tenant_ids=[tenant.id])
    assert [_hour_bucket(after, minute + timedelta(minutes=i)).due for i in range(10)] == counts


def test_beyond_its_budget_the_forecast_samples_and_says_so(tenant, target, monkeypatch):
    minute = _minute_ahead()
    _daily(tenant, target.url + "/d", minute, 1000)
    monkeypatch.setattr(fc, "EXACT_SCHEDULES", 300)
    monkeypatch.setattr(fc, "SAMPLE_SCHEDULES", 300)
    # From the kept summary every schedule is counted whatever the size; read from the schedules
    # themselves (incremental=False, as a bulk spread's preview reads them), beyond the budget a sample.
    kept = fc.forecast(tenant_ids=[tenant.id])
    assert kept.exact and kept.incremental and _hour_bucket(kept, minute).due == 1000
    f = fc.forecast(tenant_ids=[tenant.id], incremental=False)
    assert not f.exact and f.method.startswith("sampled") and f.fraction == pytest.approx(0.3)
    assert f.stated_error.startswith("sampled") and fc.as_json(f)["method"] == "sampled"
    # A uniform sample by id (about 300 of the 1,000): the estimate carries its error, and the truth
    # is within it (four standard errors here, so the test fails about once in 16,000 runs).
    bucket = _hour_bucket(f, minute)
    assert 150 < f.schedules_counted < 450 and bucket.error > 0
    assert abs(bucket.due - 1000) < bucket.error * 4 / 1.96, (bucket.due, bucket.error)
    assert fc.as_json(f)["tiers"]["hour"][[b.start for b in f.tiers["hour"]].index(minute)]["error"] > 0


def test_one_target_host_and_other_tenants(tenant, other_tenant, target):
    minute = _minute_ahead()
    make_schedule(tenant, target.url + "/d", expression=f"{minute.minute} {minute.hour} * * *")
    make_schedule(other_tenant, target.url + "/d", expression=f"{minute.minute} {minute.hour} * * *")
    host = f"127.0.0.1:{target.port}"
    assert _hour_bucket(fc.forecast(tenant_ids=[tenant.id]), minute).due == 1
    assert _hour_bucket(fc.forecast(), minute).due == 2
    assert _hour_bucket(fc.forecast(host=host), minute).due == 2
    assert _hour_bucket(fc.forecast(host="elsewhere:443"), minute).due == 0


def _busiest_minute(succeeded: int, *, late: int, on_time: int, hours_ago: int = 1):
    """A past minute of every tenant: `succeeded` attempts ended in it, and of the first attempts
    that began in it `late` started 10-20 s after they were due, `on_time` within 50 ms."""
    from dispatch.models import ALL_TENANTS, LAG_BOUNDS, ActivityMinute

    lags = [0] * (len(LAG_BOUNDS) + 1)
    lags[0] = on_time
    lags[LAG_BOUNDS.index(20)] = late
    ActivityMinute.objects.create(tenant_id=ALL_TENANTS, minute=db_now().replace(second=0, microsecond=0)
                                  - timedelta(hours=hours_ago), succeeded=succeeded, lag_counts=lags)


def test_a_peak_beyond_the_capacity_the_fleet_showed_while_behind_warns(tenant, target):
    _busiest_minute(600, late=300, on_time=300)  # 10 runs/s at its best, half of them late
    minute = _minute_ahead()
    _daily(tenant, target.url + "/d", minute, 2000)  # 200 s to start at 10/s, past a 60 s grace
    f = fc.forecast()
    assert f.capacity.peak_runs_per_second == 10 and f.capacity.measured
    assert any(w.startswith(minute.strftime("%H:%M") + ": 2,000 due; at the observed 10.0 runs/s") for w in f.warnings), f.warnings
    assert f.notes == []
    assert fc.as_json(f)["capacity"]["measured"] is True


@pytest.mark.parametrize("late,on_time", [(0, 600), (5, 595)])
def test_a_fleet_never_behind_has_shown_a_lower_bound_and_gets_a_note_not_warnings(tenant, target, late, on_time):
    """A new install or a quiet day: the busiest minute says what the fleet did, not what it could
    do. Warning from it would flag every minute busier than the past (a fresh quickstart with a
    fleet due every five minutes showed twelve), and the warnings gauge an alert may watch with
    them; a few late runs (fewer than a tenth) are not the fleet being behind."""
    _busiest_minute(600, late=late, on_time=on_time)
    _busiest_minute(60, late=0, on_time=60, hours_ago=2)
    minute = _minute_ahead()
    _daily(tenant, target.url + "/d", minute, 2000)
    f = fc.forecast()
    assert f.capacity.peak_runs_per_second == 10 and not f.capacity.measured
    assert f.warnings == []
    [note] = f.notes
    assert note.startswith("capacity not measured yet") and "10.0 runs/s" in note, note
    assert f"{minute.strftime('%H:%M')}, has 2,000 due (3x that minute's rate)" in note, note
    answer = fc.as_json(f)
    assert answer["capacity"]["measured"] is False and answer["notes"] == [note] and answer["warnings"] == []


def test_a_fleet_that_never_dispatched_gets_a_note_not_a_warning(tenant, target):
    minute = _minute_ahead()
    _daily(tenant, target.url + "/d", minute, 3)
    f = fc.forecast()
    assert f.capacity.peak_runs_per_second == 0 and not f.capacity.measured
    assert (f.warnings, f.notes) == ([], ["capacity unknown: no dispatch observed in the last 24 hours"])


def test_a_fleet_never_behind_with_nothing_beyond_its_busiest_minute_says_nothing(tenant, target):
    _busiest_minute(600, late=0, on_time=600)
    minute = _minute_ahead()
    _daily(tenant, target.url + "/d", minute, 500)  # 50 s at 10/s: within the grace
    f = fc.forecast()
    assert (f.warnings, f.notes) == ([], [])


def test_a_host_filter_is_read_as_the_target_key_it_names(tenant, target):
    minute = _minute_ahead()
    make_schedule(tenant, target.url + "/d", expression=f"{minute.minute} {minute.hour} * * *")
    # A port written with a leading zero still names the same target.
    assert _hour_bucket(fc.forecast(tenant_ids=[tenant.id], host=f"127.0.0.1:0{target.port}"), minute).due == 1


@pytest.mark.parametrize("typed,key", [
    ("Example.COM:443", "example.com:443"), ("[::1]:9000", "::1:9000"), ("::1:9000", "::1:9000"),
    ("[2001:DB8::1]:80", "2001:db8::1:80"), ("example.com.:8080", "example.com:8080"),
])
def test_the_ways_to_type_a_host_give_its_key(typed, key):
    from schedules.targets import host_key

    assert host_key(typed) == key and fc.host_problem(typed) is None


@pytest.mark.parametrize("garbage", ["[::1", "::1]:80", "[example.com]:80", "example.com", "example.com:",
                                     "example.com:0", "example.com:65536", "example.com:99999", ":443",
                                     "example.com:44a", "[]:80", "a:b:c", "x" * 301 + ":1", "ex ample.com:1"])
def test_a_host_filter_that_can_match_nothing_is_refused(garbage):
    assert fc.host_problem(garbage) is not None
