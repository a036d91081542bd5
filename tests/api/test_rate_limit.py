"""Per-key rate limit: 429 with Retry-After, counted in PostgreSQL so every web worker shares one
count."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from scheduler_project.web.models import ApiRateCounter
from scheduler_project.web.store import find_key
from schedules.models import ApiKey

LIMIT = 3


@pytest.mark.django_db
def test_past_the_limit_a_key_gets_429_with_retry_after(api, settings):
    settings.SCHEDULER_API_RATE_LIMIT_PER_MINUTE = LIMIT
    # 8 requests inside one second cross at most one minute boundary, so one of the (at most two)
    # windows has more than LIMIT of them: at least one 429, whatever the clock.
    responses = [api.get("/api/v1/schedules") for _ in range(8)]
    codes = [r.status_code for r in responses]
    assert codes[:LIMIT] == [200] * LIMIT
    limited = [r for r in responses if r.status_code == 429]
    assert limited
    for r in limited:
        assert 1 <= int(r["Retry-After"]) <= 60
        assert r.json()["retryAfter"] == int(r["Retry-After"])
        assert "rate limit" in r.json()["error"]


@pytest.mark.django_db
def test_the_limit_is_per_key(api, tenant, settings):
    from tests.conftest import api_client_for

    settings.SCHEDULER_API_RATE_LIMIT_PER_MINUTE = LIMIT
    for _ in range(LIMIT + 2):
        api.get("/api/v1/schedules")
    fresh = api_client_for(tenant)
    assert fresh.get("/api/v1/schedules").status_code == 200


@pytest.mark.django_db
def test_zero_turns_the_limit_off(api, settings):
    settings.SCHEDULER_API_RATE_LIMIT_PER_MINUTE = 0
    assert all(api.get("/api/v1/schedules").status_code == 200 for _ in range(5))
    assert not ApiRateCounter.objects.exists()


@pytest.mark.django_db
def test_the_count_lives_in_the_database_one_row_per_key_and_minute(api, settings):
    settings.SCHEDULER_API_RATE_LIMIT_PER_MINUTE = 100
    for _ in range(3):
        api.get("/api/v1/schedules")
    key = ApiKey.objects.get(prefix=api.raw_key[:11])
    rows = list(ApiRateCounter.objects.filter(key=key))
    assert 1 <= len(rows) <= 2 and sum(r.count for r in rows) == 3
    assert all(r.window_start.second == 0 and r.window_start.microsecond == 0 for r in rows)


def _wait_for_fresh_minute():
    with connection.cursor() as cur:
        cur.execute("SELECT extract(second FROM statement_timestamp())")
        second = float(cur.fetchone()[0])
    if second > 50:
        time.sleep(61 - second)


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgresql_only("several connections racing on one counter row: SQLite has one writer at a time")
def test_concurrent_requests_from_several_connections_are_each_counted_once(tenant):
    """Stands in for several gunicorn workers: separate connections hitting one key at once. The
    upsert is atomic, so no increment is lost and no count is handed out twice."""
    from schedules.tenants import create_api_key

    key, _ = create_api_key(tenant)
    _wait_for_fresh_minute()
    start = threading.Barrier(8)

    def worker(_):
        try:
            start.wait()
            return [find_key(key.key_hash, count=True).counted[0] for _ in range(25)]
        finally:
            connection.close()

    with ThreadPoolExecutor(8) as pool:
        counts = [c for batch in pool.map(worker, range(8)) for c in batch]
    assert sorted(counts) == list(range(1, 201))
