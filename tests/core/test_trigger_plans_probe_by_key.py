"""The statement triggers that keep the schedule counts and the forecast summary read versions and
schedules by key in every session, whatever the first call planned for.

PL/pgSQL keeps a statement's plan for the session, planned for the transition table of its first
call. Joined the plain way, a session whose first insert was a batch kept a hash join over the
whole versions table and ran it for every single create after it: bench/api_create.py saw a single
create's PostgreSQL cost grow from ~1 ms to 30-70 ms as the table grew to 170,000 schedules. Here
every trigger statement's plan, as auto_explain reports it in the session that runs it, must probe
by key: a batch first, then a single create, a pause and a version's change."""

import pytest
from django.db import connection

from runs import actions
from scheduler_project.foundation.dbclock import db_now
from schedules.models import Schedule, ScheduleVersion
from tests.helpers import ACTOR

pytestmark = [pytest.mark.django_db, pytest.mark.postgresql_only("PL/pgSQL statement triggers and their plans")]

TRIGGER_STATEMENTS = ("INSERT INTO dispatch_forecastdelta", "INSERT INTO schedules_tenantschedulecount",
                      "UPDATE schedules_tenantschedulecount")


@pytest.fixture
def trigger_plans():
    """The plans auto_explain reports for the trigger statements this session runs."""
    plans = []

    def keep(diag):
        text = diag.message_primary or ""
        if "Query Text:" in text and any(s in text for s in TRIGGER_STATEMENTS):
            plans.append(text)

    connection.ensure_connection()
    with connection.cursor() as cur:
        cur.execute("LOAD 'auto_explain'")
        for name, value in (("log_min_duration", "0"), ("log_nested_statements", "on"), ("log_level", "notice")):
            cur.execute(f"SET auto_explain.{name} = {value}")
    connection.connection.add_notice_handler(keep)
    yield plans
    connection.connection.remove_notice_handler(keep)
    with connection.cursor() as cur:
        cur.execute("SET auto_explain.log_min_duration = -1")


def test_every_trigger_statement_probes_by_key_after_a_batch(tenant, target, trigger_plans):
    url = target.url + "/job"
    now = db_now()
    made = actions.create_schedules(tenant, [{"expression": "rate(1 day)", "time_zone": "UTC", "target_url": url,
                                              "name": f"fleet-{i}"} for i in range(400)], by=ACTOR, now=now)
    assert all(isinstance(s, Schedule) for s in made)
    one = actions.create_schedule(tenant, {"expression": "rate(5 minutes)", "time_zone": "UTC", "target_url": url,
                                           "name": "single"}, by=ACTOR, now=db_now())
    one = actions.pause_schedule(one, by=ACTOR)
    ScheduleVersion.objects.filter(id=made[0].current_id).update(misfire_grace_seconds=120)

    assert len(trigger_plans) >= 6, trigger_plans  # the batch, the single, the pause, the version
    for plan in trigger_plans:
        assert "Seq Scan on schedules_scheduleversion" not in plan, plan
        assert "Seq Scan on schedules_schedule " not in plan and not plan.rstrip().endswith(
            "Seq Scan on schedules_schedule"), plan
    assert any("Index Scan using schedules_scheduleversion_pkey" in p for p in trigger_plans)
    assert any("schedules_schedule_current_id" in p for p in trigger_plans)  # the version's change
