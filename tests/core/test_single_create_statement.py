"""A single create's three rows go in one statement whose shared values are sent once: with each
sent for every row it had more parameters than psycopg keeps parsed statements for, and parsing
its text on every create cost more CPU than the rest of the insert (bench/api_create.py). The rows
must still hold exactly what the caller built, on both engines."""

import pytest
from django.db import connection

from runs.actions import _created_entry, _new_schedule, create_schedule
from runs.store import store
from scheduler_project.foundation.dbclock import db_now
from schedules.models import AuditEntry, Schedule, ScheduleVersion
from schedules.services import SYSTEM, VERSIONED_DEFAULTS, validate_fields

pytestmark = pytest.mark.django_db(transaction=True)


def fields(target, name):
    return {**VERSIONED_DEFAULTS, "name": name, "expression": "0 3 * * *", "time_zone": "Europe/Paris",
            "target_url": target.url + "/x"}


def test_a_create_stores_what_was_built_in_a_statement_psycopg_keeps_parsed(tenant, target):
    sent = []

    def capture(execute, sql, params, many, context):
        sent.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        schedule = create_schedule(tenant, fields(target, "one"), by=SYSTEM, now=db_now())

    stored = Schedule.objects.get(id=schedule.id)
    assert (stored.tenant_id, stored.version, stored.current_id, stored.name) == (tenant.id, 1, schedule.current.id, "one")
    version = ScheduleVersion.objects.get(id=schedule.current.id)
    assert (version.schedule_id, version.version, version.time_zone) == (schedule.id, 1, "Europe/Paris")
    entry = AuditEntry.objects.get(object_type="schedule", object_id=str(schedule.id))
    assert (entry.tenant_id, entry.action, entry.actor) == (tenant.id, "schedule.create", SYSTEM.name)
    if connection.vendor == "postgresql":
        from psycopg._queries import MAX_CACHED_STATEMENT_PARAMS

        [(sql, params)] = [(q, p) for q, p in sent if "new_version" in q]
        assert len(params) <= MAX_CACHED_STATEMENT_PARAMS, len(params)


def test_rows_whose_values_differ_are_stored_as_built(tenant, target):
    """The values are only taken from another row where the caller's are the same; an audit entry
    of another tenant (the store does not decide what an entry says) keeps its own."""
    from schedules.models import Tenant

    other = Tenant.objects.create(slug="other-tenant", name="other tenant")
    now = db_now()
    given = fields(target, "two")
    rule = validate_fields(tenant, given, now=now, quotas=False)
    schedule, version = _new_schedule(tenant, given, rule, by=SYSTEM, enabled=True, now=now)
    entry = _created_entry(schedule, given, tenant=tenant, by=SYSTEM)
    entry.tenant_id = other.id
    entry.object_id = "elsewhere"
    store().schedule_insert(schedule, version, entry)
    stored = AuditEntry.objects.get(object_id="elsewhere")
    assert (stored.tenant_id, stored.object_id) == (other.id, "elsewhere")
    assert Schedule.objects.get(id=schedule.id).current_id == version.id
