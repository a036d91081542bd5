"""The activity loop's writes: on PostgreSQL one upsert per table adds a pass's increments in SQL;
the ORM's read-modify-write (SQLite's way) is the reference. Each case starts from the same rows,
applies the same increments both ways (on PostgreSQL; on SQLite the ORM way only) and checks the
rows against each other and against what the case expects."""

import uuid
from datetime import datetime, timedelta, timezone

import pytest
from django.db import connection

from dispatch import activity_store as store
from dispatch.models import CostDimension, RetryCostHour, ScheduleActivity, TargetMinute
from dispatch.retry_cost import Counts

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 12, 6, 12, 0, tzinfo=timezone.utc)
TENANT = uuid.uuid4()
RECENT = ScheduleActivity.RECENT


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def entry(s: float, code="s", latency=3) -> list:
    return [round(at(s).timestamp(), 3), code, latency]


def both_ways(model, setup, write_sql, write_orm, increments) -> list:
    """The rows after `increments`, written by the engine's way; on PostgreSQL also by the ORM's
    from the same start, and the two compared."""
    def rows():
        fields = [f.attname for f in model._meta.concrete_fields if f.attname != "id"]
        return sorted(model.objects.values_list(*fields), key=repr)

    model.objects.all().delete()
    setup()
    if connection.vendor != "postgresql":
        write_orm(increments)
        return rows()
    write_sql(increments)
    got = rows()
    model.objects.all().delete()
    setup()
    write_orm(increments)
    assert got == rows()
    return got


def summary_row(sid, first: int, n: int, *, last_ok_at: float) -> ScheduleActivity:
    """A schedule's summary holding n entries ending at first .. first + n - 1 seconds."""
    return ScheduleActivity.objects.create(
        schedule_id=sid, tenant_id=TENANT, succeeded=n, failed=0, last_finished_at=at(first + n - 1), last_outcome="succeeded",
        last_http_status=200, last_error="", last_run_id=uuid.UUID(int=first + n), last_success_at=at(last_ok_at),
        recent=[entry(first + i) for i in range(n)])


def batch(entries: list, *, ok: int, bad: int, last_s: float, last_outcome="succeeded", last_ok_s=None) -> store.ScheduleBatch:
    return store.ScheduleBatch(
        tenant_id=TENANT, succeeded=ok, failed=bad, last_finished_at=at(last_s), last_outcome=last_outcome,
        last_http_status=200 if last_outcome == "succeeded" else 500,
        last_error="" if last_outcome == "succeeded" else "HTTP 500", last_run_id=uuid.UUID(int=int(last_s * 1000)),
        last_success_at=at(last_ok_s) if last_ok_s is not None else None, recent=entries)


def fold(setup, batches) -> dict:
    got = both_ways(ScheduleActivity, setup, store._schedule_batches_sql, store._schedule_batches_orm, batches)
    assert len(got) == ScheduleActivity.objects.count()
    return {r.schedule_id: r for r in ScheduleActivity.objects.all()}


def test_attempts_that_end_in_order_extend_the_sparkline_and_replace_the_last_result():
    a, new = uuid.uuid4(), uuid.uuid4()
    rows = fold(lambda: summary_row(a, 100, RECENT, last_ok_at=140), {
        a: batch([entry(150), entry(151, "f", None)], ok=1, bad=1, last_s=151, last_outcome="failed", last_ok_s=150),
        new: batch([entry(10 + i) for i in range(RECENT)], ok=RECENT, bad=0, last_s=10 + RECENT - 1, last_ok_s=59)})
    r = rows[a]
    assert [e[0] for e in r.recent] == [entry(s)[0] for s in range(102, 152)]
    assert r.recent[-1] == entry(151, "f", None)
    assert (r.succeeded, r.failed, r.last_outcome, r.last_error) == (RECENT + 1, 1, "failed", "HTTP 500")
    assert (r.last_finished_at, r.last_success_at) == (at(151), at(150))
    assert len(rows[new].recent) == RECENT and rows[new].last_finished_at == at(59)


def test_an_attempt_that_ended_before_the_last_one_is_sorted_in_and_leaves_the_last_result():
    a = uuid.uuid4()
    before = {}

    def setup():
        before["row"] = summary_row(a, 100, RECENT, last_ok_at=149)

    r = fold(setup, {a: batch([entry(120.5, "f", 7)], ok=0, bad=1, last_s=120.5, last_outcome="failed")})[a]
    # The oldest entry goes, the late one is in its place by time.
    assert [e[0] for e in r.recent] == sorted([entry(s)[0] for s in range(101, 150)] + [entry(120.5)[0]])
    assert entry(120.5, "f", 7) in r.recent
    assert (r.last_finished_at, r.last_outcome, r.last_run_id) == (at(149), "succeeded", before["row"].last_run_id)
    assert (r.failed, r.last_success_at) == (1, at(149))


