"""POST /api/v1/schedules/batch: up to 1,000 schedules per request, each item validated exactly as a
single create (serializer, service, quotas), per-item results in order, one transaction, the same
Idempotency-Key rules, and a number of statements that does not grow with the batch."""

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs import actions
from runs.actions import MAX_BATCH
from runs.store import store
from scheduler_project.foundation.dbclock import db_now
from scheduler_project.foundation.errors import ValidationFailed
from schedules.models import AuditEntry, Schedule, ScheduleVersion
from tests.api.conftest import schedule_body
from tests.helpers import ACTOR

pytestmark = pytest.mark.django_db
URL = "/api/v1/schedules/batch"


def batch(api, items, **headers):
    return api.post(URL, {"schedules": items}, format="json", **headers)


def test_it_creates_every_schedule_and_answers_per_item_in_order(api, tenant, target):
    items = [schedule_body(target, name=f"b{i}", expression=f"{i} * * * *") for i in range(5)]
    resp = batch(api, items)
    assert resp.status_code == 201
    body = resp.json()
    assert (body["created"], body["failed"]) == (5, 0)
    assert [r["index"] for r in body["results"]] == list(range(5))
    for i, r in enumerate(body["results"]):
        assert r["status"] == 201 and r["version"] == 1
        s = Schedule.objects.select_related("current").get(id=r["id"])
        assert (s.tenant_id, s.name, s.current.expression, s.current.version) == (tenant.id, f"b{i}", f"{i} * * * *", 1)
        assert r["nextRunAt"] == s.next_run_at.isoformat().replace("+00:00", "Z")
    assert AuditEntry.objects.filter(action="schedule.create", tenant=tenant).count() == 5


def test_a_batch_item_is_stored_exactly_as_a_single_create_stores_it(api, target):
    body = schedule_body(target, name="same", payload={"a": [1, 2]}, misfirePolicy="skip",
                         retryPolicy={"maxAttempts": 3})
    body["target"] = {"url": target.url + "/x", "method": "PUT", "headers": {"X-A": "1"}}
    one = api.post("/api/v1/schedules", body, format="json").json()
    (made,) = batch(api, [body]).json()["results"]
    other = api.get(f"/api/v1/schedules/{made['id']}").json()
    differ = {"id", "createdAt", "updatedAt", "nextRunAt"}
    assert {k: v for k, v in other.items() if k not in differ} == {k: v for k, v in one.items() if k not in differ}


def test_items_sharing_a_rule_get_what_each_would_get_alone(tenant, target):
    """A batch parses a rule once for the items that share it, and takes its first instant once
    per start and end: every item's first instant and sub-minute flag are still its own."""
    now = db_now()
    url = target.url + "/x"
    variants = [
        {"expression": "*/5 * * * *", "time_zone": "UTC"},
        {"expression": "*/5 * * * *", "time_zone": "Asia/Kathmandu"},
        {"expression": "rate(7 minutes)", "time_zone": "UTC"},
        {"expression": "rate(7 minutes)", "time_zone": "UTC", "start_at": now + timedelta(hours=3)},
        {"expression": "rate(7 minutes)", "time_zone": "UTC", "start_at": now + timedelta(hours=5)},
        {"expression": "RRULE:FREQ=SECONDLY;INTERVAL=10", "time_zone": "UTC"},
        {"expression": "0 9 * * *", "time_zone": "UTC", "end_at": now + timedelta(days=400)},
        {"expression": "0 9 * * *", "time_zone": "UTC", "dst_skipped": "skip"},
    ]
    items = [{**v, "name": f"v{i}-{k}", "target_url": url} for k in range(3) for i, v in enumerate(variants)]
    made = actions.create_schedules(tenant, items, by=ACTOR, now=now)
    for item, schedule in zip(items, made):
        alone = actions.create_schedule(tenant, {**item, "name": item["name"] + "-alone"}, by=ACTOR, now=now)
        assert schedule.next_run_at == alone.next_run_at, item
        stored = ScheduleVersion.objects.get(id=schedule.current_id)
        assert stored.sub_minute == alone.current.sub_minute == item["expression"].startswith("RRULE:FREQ=SECONDLY")

    # An end before the shared rule's first instant: refused, as it would be alone.
    daily = {"expression": "0 9 * * *", "time_zone": "UTC", "target_url": url}
    first = made[6].next_run_at
    open_ended, ended = actions.create_schedules(tenant, [{**daily, "name": "a"}, {**daily, "name": "b", "end_at": first}],
                                                 by=ACTOR, now=now)
    assert open_ended.next_run_at == first
    assert isinstance(ended, ValidationFailed) and "never fires" in str(ended)


