"""The per-tenant schedule counts the quotas read (schedules.models.TenantScheduleCount, kept by
the triggers of migration schedules 0007) equal the schedules themselves after every change a
schedule goes through, on both engines: creates one by one and in batches, refused creates,
edits that make a rule sub-minute and back, pausing, archiving, deleting; under concurrent creates
from several connections (PostgreSQL); and when the migration counts a database that already has
schedules."""

import threading

import pytest
from django.db import connection, connections, transaction
from django.db.migrations.executor import MigrationExecutor

from runs import actions
from scheduler_project.foundation.errors import ValidationFailed
from schedules.models import Schedule, ScheduleStatus, TenantScheduleCount
from schedules.services import _counted
from tests.helpers import ACTOR, make_schedule

pytestmark = pytest.mark.django_db(transaction=True)

FAST = "RRULE:FREQ=SECONDLY"  # sub-minute
SLOW = "rate(1 hour)"


def counted_from_schedules(tenant) -> tuple[int, int]:
    live = Schedule.objects.filter(tenant=tenant).exclude(status=ScheduleStatus.ARCHIVED)
    return live.count(), live.filter(current__sub_minute=True).count()


def test_the_counts_follow_every_change_of_a_schedule(tenant, other_tenant, target, settings):
    url = target.url + "/hook"
    assert _counted(tenant) == (0, 0)
    fast = make_schedule(tenant, url, expression=FAST)
    slow = make_schedule(tenant, url, expression=SLOW)
    make_schedule(other_tenant, url, expression=FAST)
    assert _counted(tenant) == counted_from_schedules(tenant) == (2, 1)
    assert _counted(other_tenant) == (1, 1)

    # A batch: the valid items counted, the refused one not.
    items = [{"expression": e, "time_zone": "UTC", "target_url": url} for e in (FAST, SLOW, SLOW, "not a rule")]
    results = actions.create_schedules(tenant, items, by=ACTOR, now=fast.created_at)
    assert [isinstance(r, ValidationFailed) for r in results] == [False, False, False, True]
    assert _counted(tenant) == counted_from_schedules(tenant) == (5, 2)

    # A create the quota refuses changes nothing.
    settings.SCHEDULER_MAX_SCHEDULES_PER_TENANT = 5
    with pytest.raises(ValidationFailed):
        make_schedule(tenant, url, expression=SLOW)
    settings.SCHEDULER_MAX_SCHEDULES_PER_TENANT = 0
    assert _counted(tenant) == (5, 2)

    # Edits: slow to sub-minute, sub-minute to slow, a rename (same rule kind).
    slow = actions.edit_schedule(slow, expected_version=1, changes={"expression": FAST}, by=ACTOR)
    assert _counted(tenant) == counted_from_schedules(tenant) == (5, 3)
    fast = actions.edit_schedule(fast, expected_version=1, changes={"expression": SLOW}, by=ACTOR)
    fast = actions.edit_schedule(fast, expected_version=2, changes={"name": "renamed"}, by=ACTOR)
    assert _counted(tenant) == counted_from_schedules(tenant) == (5, 2)

    # Pausing and resuming count as they were; archiving frees a place, and archiving again is nothing.
    actions.pause_schedule(slow, by=ACTOR)
    actions.resume_schedule(slow, by=ACTOR)
    assert _counted(tenant) == (5, 2)
    actions.archive_schedule(slow, by=ACTOR)
    actions.archive_schedule(slow, by=ACTOR)
    actions.archive_schedule(fast, by=ACTOR)
    assert _counted(tenant) == counted_from_schedules(tenant) == (3, 1)

    # A one-time schedule that has fired (completed) still holds its place until archived.
    Schedule.objects.filter(tenant=tenant, status=ScheduleStatus.ACTIVE, current__sub_minute=False).update(
        status=ScheduleStatus.COMPLETED)
    assert _counted(tenant) == counted_from_schedules(tenant) == (3, 1)

    # Rows deleted by hand (nothing in the scheduler deletes a schedule; its versions protect it)
    # are taken off too.
    (doomed,) = Schedule.objects.filter(tenant=tenant, current__sub_minute=True).exclude(status=ScheduleStatus.ARCHIVED)
    as_stored = Schedule._meta.pk.get_db_prep_value(doomed.id, connection)
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("DELETE FROM schedules_schedule WHERE id = %s", [as_stored])
        cur.execute("DELETE FROM schedules_scheduleversion WHERE schedule_id = %s", [as_stored])
    assert _counted(tenant) == counted_from_schedules(tenant) == (2, 0)
    assert _counted(other_tenant) == counted_from_schedules(other_tenant) == (1, 1)


def test_the_triggers_survive_every_migration():
    """A migration that rebuilds schedules_schedule (as Django does on SQLite for many changes)
    drops its triggers with the old table, silently: the counts would stop following."""
    with connection.cursor() as cur:
        if connection.vendor == "postgresql":
            cur.execute("SELECT tgname FROM pg_trigger WHERE tgrelid = 'schedules_schedule'::regclass "
                        "AND tgname LIKE 'schedule_count_%%'")
        else:
            cur.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'schedules_schedule' "
                        "AND name LIKE 'schedule_count_%'")
        names = sorted(name for (name,) in cur.fetchall())
    assert names == ["schedule_count_changed", "schedule_count_deleted", "schedule_count_inserted"]


@pytest.mark.postgresql_only("several connections creating at once")
def test_concurrent_creates_of_one_tenant_are_all_counted(tenant, target, settings):
    settings.SCHEDULER_MAX_SCHEDULES_PER_TENANT = 0
    settings.SCHEDULER_MAX_SUBMINUTE_SCHEDULES_PER_TENANT = 0
    url = target.url + "/hook"
    errors = []
    start = threading.Barrier(6)

    def creator(n):
        try:
            start.wait(timeout=10)
            for i in range(25):
                make_schedule(tenant, url, expression=FAST if i % 5 == 0 else SLOW)
        except Exception as exc:  # reported below: a thread's failure must fail the test
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=creator, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert _counted(tenant) == counted_from_schedules(tenant) == (150, 30)
    # Spread over the connections' slots, not queued on one row.
    assert TenantScheduleCount.objects.filter(tenant=tenant).count() > 1


def test_the_migration_counts_the_schedules_already_stored(tenant, other_tenant, target, settings):
    settings.SCHEDULER_MAX_SCHEDULES_PER_TENANT = 0  # no quota reads the counts while they are gone
    settings.SCHEDULER_MAX_SUBMINUTE_SCHEDULES_PER_TENANT = 0
    url = target.url + "/hook"
    # The schedules are made with today's models, then the schema goes back to before the counts
    # (later migrations' columns with it) and forward again: 0007 finds them already stored.
    for expression in (FAST, SLOW, SLOW):
        make_schedule(tenant, url, expression=expression)
    make_schedule(other_tenant, url, expression=SLOW)
    archived = make_schedule(tenant, url, expression=FAST)
    Schedule.objects.filter(id=archived.id).update(status=ScheduleStatus.ARCHIVED, archived_at=archived.created_at)
    executor = MigrationExecutor(connection)
    try:
        executor.migrate([("schedules", "0006_membership_role")])
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())
    assert _counted(tenant) == counted_from_schedules(tenant) == (3, 1)
    assert _counted(other_tenant) == (1, 0)
    make_schedule(tenant, url, expression=FAST)  # and the triggers count from there
    assert _counted(tenant) == counted_from_schedules(tenant) == (4, 2)
