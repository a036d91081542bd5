"""The claim without explicit caps decides in SQL on PostgreSQL (RunClaimDue, one statement) what
runs.decisions.rotate/fair_share/pick decide in Python for the portable store: for the same due
runs, the same worker holdings and the same rotation, both lease the same runs.

The rotation is numbered differently (runs/decisions.py, beside `pick`, says how): RunClaimDue's
shift s serves first the tenant that `rotate` puts first at shift -(s + 1), counted over the
tenants with due runs; `rotate` counts only those with room. So with every tenant having room
each shift is compared with its counterpart, and with a tenant at its share the two are compared
as the set of choices over every shift. Where a tenant's target share binds among the rows the
statement reads of it, the two choose differently (said beside `pick`); the runs here are laid out
so that it does not."""

from datetime import timedelta

import pytest
from django.db import transaction

from runs import queue
from runs.actions import trigger_schedule
from runs.models import Run
from runs.store.portable import PortableStore
from runs.store.postgres import PostgresStore
from scheduler_project.foundation.dbclock import db_now
from schedules.tenants import create_tenant
from tests.helpers import ACTOR, make_schedule

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.postgresql_only("RunClaimDue is the PostgreSQL store's statement")]


def due(tenant, url, hosts: list[str], *, oldest: int) -> None:
    """One due run per entry of `hosts` (its target host), each a second younger than the last."""
    start = db_now() - timedelta(minutes=10, seconds=-oldest)
    for i, host in enumerate(hosts):
        run = trigger_schedule(make_schedule(tenant, f"{url}/{tenant.slug}{i}"), by=ACTOR)
        Run.objects.filter(id=run.id).update(target_host=host, next_eligible_at=start + timedelta(seconds=i))


def chosen(store, *, shift: int, limit: int, holding) -> frozenset:
    """The runs `store` leases, rolled back afterwards."""
    with transaction.atomic():
        point = transaction.savepoint()
        ids = frozenset(c.run_id for c in store.run_claim_due(worker="w", limit=limit, lease_seconds=30,
                                                              shift=shift, holding=holding))
        transaction.savepoint_rollback(point)
    return ids


@pytest.fixture
def tenants(tenant, other_tenant, target):
    third = create_tenant("initech", name="Initech", allow_targets=[target.url + "/"])
    # Older runs first in each tenant's queue; hosts repeat, and the rows each claim reads of a
    # tenant hold no more calls to one host than its target share has room for (where they do,
    # the two differ: runs/decisions.py, beside `pick`).
    due(tenant, target.url, ["a:1", "b:1", "a:1", "c:1", "b:1", "a:1", "c:1", "b:1", "a:1", "c:1"], oldest=0)
    due(other_tenant, target.url, ["a:1", "a:1", "d:1", "a:1", "d:1", "a:1"], oldest=3)
    due(third, target.url, ["e:1", "e:1", "e:1"], oldest=5)
    return tenant, other_tenant, third


@pytest.mark.parametrize("limit", [2, 5, 8, 40])
def test_the_sql_claim_and_the_python_pick_choose_the_same_runs(tenants, limit):
    holding = queue.idle_holding(16)
    holding.tenants = {tenants[0].id: 2}
    holding.hosts = {(tenants[0].id, "a:1"): 1}
    for s in range(len(tenants)):
        sql = chosen(PostgresStore(), shift=s, limit=limit, holding=holding)
        python = chosen(PortableStore(), shift=-(s + 1), limit=limit, holding=holding)
        assert sql == python, (s, limit)
        assert sql  # something is due for every rotation


@pytest.mark.parametrize("limit", [2, 5, 40])
def test_with_a_tenant_at_its_share_both_reach_the_same_choices(tenants, limit):
    holding = queue.idle_holding(16)
    holding.tenants = {tenants[1].id: holding.tenant_cap}  # no room: neither claim serves it
    holding.hosts = {(tenants[0].id, "a:1"): holding.host_cap}  # a full target of the first tenant
    sql = {chosen(PostgresStore(), shift=s, limit=limit, holding=holding) for s in range(len(tenants))}
    python = {chosen(PortableStore(), shift=s, limit=limit, holding=holding) for s in range(len(tenants))}
    assert sql == python
    served = {r.tenant_id for r in Run.objects.filter(id__in=set().union(*sql))}
    assert tenants[1].id not in served and tenants[0].id in served