def test_refused_items_get_the_single_creates_answer_and_the_others_are_created(api, tenant, target):
    items = [
        schedule_body(target, name="ok"),
        schedule_body(target, timeZone="Mars/Olympus"),  # the service refuses it
        {**schedule_body(target), "target": {"url": "http://elsewhere.example/hook"}},  # not on the allowlist
        {"expression": "*/5 * * * *"},  # the serializer refuses it
        [schedule_body(target)],  # not an object
        {**schedule_body(target), "colour": "red"},  # an unknown field
        schedule_body(target, payload={"x": "y" * 70_000}),  # over the payload limit
    ]
    resp = batch(api, items)
    assert resp.status_code == 207
    results = resp.json()["results"]
    assert [r["status"] for r in results] == [201, 400, 400, 400, 400, 400, 413]
    for item, r in zip(items[1:], results[1:]):
        single = api.post("/api/v1/schedules", item, format="json")
        assert (r["status"], {k: v for k, v in r.items() if k not in ("index", "status")}) == (
            single.status_code, single.json())
    assert Schedule.objects.filter(tenant=tenant).count() == 1


def test_when_no_item_is_valid_the_answer_is_a_400_and_nothing_is_stored(api, tenant, target):
    resp = batch(api, [{"expression": "nope"}, schedule_body(target, timeZone="Nowhere/Else")])
    assert resp.status_code == 400 and resp.json()["created"] == 0
    assert not Schedule.objects.filter(tenant=tenant).exists()


@pytest.mark.parametrize("body", [{"schedules": []}, {"schedules": "x"}, {}, {"schedules": [{}], "extra": 1}])
def test_a_body_without_a_list_of_schedules_is_a_400(api, body):
    assert api.post(URL, body, format="json").status_code == 400


def test_more_than_the_limit_is_refused_whole(api, tenant, target, settings):
    settings.SCHEDULER_MAX_BATCH_REQUEST_BYTES = 8 * 1024 * 1024
    items = [schedule_body(target) for _ in range(MAX_BATCH + 1)]
    resp = batch(api, items)
    assert resp.status_code == 400 and "schedules" in resp.json()["errors"]
    assert not Schedule.objects.filter(tenant=tenant).exists()


def test_the_quota_applies_to_the_batch_as_a_whole(api, tenant, target, settings):
    settings.SCHEDULER_MAX_SCHEDULES_PER_TENANT = 3
    assert api.post("/api/v1/schedules", schedule_body(target), format="json").status_code == 201
    resp = batch(api, [schedule_body(target, name=f"q{i}") for i in range(4)])
    assert resp.status_code == 207
    assert [r["status"] for r in resp.json()["results"]] == [201, 201, 400, 400]
    assert "has 3 schedules, its quota" in resp.json()["results"][2]["errors"]["body"][0]
    assert Schedule.objects.filter(tenant=tenant).count() == 3


def test_a_repeated_batch_with_the_same_key_returns_the_first_answer(api, tenant, target):
    items = [schedule_body(target, name=f"k{i}") for i in range(3)]
    first = batch(api, items, HTTP_IDEMPOTENCY_KEY="batch-1")
    again = batch(api, items, HTTP_IDEMPOTENCY_KEY="batch-1")
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json() and again["Idempotent-Replayed"] == "true"
    assert Schedule.objects.filter(tenant=tenant).count() == 3
    other = batch(api, items[:2], HTTP_IDEMPOTENCY_KEY="batch-1")
    assert other.status_code == 422
    # A key of a single create is another scope.
    assert api.post("/api/v1/schedules", schedule_body(target), format="json",
                    HTTP_IDEMPOTENCY_KEY="batch-1").status_code == 201


def test_the_statements_do_not_grow_with_the_batch(api, target):
    def statements(n):
        with CaptureQueriesContext(connection) as ctx:
            assert batch(api, [schedule_body(target, name=f"n{n}-{i}") for i in range(n)]).status_code == 201
        return len(ctx.captured_queries)

    statements(1)  # the key's first use touches its last_used_at
    # SQLite caps the parameters of one statement, so Django splits its bulk inserts in chunks.
    assert statements(50) - statements(2) <= (0 if connection.vendor == "postgresql" else 3)
    assert ScheduleVersion.objects.count() == 53


