"""The retry cost on the schedule page, the owner's page and the retry-cost page, as operator,
tenant admin and viewer: figures from the activity loop's rows, each user seeing only their own
tenants'."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import User

from dispatch.activity import ActivityAggregator, drain
from runs.actions import trigger_schedule
from runs.models import Attempt, AttemptOutcome, Run
from schedules.models import MemberRole, Schedule, TenantMembership
from schedules.owners import create_owner
from tests.helpers import ACTOR, make_schedule

from .conftest import login

pytestmark = pytest.mark.django_db


def attempts_of_one_run(schedule, outcomes, *, ago=120):
    """One run whose attempts ended with `outcomes`, each 2 s long, 3 s apart."""
    run = trigger_schedule(schedule, by=ACTOR)
    start = run.scheduled_time - timedelta(seconds=ago)
    Run.objects.filter(id=run.id).update(scheduled_time=start)
    for i, outcome in enumerate(outcomes):
        began = start + timedelta(seconds=5 * i)
        Attempt.objects.create(run_id=run.id, scheduled_time=start, generation=i + 1, worker_id="w:1",
                               started_at=began, finished_at=began + timedelta(seconds=2), outcome=outcome)


@pytest.fixture
def costly(tenant, target):
    owner = create_owner(tenant, {"slug": "billing", "name": "Billing team"}, by=ACTOR)
    s = make_schedule(tenant, target.url + "/job", name="nightly-export")
    Schedule.objects.filter(id=s.id).update(owner=owner)
    s.refresh_from_db()
    F, S = AttemptOutcome.FAILED, AttemptOutcome.SUCCEEDED
    attempts_of_one_run(s, [F, F, S])
    attempts_of_one_run(s, [S])
    drain(ActivityAggregator(settle=timedelta(0)))
    return s


@pytest.fixture
def viewer(tenant):
    u = User.objects.create_user("vera", password="pw-vera-123")
    TenantMembership.objects.create(user=u, tenant=tenant, role=MemberRole.VIEWER)
    return login(u)


def test_the_schedule_and_owner_pages_show_what_its_retries_cost(operator, acme, viewer, costly):
    for client in (operator, acme, viewer):
        page = client.get(f"/schedules/{costly.id}/").content.decode()
        assert 'data-testid="retry-cost"' in page
        # 4 attempts for 2 successful runs; 1 of 2 runs retried; 2 failed attempts of 2 s; 2 waits of 3 s.
        assert "2.00" in page and "50.0 %" in page and "(1 of 2)" in page and "4.0 s" in page and "6.0 s" in page
        owner = client.get(f"/owners/{costly.owner_id}/").content.decode()
        assert 'data-testid="retry-cost"' in owner and "(1 of 2)" in owner


def test_the_retry_cost_page_ranks_each_tenants_own(operator, acme, globex, viewer, costly, tenant, other_tenant):
    for client in (operator, acme, viewer):
        page = client.get("/retry-cost/", {"tenant": str(tenant.id), "by": "schedule", "window": "7d"}).content.decode()
        assert "nightly-export" in page and 'data-testid="retry-cost-ranking"' in page
        assert "billing" in client.get("/retry-cost/", {"tenant": str(tenant.id), "by": "owner"}).content.decode()
        assert "127.0.0.1" in client.get("/retry-cost/", {"tenant": str(tenant.id), "by": "target"}).content.decode()
    # Globex sees its own tenant (with nothing to rank), even when asking for acme's.
    page = globex.get("/retry-cost/", {"tenant": str(tenant.id)}).content.decode()
    assert "nightly-export" not in page and "No attempt ended in this window" in page
    assert globex.get(f"/schedules/{costly.id}/").status_code == 404


def test_bad_choices_fall_back_to_the_defaults(acme, costly):
    page = acme.get("/retry-cost/", {"by": "<x>", "window": "1y", "tenant": "nope"}).content.decode()
    assert "by schedule, last 24h" in page and "nightly-export" in page
