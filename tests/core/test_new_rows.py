"""new_row(Model, **values) builds what Model(**values) builds, for the rows the create paths make
with it (schedule, version, audit entry), and those rows save and read back alike on both
engines."""

import uuid
from datetime import datetime, timezone

import pytest
from django.db import connection
from django.db.models.signals import post_init

from runs import actions
from scheduler_project.foundation.newrows import new_row
from schedules.models import AuditEntry, Owner, Schedule, ScheduleVersion
from tests.helpers import ACTOR

pytestmark = pytest.mark.django_db


def values_of(obj) -> dict:
    return {f.attname: getattr(obj, f.attname) for f in type(obj)._meta.concrete_fields}


def same(a, b, *, fresh=()) -> None:
    """Equal field by field; `fresh` fields (a new uuid, a timestamp) are only of the same type."""
    va, vb = values_of(a), values_of(b)
    assert va.keys() == vb.keys()
    for name in va:
        if name in fresh:
            assert type(va[name]) is type(vb[name]), name
        else:
            assert va[name] == vb[name], name
    # Unsaved; a related object given sets the database it came from, as the descriptor does.
    assert a._state.adding and b._state.adding and a._state.db == b._state.db


def test_a_version_with_only_some_fields_given_takes_every_default(tenant):
    sid = uuid.uuid4()
    given = dict(schedule_id=sid, version=1, created_by="me", changes={}, expression="0 * * * *", time_zone="UTC")
    same(new_row(ScheduleVersion, **given), ScheduleVersion(**given))


def test_a_schedule_given_its_tenant_object_caches_it_and_takes_its_id(tenant):
    sid = uuid.uuid4()
    given = dict(id=sid, tenant=tenant, name="n", enabled=True, owner_id=None)
    built = new_row(Schedule, **given)
    same(built, Schedule(**given), fresh=("created_at", "updated_at"))
    assert built.tenant_id == tenant.id
    assert built.tenant is tenant  # cached: no read
    assert built.owner is None


def test_an_owner_object_of_none_and_a_default_id(tenant):
    built = new_row(Schedule, tenant=tenant, name="n", owner=None)
    same(built, Schedule(tenant=tenant, name="n", owner=None), fresh=("id", "created_at", "updated_at"))
    assert isinstance(built.id, uuid.UUID) and built.owner_id is None


def test_callable_defaults_are_called_for_each_row(tenant):
    one, two = new_row(Schedule, tenant=tenant, name="a"), new_row(Schedule, tenant=tenant, name="b")
    assert one.id != two.id
    v1, v2 = new_row(ScheduleVersion, schedule_id=one.id), new_row(ScheduleVersion, schedule_id=two.id)
    for f in ScheduleVersion._meta.concrete_fields:
        if f.has_default() and callable(f.default):
            # A mutable default (a dict, a list) is each row's own, as the constructor makes it.
            assert getattr(v1, f.attname) == getattr(v2, f.attname)
            if isinstance(getattr(v1, f.attname), (dict, list)):
                assert getattr(v1, f.attname) is not getattr(v2, f.attname)


def test_an_audit_entry_as_the_services_make_it(tenant):
    given = dict(tenant_id=tenant.id, actor="key:abc", action="schedule.create", object_type="schedule",
                 object_id=str(uuid.uuid4()), remote_addr="", before=None, after={"a": 1})
    same(new_row(AuditEntry, **given), AuditEntry(**given), fresh=("id", "at"))


def test_an_unknown_name_is_a_type_error_as_from_the_constructor(tenant):
    with pytest.raises(TypeError, match="colour"):
        Schedule(tenant=tenant, name="n", colour="red")
    with pytest.raises(TypeError, match="colour"):
        new_row(Schedule, tenant=tenant, name="n", colour="red")


def test_a_model_with_init_receivers_goes_through_the_constructor(tenant):
    seen = []

    def receiver(sender, instance, **kw):
        seen.append(instance)

    post_init.connect(receiver, sender=Owner)
    try:
        built = new_row(Owner, tenant=tenant, slug="ops", name="Ops")
    finally:
        post_init.disconnect(receiver, sender=Owner)
    assert seen == [built]


def test_rows_made_by_the_create_paths_save_and_read_back(tenant, target):
    """The single create and the batch create (COPY on PostgreSQL) store what they built."""
    now = datetime.now(timezone.utc)
    body = {"name": "one", "expression": "*/5 * * * *", "time_zone": "Europe/Berlin",
            "target_url": target.url + "/x", "payload": {"k": [1, 2]}}
    one = actions.create_schedule(tenant, body, by=ACTOR, now=now)
    many = actions.create_schedules(tenant, [{**body, "name": f"b{i}"} for i in range(3)], by=ACTOR, now=now)
    for made in [one, *many]:
        stored = Schedule.objects.select_related("current").get(id=made.id)
        assert stored.tenant_id == tenant.id and stored.current.version == 1
        assert stored.current.payload == {"k": [1, 2]} and stored.current.time_zone == "Europe/Berlin"
        assert stored.next_run_at == made.next_run_at
        # The stamps the insert set on the instance are the ones stored (one per statement in a batch).
        assert (stored.created_at, stored.updated_at) == (made.created_at, made.updated_at)
        assert stored.current.created_at == made.current.created_at
        entry = AuditEntry.objects.get(object_id=str(made.id))
        assert entry.action == "schedule.create" and entry.after["name"] == made.name
        assert entry.before is None and stored.current.changes == {} and stored.current.target_headers == {}
    if connection.vendor == "postgresql":  # COPY stamps a statement's rows once; bulk_create row by row
        assert len({m.created_at for m in many}) == 1
