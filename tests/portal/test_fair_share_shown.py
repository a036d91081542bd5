"""Issue 26, finding 1: the portal shows each tenant's effective in-flight limit (the default
share when no cap is set) where it showed caps before, and the workers page says what the default
shares are."""

import pytest

from schedules.models import Tenant

pytestmark = pytest.mark.django_db


def test_the_tenant_pages_show_the_default_share_when_no_cap_is_set(operator, tenant, settings):
    settings.SCHEDULER_WORKER_CONCURRENCY = 256
    page = operator.get(f"/tenants/{tenant.id}/").content.decode()
    assert ("the default share: 128 of each worker&#x27;s 256 slots (50%), 64 for its calls to one target host (25%)"
            in page)
    assert "default: 64 / worker" in page  # the allowlist's prefix has no budget of its own
    assert "default: 128 / worker" in operator.get("/tenants/").content.decode()
    Tenant.objects.filter(id=tenant.id).update(max_in_flight=300)
    page = operator.get(f"/tenants/{tenant.id}/").content.decode()
    assert "Now: 300 across the fleet (set for this tenant)." in page


def test_the_workers_page_says_what_the_default_shares_are(operator, tenant, settings):
    settings.SCHEDULER_WORKER_CONCURRENCY = 8
    page = operator.get("/workers/").content.decode()
    assert ("on each worker (8 slots as configured), one tenant's calls hold at most 4 slots (50.0 %) and its calls "
            "to one target host at most 2") in page
