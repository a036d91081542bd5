"""The incremental forecast (issue 28): the forecast read from the kept summary of schedule groups
(dispatch.forecast_store) gives exactly the figures of the full forecast, which groups every
schedule again, through random schedules, scanner passes, edits, spreads, pauses, resumes, archives
and deletes, with the deltas folded in or not; and two readers folding at once leave it exact."""

import random
import threading
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction

from dispatch import forecast as fc
from dispatch import forecast_store
from dispatch.models import ForecastDelta, ForecastGroup
from runs import actions, queue
from scheduler_project.foundation.dbclock import db_now
from schedules.models import Schedule
from tests.conftest import ON_SQLITE
from tests.helpers import ACTOR

RULES = ["0 0 * * *", "*/15 * * * *", "30 9 * * 1-5", "rate(1 hour)", "rate(7 minutes)", "0 */6 * * *",
         "RRULE:FREQ=DAILY;BYHOUR=12;BYMINUTE=0;BYSECOND=0", "5 2 * * *"]
ZONES = ["UTC", "America/New_York", "Europe/Berlin", "Australia/Lord_Howe"]


def _figures(f):
    return {name: [(b.start, b.due, b.var, b.min_grace, sorted(b.hosts.items())) for b in f.tiers[name]]
            for name, _, _ in fc.TIERS}


def _same(**kwargs):
    now = db_now()
    full = fc.forecast(now=now, incremental=False, **kwargs)
    incremental = fc.forecast(now=now, incremental=True, **kwargs)
    assert full.exact and incremental.exact and incremental.incremental and not full.incremental
    assert _figures(incremental) == _figures(full)
    assert incremental.schedules_counted == full.schedules_counted
    return full


def _make(tenant, url, rng, count):
    items = []
    for _ in range(count):
        item = {"expression": rng.choice(RULES), "time_zone": rng.choice(ZONES),
                "target_url": f"{url}/{rng.choice('abc')}"}
        if rng.random() < 0.3:
            item["spread_seconds"] = rng.choice([60, 300, 600])
        if rng.random() < 0.1:
            item["end_at"] = db_now() + timedelta(days=rng.randint(1, 5))
        if rng.random() < 0.1:
            item["misfire_grace_seconds"] = rng.choice([5, 600])
        items.append(item)
    # A spread the rule does not fit is refused (a ServiceError in its place): the others are made.
    return [s for s in actions.create_schedules(tenant, items, by=ACTOR, now=db_now()) if isinstance(s, Schedule)]


@pytest.mark.django_db
def test_incremental_equals_full_through_every_kind_of_change(tenant, target, other_tenant, monkeypatch):
    rng = random.Random(28)
    mine = _make(tenant, target.url, rng, 60)
    theirs = _make(other_tenant, target.url, rng, 30)
    assert len(mine) > 40 and len(theirs) > 20
    _same()
    _same(tenant_ids=[tenant.id])
    assert forecast_store.differences() == []

    # The scanner makes runs ahead and advances next_run_at (no stamp of its own on the schedule).
    queue.materialise_due(batch=500, horizon=timedelta(minutes=30))
    _same()
    for s in rng.sample(mine, 10):  # edits: the rule, the spread, the target
        s.refresh_from_db()
        changes = rng.choice([{"expression": rng.choice(RULES[:3])}, {"spread_seconds": 120},
                              {"target_url": f"{target.url}/z"}, {"misfire_grace_seconds": 30}])
        try:
            actions.edit_schedule(s, expected_version=s.version, changes=changes, by=ACTOR)
        except Exception:
            continue
    _same()
    paused = rng.sample(mine, 8)
    for s in paused:
        actions.pause_schedule(s, by=ACTOR)
    for s in rng.sample(theirs, 5):
        actions.archive_schedule(s, by=ACTOR)
    _same()
    _same(tenant_ids=[other_tenant.id])
    _same(host=f"{target.url.split('//')[1].split('/')[0]}")
    for s in paused[:4]:
        actions.resume_schedule(s, by=ACTOR)
    queue.materialise_due(batch=500, horizon=timedelta(hours=2))

    # Folded or not, the same.
    assert ForecastDelta.objects.exists()
    _same()
    assert forecast_store.fold()
    assert not ForecastDelta.objects.exists() and ForecastGroup.objects.exists()
    _same()
    monkeypatch.setattr(forecast_store, "FOLD_AT", 1)
    _make(tenant, target.url, rng, 10)
    _same()  # folded on read
    assert forecast_store.differences() == []
    # Deleted with their versions (as a tenant's schedules go), versions first or schedules first.
    for first in ("schedules_scheduleversion", "schedules_schedule"):
        gone = [str(s.id) if not ON_SQLITE else s.id.hex for s in _make(other_tenant, target.url, rng, 3)]
        marks = ", ".join(["%s"] * len(gone))
        with transaction.atomic(), connection.cursor() as cur:
            for table, column in sorted([("schedules_scheduleversion", "schedule_id"), ("schedules_schedule", "id")],
                                        key=lambda t: t[0] != first):
                cur.execute(f"DELETE FROM {table} WHERE {column} IN ({marks})", gone)
        _same()
    assert forecast_store.differences() == []
    # A summary rebuilt from the schedules is the same summary.
    before = sorted(forecast_store.grouped(until=db_now() + timedelta(days=8)), key=repr)
    forecast_store.rebuild()
    assert sorted(forecast_store.grouped(until=db_now() + timedelta(days=8)), key=repr) == before


