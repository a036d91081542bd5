"""The PostgreSQL claim returns the run id, schedule id and scheduled time as the text the call's
headers carry; they must be exactly what the Python formatting (the embedded database's path)
writes, with and without microseconds."""

from datetime import timedelta

import pytest

from runs import decisions, queue
from runs.models import Run
from tests.helpers import make_due, make_schedule, utc

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("at", [utc(2026, 3, 29, 1, 30), utc(2026, 11, 30, 23, 59, 59, 500), utc(2026, 1, 1, 0, 0, 0, 999999)])
def test_claimed_text_fields_match_the_python_formatting(tenant, target, at):
    schedule = make_schedule(tenant, target.url + "/run")
    make_due(schedule)
    from dispatch.loops import drain, scan_step

    drain(scan_step)
    Run.objects.filter(schedule=schedule).update(scheduled_time=at, next_eligible_at=at - timedelta(days=400))
    (c,) = queue.claim("w-text", 10)
    assert c.scheduled_time == at
    assert c.scheduled_iso == decisions.iso(at)
    assert c.run_key == str(c.run_id) and c.schedule_key == str(c.schedule_id)
