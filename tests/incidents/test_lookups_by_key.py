"""The incidents pass reads its batch's runs and schedules by key whatever PostgreSQL's
statistics say (scheduler_project.foundation.dbplanner.by_key): a whole-batch IN list is
otherwise planned as a read of the whole table while the planner judges that cheaper, a cost
that grows with the table (a day's run partition) rather than with the batch."""

from datetime import timedelta

import pytest
from django.db import connection, transaction

from dispatch import incidents
from dispatch.loops import drain, scan_step
from runs.models import OutboxEvent, Run
from scheduler_project.foundation.dbclock import db_now
from scheduler_project.foundation.dbplanner import by_key
from schedules.models import Schedule
from tests.helpers import make_due, make_schedule

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgresql_only("plans of PostgreSQL statements")]


def _setting(name: str) -> str:
    with connection.cursor() as cur:
        cur.execute("SELECT current_setting(%s)", [name])
        return cur.fetchone()[0]


@pytest.fixture
def runs(tenant, target):
    made = []
    for i in range(40):
        s = make_schedule(tenant, target.url + "/job", name=f"job-{i}")
        make_due(s, db_now() - timedelta(seconds=30) + timedelta(seconds=i))
        made.append(s)
    drain(scan_step)
    with connection.cursor() as cur:
        cur.execute("ANALYZE runs_run")
        cur.execute("ANALYZE schedules_schedule")
    return list(Run.objects.all())


def test_a_batch_of_keys_is_probed_inside_by_key_and_the_settings_come_back(runs):
    ids = [r.id for r in runs[:30]]
    sids = [r.schedule_id for r in runs[:30]]
    with transaction.atomic():
        # The premise: a small table's rows for most of its keys are read in one sequential pass.
        assert "Seq Scan" in Run.objects.filter(id__in=ids).explain()
        assert "Seq Scan" in Schedule.objects.filter(id__in=sids).order_by().explain()
        with by_key():
            for plan in (Run.objects.filter(id__in=ids).explain(),
                         Schedule.objects.filter(id__in=sids).order_by().explain()):
                assert "Seq Scan" not in plan and "Index" in plan, plan
        assert (_setting("enable_seqscan"), _setting("enable_bitmapscan")) == ("on", "on")


def test_the_pass_reads_its_runs_and_schedules_with_index_plans(runs, monkeypatch, settings):
    settings.SCHEDULER_INCIDENT_SETTLE_SECONDS = 0
    plans = []
    real = incidents.by_key

    def watching():
        cm = real()

        class Watch:
            def __enter__(self):
                cm.__enter__()
                plans.append((_setting("enable_seqscan"), _setting("enable_bitmapscan")))

            def __exit__(self, *exc):
                return cm.__exit__(*exc)
        return Watch()

    monkeypatch.setattr(incidents, "by_key", watching)
    OutboxEvent.objects.filter(kind="run.created").update(created_at=db_now() - timedelta(minutes=1))
    evaluator = incidents.IncidentEvaluator()
    evaluator.step(probe=False)
    OutboxEvent.objects.bulk_create([OutboxEvent(tenant_id=r.tenant_id, run_id=r.id, kind="run.leased",
                                                 payload={"generation": 1}, created_at=db_now() - timedelta(minutes=1))
                                     for r in runs])
    evaluator.step(probe=False)
    # Both lookups of the pass (its runs, then their schedules) ran with index scans only.
    assert plans == [("off", "off"), ("off", "off")]
    assert (_setting("enable_seqscan"), _setting("enable_bitmapscan")) == ("on", "on")
