"""The forecast's kept counts gain delta rows with every scanner advance. Readers fold them; the
maintain loop folds them too, so a fleet whose forecast nobody reads does not pile them up, and the
forecast stays exact either way."""

from datetime import timedelta

import pytest

from dispatch import forecast as fc
from dispatch import forecast_store
from dispatch.maintenance import Maintenance
from dispatch.models import ForecastDelta
from runs import actions
from scheduler_project.foundation.dbclock import db_now
from tests.helpers import ACTOR
from tests.timesched.support import scan_until_idle

pytestmark = pytest.mark.django_db


def test_a_maintain_step_folds_the_deltas_no_reader_folded(tenant, target, monkeypatch):
    actions.create_schedules(tenant, [{"expression": f"rate({m} minutes)", "time_zone": "UTC",
                                       "target_url": target.url + "/r"} for m in (1, 2, 3, 5, 7)],
                             by=ACTOR, now=db_now())
    scan_until_idle(horizon=timedelta(hours=2), batch=100)
    assert ForecastDelta.objects.count() >= 5
    monkeypatch.setattr(forecast_store, "FOLD_AT", 5)
    Maintenance().step()
    assert not ForecastDelta.objects.exists()
    now = db_now()
    full = fc.forecast(now=now, incremental=False)
    kept = fc.forecast(now=now, incremental=True)
    assert [b.due for b in kept.tiers["day"]] == [b.due for b in full.tiers["day"]]
    assert sum(b.due for b in full.tiers["day"]) > 0


def test_below_the_threshold_the_deltas_wait_for_more(tenant, target):
    actions.create_schedules(tenant, [{"expression": "rate(1 minute)", "time_zone": "UTC",
                                       "target_url": target.url + "/r"}], by=ACTOR, now=db_now())
    before = ForecastDelta.objects.count()
    assert 0 < before < forecast_store.FOLD_AT
    Maintenance().step()
    assert ForecastDelta.objects.count() == before