@pytest.mark.postgresql_only("two connections folding and reading at once while schedules change")
@pytest.mark.django_db(transaction=True)
def test_two_readers_at_once_stay_exact(tenant, target, other_tenant, monkeypatch):
    rng = random.Random(7)
    made = _make(tenant, target.url, rng, 40)
    monkeypatch.setattr(forecast_store, "FOLD_AT", 1)
    errors, results = [], []

    def reader():
        try:
            for _ in range(15):
                results.append(fc.forecast(incremental=True).schedules_counted)
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for s in made[:20]:  # meanwhile: scanner passes, pauses, edits
        queue.materialise_due(batch=100, horizon=timedelta(hours=1))
        actions.pause_schedule(s, by=ACTOR) if rng.random() < 0.5 else None
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(results) == 30
    assert forecast_store.differences() == []
    _same()
    # A reader that finds another folding does not wait: it reads without folding.
    with connection.cursor() as cur:
        cur.execute("BEGIN; SELECT pg_advisory_xact_lock(%s)", [forecast_store.FOLD_LOCK])
        try:
            other = connections.create_connection("default")
            try:
                with other.cursor() as c2:
                    c2.execute("SELECT pg_try_advisory_xact_lock(%s)", [forecast_store.FOLD_LOCK])
                    assert c2.fetchone()[0] is False
            finally:
                other.close()
        finally:
            cur.execute("ROLLBACK")


@pytest.mark.postgresql_only("SQLite's fold rewrites the summary, one writer at a time")
@pytest.mark.django_db
def test_a_fold_writes_only_the_keys_its_deltas_touch(tenant, target, other_tenant):
    rng = random.Random(31)
    made = _make(tenant, target.url, rng, 30) + _make(other_tenant, target.url, rng, 10)
    forecast_store.rebuild()
    before = dict(ForecastGroup.objects.values_list("id", "n"))
    # Some schedules move (paused, or advanced by a scanner pass): their keys gain deltas.
    for s in made[:3]:
        actions.pause_schedule(s, by=ACTOR)
    queue.materialise_due(batch=500, horizon=timedelta(hours=2))
    touched = ForecastDelta.objects.count()
    assert touched > 0
    # A key whose deltas cancel out (a schedule that left it and came back) is not written at all.
    with connection.cursor() as cur:
        cur.execute("SELECT g.id FROM dispatch_forecastgroup g WHERE NOT EXISTS (SELECT 1 FROM dispatch_forecastdelta d "
                    f"WHERE {forecast_store._matched('g', 'd')}) ORDER BY g.id LIMIT 1")
        still = ForecastGroup.objects.get(id=cur.fetchone()[0])
        cols = forecast_store.COLS
        cur.execute(f"INSERT INTO dispatch_forecastdelta ({cols}, n) SELECT {cols}, 1 FROM dispatch_forecastgroup "
                    f"WHERE id = %s UNION ALL SELECT {cols}, -1 FROM dispatch_forecastgroup WHERE id = %s",
                    [still.id, still.id])
    assert forecast_store.fold()
    assert not ForecastDelta.objects.exists()
    after = dict(ForecastGroup.objects.values_list("id", "n"))
    assert after.get(still.id) == still.n
    kept = {k for k in before if k in after and after[k] == before[k]}
    # Rows of keys no delta touched are the same rows (same ids, same counts); only touched keys
    # were taken out and put back, so the summary kept most of its rows as they were.
    assert len(kept) >= len(before) - touched
    assert len(kept) > 0
    assert forecast_store.differences() == []
    _same()
    _same(tenant_ids=[other_tenant.id])
    # And the next fold with nothing new does nothing.
    assert forecast_store.fold()
    assert dict(ForecastGroup.objects.values_list("id", "n")) == after
