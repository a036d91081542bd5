from datetime import timedelta

from runs.models import OutboxEvent
from scheduler_project.foundation.dbclock import db_now
from tests.helpers import make_due, make_schedule


def with_webhook(tenant, url):
    type(tenant).objects.filter(id=tenant.id).update(notification_url=url)
    tenant.refresh_from_db()
    return tenant


def events_for(tenant, target, n=3):
    """n real runs (so n run.created events) for the tenant, via a scan."""
    from dispatch.loops import drain, scan_step

    for i in range(n):
        make_due(make_schedule(tenant, target.url + f"/job{i}"))
    drain(scan_step)
    return list(OutboxEvent.objects.filter(tenant=tenant).order_by("id"))


def loose_events(tenant, n):
    return OutboxEvent.objects.bulk_create(
        [OutboxEvent(run_id=None, tenant_id=tenant.id, kind="run.test", payload={"n": i}) for i in range(n)]
    )


def make_due_for_retry(qs):
    """Let backoffs and leases run out: the relay compares with the database clock, so the test
    moves the rows, not a clock."""
    qs.update(next_attempt_at=db_now() - timedelta(seconds=1))


def webhook_deliveries(target, path="/events"):
    return [d for d in target.deliveries if d["path"] == path]