def test_a_single_create_takes_few_statements(api, target):
    yearly = schedule_body(target, expression="0 3 1 1 *")
    api.post("/api/v1/schedules", yearly, format="json")  # the key's first use touches last_used_at
    with CaptureQueriesContext(connection) as ctx:
        assert api.post("/api/v1/schedules", yearly, format="json").status_code == 201
    sql = [q["sql"] for q in ctx.captured_queries]
    # One insert each for the version, the schedule and the audit entry; nothing updates the
    # schedule afterwards.
    for table in ("schedules_scheduleversion", "schedules_schedule", "schedules_auditentry"):
        assert sum(s.count(f'INSERT INTO "{table}" ') for s in sql) == 1, table
    assert not any('UPDATE "schedules_schedule"' in s for s in sql)
    assert not any("pg_notify" in s for s in sql)  # due in months: the scanners' polling finds it
    if connection.vendor == "postgresql":
        # The key with its tenant, allowlist, the counts the quota reads, rate count and clock in one
        # statement, then the three inserts as one: far from the quota's limit, a create reads no
        # count of its own and needs no transaction.
        assert len(sql) == 2, sql
        assert sql[0].lstrip().startswith("WITH found AS"), sql[0]
        assert sql[1].startswith('WITH new_version AS (INSERT INTO "schedules_scheduleversion"'), sql[1]


@pytest.mark.postgresql_only("counts PostgreSQL round trips")
@pytest.mark.django_db(transaction=True)
def test_near_the_quota_a_single_create_counts_again_under_the_tenant_lock(api, target, settings):
    settings.SCHEDULER_MAX_SCHEDULES_PER_TENANT = 50  # within QUOTA_LOCK_MARGIN of its limit
    yearly = schedule_body(target, expression="0 3 1 1 *")
    api.post("/api/v1/schedules", yearly, format="json")  # the key's first use touches last_used_at
    with CaptureQueriesContext(connection) as ctx:
        assert api.post("/api/v1/schedules", yearly, format="json").status_code == 201
    sql = [q["sql"] for q in ctx.captured_queries if q["sql"] not in ("BEGIN", "COMMIT")]
    assert len(sql) == 4, sql
    assert "FOR NO KEY UPDATE" in sql[1] and '"schedules_tenant"' in sql[1]
    assert sql[2].startswith('SELECT SUM("schedules_tenantschedulecount"."live")'), sql[2]
    assert sql[3].startswith('WITH new_version AS'), sql[3]
    assert Schedule.objects.count() == 2


@pytest.mark.postgresql_only("counts PostgreSQL round trips")
@pytest.mark.django_db(transaction=True)
def test_without_a_quota_a_single_create_is_two_statements(api, target, settings):
    settings.SCHEDULER_MAX_SCHEDULES_PER_TENANT = 0
    yearly = schedule_body(target, expression="0 3 1 1 *")
    api.post("/api/v1/schedules", yearly, format="json")  # the key's first use touches last_used_at
    with CaptureQueriesContext(connection) as ctx:
        response = api.post("/api/v1/schedules", yearly, format="json")
    assert response.status_code == 201
    sql = [q["sql"] for q in ctx.captured_queries]
    # The key lookup, then the three inserts as one statement, a transaction of its own: no
    # BEGIN, no COMMIT, no quota count.
    assert len(sql) == 2, sql
    assert sql[0].lstrip().startswith("WITH found AS")
    assert sql[1].startswith('WITH new_version AS (INSERT INTO "schedules_scheduleversion"')
    assert Schedule.objects.filter(id=response.json()["id"]).exists()


