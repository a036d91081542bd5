"""The forecast groups schedules by their target's origin, not the whole URL: a fleet with an id in
every URL (one URL per schedule) is one group, read as fast as a fleet sharing one URL, with the
same figures. Found by the soak (bench/soak.py): its schedules each call a URL of their own, and
the forecast read a row per schedule, so /forecast/ took half a minute and /metrics seconds."""

import random
from datetime import timedelta

import pytest
from django.db import connection

from dispatch import forecast as fc
from dispatch import forecast_store
from scheduler_project.foundation.dbclock import db_now
from schedules.targets import origin_sql, target_host
from tests.helpers import make_schedule

pytestmark = pytest.mark.django_db(transaction=True)


def _random_url(rng: random.Random) -> str:
    scheme = rng.choice(["http", "https", "HTTP", "Https"])
    host = rng.choice(["example.com", "Example.COM", "api.example.org.", "10.0.0.7", "[::1]", "[2001:db8::5]",
                       "xn--bcher-kva.example", "a-b.c-d.example"])
    port = rng.choice(["", ":80", ":443", ":9000", ":65535"])
    path = rng.choice(["", "/", "/a", "/items/123", "/x://y", "/p?q=/r", "/p#f/g", "/%2F/a"])
    tail = rng.choice(["", "?a=1", "?a=/b://c", "#frag", "?q#f/x"])
    return f"{scheme}://{host}{port}{path}{tail}"


def test_the_origin_the_database_cuts_has_the_host_of_the_whole_url():
    rng = random.Random(7)
    urls = [_random_url(rng) for _ in range(500)]
    with connection.cursor() as cur:
        for url in urls:
            cur.execute(f"SELECT {origin_sql('u', connection.vendor)} FROM (SELECT %s AS u) t", [url])
            origin = cur.fetchone()[0]
            assert target_host(origin) == target_host(url), (url, origin)
            assert len(origin) <= len(url)


def test_a_fleet_with_an_id_in_every_url_is_one_group_with_the_same_figures(tenant, target):
    n = 300
    # Hourly, half an hour from now: the next occurrence is inside the hour tier whenever the test
    # runs (at "0 * * * *" a run just before the hour saw it pass while the schedules were made).
    minute = (db_now().minute + 30) % 60
    for i in range(n):
        make_schedule(tenant, f"{target.url}/items/{i}?attempt={i}#x", expression=f"{minute} * * * *")
    until = db_now() + timedelta(days=8)
    rows = forecast_store.grouped(until=until)
    assert len(rows) == 1
    assert rows[0][-1] == n
    assert target_host(rows[0][9]) == target_host(target.url)
    now = db_now()
    full = fc.forecast(now=now, incremental=False)
    incremental = fc.forecast(now=now, incremental=True)
    for f in (full, incremental):
        assert f.exact
        assert f.schedules_counted == n
        week = sum(b.due for b in f.tiers["week"])
        assert week in (n * 24 * 7, n * (24 * 7 - 1), n * (24 * 7 + 1))  # hourly, for a week from this minute
        hour_hosts = {}
        for b in f.tiers["hour"]:
            for h, k in b.hosts.items():
                hour_hosts[h] = hour_hosts.get(h, 0) + k
        assert hour_hosts == {target_host(target.url): n}
    assert [(b.start, b.due) for b in incremental.tiers["week"]] == [(b.start, b.due) for b in full.tiers["week"]]
    by_host = fc.forecast(now=now, host=target_host(target.url))
    assert sum(b.due for b in by_host.tiers["week"]) == sum(b.due for b in full.tiers["week"])
