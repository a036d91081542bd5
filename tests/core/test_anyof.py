"""`field__anyof`: the rows `field__in` finds, on both engines; on PostgreSQL as one array
parameter (`= ANY(%s)`), not a placeholder per key."""

import uuid

import pytest
from django.db import connection

from scheduler_project.foundation import anyof  # noqa: F401  (registers __anyof)
from schedules.models import Schedule, Tenant
from tests.helpers import make_schedule

pytestmark = pytest.mark.django_db


def test_it_finds_what_in_finds_by_key_and_by_foreign_key(tenant, other_tenant, target):
    mine = [make_schedule(tenant, target.url + f"/{i}") for i in range(3)]
    theirs = make_schedule(other_tenant, target.url + "/x")
    ids = [s.id for s in mine] + [mine[0].id, uuid.uuid4(), None]  # a duplicate, a stranger, a None
    for lookup, values in (("id", ids), ("tenant_id", [tenant.id, None]), ("tenant", [tenant.id])):
        got = set(Schedule.objects.filter(**{f"{lookup}__anyof": values}).values_list("id", flat=True))
        assert got == set(Schedule.objects.filter(**{f"{lookup}__in": values}).values_list("id", flat=True))
        assert got == {s.id for s in mine}
    assert not Schedule.objects.filter(id__anyof=[]).exists()
    assert set(Tenant.objects.filter(id__anyof=[str(other_tenant.id)]).values_list("id", flat=True)) == {other_tenant.id}
    assert theirs.id not in set(Schedule.objects.filter(tenant_id__anyof=[tenant.id]).values_list("id", flat=True))


def test_on_postgresql_the_keys_go_as_one_array():
    sql, params = Schedule.objects.filter(id__anyof=[uuid.uuid4() for _ in range(500)]).query.sql_with_params()
    if connection.vendor == "postgresql":
        assert "= ANY(%s)" in sql and len(params) == 1 and len(params[0]) == 500
    else:
        assert " IN (" in sql and len(params) == 500