@pytest.mark.postgresql_only("several connections creating at once")
@pytest.mark.django_db(transaction=True)
def test_concurrent_batches_cannot_together_go_past_the_quota(tenant, target, settings, monkeypatch):
    """Far from the limit a single create counts without a lock (the creates beside it are fewer
    than the margin), but a batch adds hundreds at once: two that both counted before either
    committed made 1,202 schedules under a quota of 1,000 (found from outside, four batches of
    300). Here each batch waits, after counting, for the other to reach its inserts (or 2 s):
    without the tenant lock both get there with the same count."""
    # Far enough from the limit that neither batch alone would be counted near it.
    settings.SCHEDULER_MAX_SCHEDULES_PER_TENANT = 300
    inserted = threading.Barrier(2)
    real_insert = type(store()).rows_insert_new

    def insert_new(self, model, objs, **kw):
        if model is ScheduleVersion:
            try:
                inserted.wait(timeout=2)
            except threading.BrokenBarrierError:
                pass  # the other batch is held at the lock: the fix working
        return real_insert(self, model, objs, **kw)

    monkeypatch.setattr(type(store()), "rows_insert_new", insert_new)
    results = []

    def create(tag):
        try:
            items = [{"name": f"{tag}{i}", "expression": "0 * * * *", "time_zone": "UTC",
                      "target_url": target.url + "/hook"} for i in range(190)]
            results.append(actions.create_schedules(tenant, items, by=ACTOR, now=db_now()))
        finally:
            connection.close()

    threads = [threading.Thread(target=create, args=(tag,)) for tag in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    made = [r for batch_results in results for r in batch_results if not isinstance(r, Exception)]
    assert len(made) == 300
    assert Schedule.objects.filter(tenant=tenant).count() == 300


def test_a_null_item_is_refused_in_its_own_result_like_any_item_that_is_not_an_object(api, tenant, target):
    resp = batch(api, [schedule_body(target), None, 5])
    assert resp.status_code == 207
    results = resp.json()["results"]
    assert [r["status"] for r in results] == [201, 400, 400]
    single = api.generic("POST", "/api/v1/schedules", "null", content_type="application/json")
    assert {k: v for k, v in results[1].items() if k not in ("index", "status")} == single.json()
    assert Schedule.objects.filter(tenant=tenant).count() == 1


def test_an_unknown_query_parameter_is_refused_as_on_every_other_operation(api, tenant, target):
    resp = api.post(URL + "?dryRun=true", {"schedules": [schedule_body(target)]}, format="json")
    assert resp.status_code == 400 and resp.json()["errors"]["dryRun"][0].startswith("unknown query parameter")
    assert not Schedule.objects.filter(tenant=tenant).exists()


# What COPY's text format escapes (tab, newline, carriage return, backslash, "\N" that means
# NULL, "\." that ends the data), control characters, and text beyond the Basic Multilingual Plane.
AWKWARD = ["tab\there", "new\nline\r\nend", "back\\slash", "\\N", "\\.", "end\\", "quote\"'", "\x01\x1f\x7f",
           "ünïcødé ☃ 𝄞 日本"]


def test_awkward_text_is_stored_by_the_batch_exactly_as_sent(api, tenant, target):
    """The batch inserts with COPY on PostgreSQL (PostgresStore.rows_insert_new), not INSERT: every
    text and JSON value must come back exactly as a single create stores it."""
    items = [{**schedule_body(target, name=s, payload={"s": s, s: [s, {"k": s}], "n": -2**63 + 1}),
              "target": {"url": f"{target.url}/hook?q={i}", "headers": {"X-Awkward": "a\\b\"c"}}}
             for i, s in enumerate(AWKWARD)]
    results = batch(api, items).json()["results"]
    assert [r["status"] for r in results] == [201] * len(AWKWARD)
    for item, r in zip(items, results):
        got = api.get(f"/api/v1/schedules/{r['id']}").json()
        assert (got["name"], got["payload"], got["target"]["url"], got["target"]["headers"]) == (
            item["name"], item["payload"], item["target"]["url"], item["target"]["headers"])
        (entry,) = api.get("/api/v1/audit", {"objectId": r["id"]}).json()["results"]
        assert (entry["after"]["name"], entry["after"]["payload"]) == (item["name"], item["payload"])


def test_a_batch_is_one_transaction_a_failed_insert_leaves_nothing(api, tenant, target, monkeypatch):
    real_insert = type(store()).rows_insert_new

    def insert_new(self, model, objs, **kw):
        if model is AuditEntry:
            raise RuntimeError("the audit insert failed")
        return real_insert(self, model, objs, **kw)

    monkeypatch.setattr(type(store()), "rows_insert_new", insert_new)
    with pytest.raises(RuntimeError):
        actions.create_schedules(tenant, [{"expression": "0 * * * *", "time_zone": "UTC",
                                           "target_url": target.url + "/hook"}] * 3, by=ACTOR, now=db_now())
    assert not Schedule.objects.filter(tenant=tenant).exists() and not ScheduleVersion.objects.exists()


def test_a_full_batch_of_ordinary_schedules_fits_the_batch_body_limit(api, tenant, target, settings):
    # 1,000 items with a payload of about 1 KiB each: far over the single request's limit, within
    # the batch's own.
    settings.SCHEDULER_MAX_SCHEDULES_PER_TENANT = 0
    items = [schedule_body(target, name=f"full-{i}", payload={"report": "x" * 1000, "n": i}) for i in range(MAX_BATCH)]
    resp = batch(api, items)
    assert resp.status_code == 201, resp.content[:300]
    assert Schedule.objects.filter(tenant=tenant, name__startswith="full-").count() == MAX_BATCH


def test_a_batch_body_over_the_batch_limit_is_a_413_and_stores_nothing(api, tenant, target, settings):
    settings.SCHEDULER_MAX_BATCH_REQUEST_BYTES = 300_000
    items = [schedule_body(target, name=f"big-{i}", payload={"report": "x" * 1000}) for i in range(400)]
    resp = batch(api, items)
    assert resp.status_code == 413 and "limit is 300000 bytes" in resp.json()["error"]
    # The single request's limit is not the batch's: a single create over it is still a 413.
    settings.SCHEDULER_MAX_REQUEST_BYTES = 1000
    one = api.post("/api/v1/schedules", schedule_body(target, payload={"report": "x" * 2000}), format="json")
    assert one.status_code == 413
    assert not Schedule.objects.filter(tenant=tenant).exists()
