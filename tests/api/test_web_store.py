"""The web's store (scheduler_project.web.store) gives the same answers on both engines: the key
lookup is one statement on PostgreSQL and the ORM step by step on SQLite; rate counting on its own
(`hit`, what the lookup uses on SQLite) counts and prunes alike on both. Run on each by the README's
test command."""

from datetime import datetime, timedelta, timezone

import pytest
from django.db import connection

from scheduler_project.foundation.dbclock import db_now
from scheduler_project.web.models import ApiRateCounter
from scheduler_project.web.store import find_key, hit, prune
from schedules.models import ApiKey, hash_api_key
from schedules.services import SYSTEM, _counted
from schedules.tenants import create_api_key, create_tenant, revoke_api_key
from tests.helpers import make_schedule


@pytest.fixture
def keyed(db):
    tenant = create_tenant("lookup", name="Lookup", allow_targets=["https://b.example/", "https://a.example/x/"])
    other = create_tenant("other-lookup", allow_targets=["https://c.example/"])
    key, raw = create_api_key(tenant, label="contract")
    create_api_key(other, label="not this one")
    return tenant, key, raw


def test_an_unknown_hash_finds_nothing_and_counts_nothing(keyed):
    assert find_key(hash_api_key("sk_nosuchkey"), count=True) is None
    assert not ApiRateCounter.objects.exists()


def test_the_key_comes_with_its_tenant_and_allowlist(keyed):
    tenant, key, raw = keyed
    found = find_key(hash_api_key(raw), count=False)
    assert found.key.id == key.id and found.key.prefix == key.prefix and found.key.revoked_at is None
    assert found.key.created_at == ApiKey.objects.get(id=key.id).created_at
    assert found.key.tenant.id == tenant.id and found.key.tenant.slug == "lookup"
    assert found.key.tenant.signing_secret == tenant.signing_secret
    assert found.key.tenant.created_at.tzinfo is not None
    # The same prefixes, in the same order, as reading them on use.
    assert found.key.tenant.allowed_prefixes() == tenant.allowed_prefixes() == [
        "https://a.example/x/", "https://b.example/"]
    assert found.counted is None and not ApiRateCounter.objects.exists()


def test_the_quota_counts_come_with_the_tenant_or_are_read_on_use(keyed):
    tenant, _, raw = keyed
    make_schedule(tenant, "https://a.example/x/hook", expression="RRULE:FREQ=SECONDLY")
    make_schedule(tenant, "https://b.example/hook", expression="rate(1 hour)")
    found = find_key(hash_api_key(raw), count=False).key.tenant
    # Read in the lookup's statement on PostgreSQL, on use on SQLite: the same counts either way.
    assert found.known_schedule_counts == ((2, 1) if connection.vendor == "postgresql" else None)
    assert _counted(found) == _counted(tenant) == (2, 1)
    # Taken once: a schedule made after the lookup is in the next read.
    assert found.known_schedule_counts is None
    make_schedule(tenant, "https://b.example/hook", expression="rate(1 hour)")
    assert _counted(found) == (3, 1)


def test_counting_adds_one_per_request_in_the_minute_and_reads_the_clock(keyed):
    _, key, raw = keyed
    before = db_now()
    first = find_key(hash_api_key(raw), count=True)
    second = find_key(hash_api_key(raw), count=True)
    n1, left1 = first.counted
    n2, left2 = second.counted
    # Two calls may straddle a minute boundary: then the second starts a new window at 1.
    assert (n1, n2) in ((1, 2), (1, 1))
    assert 0 < left1 <= 60 and 0 < left2 <= 60
    assert sum(r.count for r in ApiRateCounter.objects.filter(key_id=key.id)) == 2
    assert before - timedelta(seconds=1) <= first.now <= second.now <= db_now() + timedelta(seconds=1)
    assert first.now.tzinfo is not None


def test_a_new_window_prunes_the_keys_older_windows(keyed):
    _, key, raw = keyed
    ApiRateCounter.objects.create(key_id=key.id, window_start=datetime(2020, 1, 1, tzinfo=timezone.utc), count=9)
    found = find_key(hash_api_key(raw), count=True)
    assert found.counted[0] == 1
    assert list(ApiRateCounter.objects.filter(key_id=key.id).values_list("count", flat=True)) == [1]


def test_a_revoked_key_is_found_but_not_counted(keyed):
    _, key, raw = keyed
    revoke_api_key(key, by=SYSTEM)
    found = find_key(hash_api_key(raw), count=True)
    assert found.key.id == key.id and found.key.revoked_at is not None
    assert found.counted is None and not ApiRateCounter.objects.exists()


def test_hit_counts_requests_in_the_minute_and_prunes_older_windows(keyed):
    _, key, _ = keyed
    ApiRateCounter.objects.create(key_id=key.id, window_start=datetime(2020, 1, 1, tzinfo=timezone.utc), count=9)
    n1, left1, now1 = hit(key.id)
    n2, left2, now2 = hit(key.id)
    # Two calls may straddle a minute boundary: then the second starts a new window at 1.
    assert (n1, n2) in ((1, 2), (1, 1))
    assert 0 < left1 <= 60 and 0 < left2 <= 60 and now1 <= now2 and now1.tzinfo is not None
    # The first request of a window removed the key's older windows.
    assert list(ApiRateCounter.objects.filter(key_id=key.id).values_list("count", flat=True)) == [n2]


@pytest.mark.postgresql_only("prune compares with the database clock's minute (statement_timestamp), which the "
                             "SQLite store does not use: there `hit` prunes on the process's clock")
def test_prune_keeps_only_the_current_window(keyed):
    _, key, raw = keyed
    find_key(hash_api_key(raw), count=True)
    ApiRateCounter.objects.create(key_id=key.id, window_start=datetime(2020, 1, 1, tzinfo=timezone.utc), count=9)
    prune(key.id)
    # The lookup's window stays (unless a minute began since, and it went with the old one).
    assert list(ApiRateCounter.objects.filter(key_id=key.id).values_list("count", flat=True)) in ([1], [])
    assert not ApiRateCounter.objects.filter(key_id=key.id, window_start__year=2020).exists()