def test_an_attempt_that_ends_with_the_last_one_comes_after_it():
    a = uuid.uuid4()
    r = fold(lambda: summary_row(a, 100, 3, last_ok_at=102),
             {a: batch([entry(102, "f", 9)], ok=0, bad=1, last_s=102, last_outcome="failed")})[a]
    assert r.recent == [entry(100), entry(101), entry(102), entry(102, "f", 9)]
    assert (r.last_outcome, r.last_finished_at, r.last_success_at) == ("failed", at(102), at(102))


def test_target_minutes_add_up_and_keep_the_latest_failure():
    minute = at(0)
    key = (TENANT, minute, "k1")

    def setup():
        TargetMinute.objects.create(tenant_id=TENANT, minute=minute, url_key="k1", target_url="https://a.example/x",
                                    attempts=5, failed=1, last_failed_at=at(10))

    got = both_ways(TargetMinute, setup, store._target_minutes_sql, store._target_minutes_orm, {
        key: {"url": "https://a.example/x", "attempts": 3, "failed": 2, "last_failed_at": at(20)},
        (TENANT, minute, "k2"): {"url": "https://b.example/", "attempts": 1, "failed": 0, "last_failed_at": None}})
    rows = {r.url_key: r for r in TargetMinute.objects.all()}
    assert len(got) == 2
    assert (rows["k1"].attempts, rows["k1"].failed, rows["k1"].last_failed_at) == (8, 3, at(20))
    assert (rows["k2"].attempts, rows["k2"].failed, rows["k2"].last_failed_at) == (1, 0, None)


def test_retry_cost_hours_add_up():
    hour = at(0)
    key = (TENANT, CostDimension.SCHEDULE.value, "s1", hour)

    def setup():
        RetryCostHour.objects.create(tenant_id=TENANT, dimension=CostDimension.SCHEDULE.value, key="s1", hour=hour,
                                     attempts=4, successes=2, retries=1, retried_runs=1, failed=2, failed_us=1000,
                                     backoff_us=5000)

    got = both_ways(RetryCostHour, setup, store._retry_cost_hours_sql, store._retry_cost_hours_orm, {
        key: Counts(attempts=2, successes=1, retries=1, retried_runs=0, failed=1, failed_us=250, backoff_us=9000),
        (TENANT, CostDimension.TARGET.value, "a.example", hour): Counts(attempts=1, successes=1)})
    rows = {r.key: r for r in RetryCostHour.objects.all()}
    assert len(got) == 2
    s1 = rows["s1"]
    assert (s1.attempts, s1.successes, s1.retries, s1.retried_runs, s1.failed, s1.failed_us, s1.backoff_us) == (
        6, 3, 2, 1, 3, 1250, 14000)
    assert (rows["a.example"].attempts, rows["a.example"].retries) == (1, 0)


# What a tenant controls reaches these rows: its target URL (up to the 2,000 characters a version
# allows) and what its target answered (the error text). Quotes, backslashes, JSON and SQL
# look-alikes, non-Latin text and the longest values go through the JSON document unchanged.
HOSTILE = ['he said "no" \\ and left', "'); DROP TABLE dispatch_scheduleactivity; --", '{"rc": [1, 2]}',
           "ошибка 🚨 ‮ right-to-left", "x" * 300]


def test_what_a_tenant_controls_is_written_as_it_was_given():
    sids = [uuid.uuid4() for _ in HOSTILE]
    batches = {sid: batch([entry(1 + i, "f", 2**31 - 1)], ok=0, bad=1, last_s=1 + i, last_outcome="failed")
               for i, sid in enumerate(sids)}
    for sid, text in zip(sids, HOSTILE):
        batches[sid].last_error = text[:300]
    rows = fold(lambda: None, batches)
    assert [rows[sid].last_error for sid in sids] == [t[:300] for t in HOSTILE]
    assert rows[sids[0]].recent == [entry(1, "f", 2**31 - 1)]

    url = "https://a.example/" + "é" * 1982  # 2,000 characters
    got = both_ways(TargetMinute, lambda: None, store._target_minutes_sql, store._target_minutes_orm, {
        (TENANT, at(0), "k"): {"url": url, "attempts": 1, "failed": 1, "last_failed_at": at(1)}})
    assert len(got) == 1 and TargetMinute.objects.get().target_url == url
