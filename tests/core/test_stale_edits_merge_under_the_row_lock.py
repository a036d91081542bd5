"""Issue 26, finding 7, with real connections: two editors save forms loaded from the same version
at the same moment, each changing a different field. The merge is made under the schedule's row
lock, so the second one merges over the first one's saved version: both changes are kept, and
neither editor reverts the other's."""

import threading

import pytest
from django.db import connections

from runs import actions
from schedules.models import Schedule
from schedules.services import version_fields
from tests.helpers import ACTOR, make_schedule

pytestmark = pytest.mark.django_db(transaction=True)


def test_concurrent_stale_forms_each_keep_the_others_change(tenant, target):
    schedule = make_schedule(tenant, target.url + "/hook", name="report", expression="30 2 * * SUN")
    loaded = version_fields(schedule.current)  # both forms, as loaded from version 1
    edits = [{**loaded, "expression": "45 3 * * SUN"}, {**loaded, "name": "weekly-report"}]
    start, errors = threading.Barrier(len(edits)), []

    def save(form):
        try:
            start.wait()
            actions.edit_schedule(Schedule.objects.get(id=schedule.id), expected_version=1, changes=form,
                                  by=ACTOR, merge=True)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=save, args=(form,)) for form in edits]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    current = Schedule.objects.select_related("current").get(id=schedule.id).current
    assert current.version == 3
    assert (current.expression, current.name) == ("45 3 * * SUN", "weekly-report")


def test_a_change_that_waited_for_an_edits_lock_sees_the_new_version(tenant, target):
    """A trigger (or pause, archive, another edit) that waited on the row lock of an edit read the
    schedule as the edit committed it but its version as it was before: none at all, on
    PostgreSQL. It must see the version the edit made."""
    schedule = make_schedule(tenant, target.url + "/hook", expression="30 2 * * SUN")
    start, errors, runs = threading.Barrier(2), [], []

    def edit(expected):
        try:
            start.wait()
            actions.edit_schedule(schedule, expected_version=expected,
                                  changes={"expression": "45 3 * * SUN"}, by=ACTOR)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            connections.close_all()

    def trigger():
        try:
            start.wait()
            runs.append(actions.trigger_schedule(schedule, by=ACTOR))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            connections.close_all()

    for _ in range(5):
        threads = [threading.Thread(target=edit, args=(schedule.version,)), threading.Thread(target=trigger)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        start.reset()
        schedule.refresh_from_db()
        actions.edit_schedule(schedule, expected_version=schedule.version,
                              changes={"expression": "30 2 * * SUN"}, by=ACTOR)
        schedule.refresh_from_db()
    assert errors == []
    assert len(runs) == 5 and all(r.version_id is not None for r in runs)
