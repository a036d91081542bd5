"""The activity loop folds finished attempts into per-minute and per-schedule rows: each attempt
counted once, open ones when they end, recent ones only once nothing older can still appear."""

from datetime import timedelta

import pytest

from dispatch.activity import ActivityAggregator, drain, lag_bucket, minute_of
from dispatch.activity_figures import attempt_figures, failing_targets
from dispatch.loops import drain as drain_step
from dispatch.loops import scan_step
from dispatch.models import (
    ALL_TENANTS,
    LAG_BOUNDS,
    ActivityCursor,
    ActivityMinute,
    ActivityPending,
    ScheduleActivity,
    TargetMinute,
)
from dispatch.worker import run_worker
from runs.actions import trigger_schedule
from runs.models import Attempt, AttemptOutcome, Run, RunState
from scheduler_project.foundation.dbclock import db_now
from tests.helpers import ACTOR, make_due, make_schedule

pytestmark = pytest.mark.django_db

NOW = ActivityAggregator(settle=timedelta(0))


def finished_attempt(schedule, *, outcome=AttemptOutcome.SUCCEEDED, lag=2.0, latency=120, status=200, ago=0.0,
                     generation=1, error=""):
    run = trigger_schedule(schedule, by=ACTOR)
    started = run.scheduled_time + timedelta(seconds=lag) - timedelta(seconds=ago)
    run.scheduled_time -= timedelta(seconds=ago)  # the attempt copies its run's (the partition key)
    Run.objects.filter(id=run.id).update(scheduled_time=run.scheduled_time)
    return Attempt.objects.create(run=run, generation=generation, worker_id="w:1", started_at=started,
                                  finished_at=started + timedelta(milliseconds=latency or 5), outcome=outcome,
                                  http_status=status, latency_ms=latency, error=error)


def open_attempt(schedule, *, ago=30.0):
    run = trigger_schedule(schedule, by=ACTOR)
    return Attempt.objects.create(run=run, generation=1, worker_id="w:1",
                                  started_at=db_now() - timedelta(seconds=ago))


def minute_totals(tenant_id):
    rows = ActivityMinute.objects.filter(tenant_id=tenant_id)
    return (sum(r.succeeded for r in rows), sum(r.failed for r in rows), sum(r.unknown for r in rows))


@pytest.fixture
def sched(tenant, target):
    return make_schedule(tenant, target.url + "/ok", name="counted")


def test_it_counts_each_outcome_for_the_tenant_and_for_all_tenants(tenant, sched):
    finished_attempt(sched, ago=30)
    finished_attempt(sched, ago=30, outcome=AttemptOutcome.FAILED, status=503, error="HTTP 503 from target")
    finished_attempt(sched, ago=30, outcome=AttemptOutcome.UNKNOWN, status=None, latency=None)
    drain(NOW)
    assert minute_totals(tenant.id) == (1, 1, 1)
    assert minute_totals(ALL_TENANTS) == (1, 1, 1)


def test_a_second_pass_counts_nothing_twice(tenant, sched):
    finished_attempt(sched, ago=30)
    drain(NOW)
    drain(NOW)
    assert minute_totals(tenant.id) == (1, 0, 0)
    assert ScheduleActivity.objects.get(schedule_id=sched.id).succeeded == 1


def test_first_attempts_start_lags_fill_the_histogram(tenant, sched):
    finished_attempt(sched, lag=0.3, ago=30)
    finished_attempt(sched, lag=45, ago=90)
    finished_attempt(sched, lag=3, ago=30, generation=2)  # a retry: not a start lag
    drain(NOW)
    counts = [0] * (len(LAG_BOUNDS) + 1)
    for row in ActivityMinute.objects.filter(tenant_id=tenant.id):
        counts = [a + b for a, b in zip(counts, row.lag_counts or [0] * len(counts))]
    assert sum(counts) == 2
    assert counts[lag_bucket(0.3)] == 1 and counts[lag_bucket(45)] == 1


def test_an_attempt_still_open_is_counted_once_when_it_ends(tenant, sched):
    a = open_attempt(sched)
    drain(NOW)
    assert list(ActivityPending.objects.values_list("attempt_id", flat=True)) == [a.id]
    assert ActivityCursor.objects.get().watermark == a.id
    assert minute_totals(tenant.id) == (0, 0, 0)
    Attempt.objects.filter(id=a.id).update(outcome=AttemptOutcome.FAILED, finished_at=db_now(), http_status=500)
    drain(NOW)
    drain(NOW)
    assert minute_totals(tenant.id) == (0, 1, 0)
    assert not ActivityPending.objects.exists()


def test_an_open_attempt_before_one_too_new_to_count_is_still_parked(tenant, sched):
    # The pass stops at the too-new attempt after the watermark has passed the open one: the open
    # one must be parked all the same, or it is never counted.
    a = open_attempt(sched, ago=120)
    finished_attempt(sched, lag=0)  # started just now
    drain(ActivityAggregator(settle=timedelta(minutes=1)))
    assert ActivityCursor.objects.get().watermark == a.id
    assert list(ActivityPending.objects.values_list("attempt_id", flat=True)) == [a.id]
    Attempt.objects.filter(id=a.id).update(outcome=AttemptOutcome.FAILED, finished_at=db_now(), http_status=500)
    drain(NOW)
    assert minute_totals(tenant.id) == (1, 1, 0)


def test_attempts_started_within_the_settle_time_wait_for_a_later_pass(tenant, sched):
    a = finished_attempt(sched, lag=0)  # started just now
    settling = ActivityAggregator(settle=timedelta(minutes=5))
    drain(settling)
    assert minute_totals(tenant.id) == (0, 0, 0)
    assert ActivityCursor.objects.get().watermark < a.id
    drain(NOW)
    assert minute_totals(tenant.id) == (1, 0, 0)


def test_a_pass_reads_at_most_its_batch_and_says_more_is_waiting(tenant, sched):
    for _ in range(5):
        finished_attempt(sched, ago=30)
    small = ActivityAggregator(batch=2, settle=timedelta(0))
    assert small.step() is True
    assert minute_totals(tenant.id) == (2, 0, 0)
    while small.step():
        pass
    assert minute_totals(tenant.id) == (5, 0, 0)


def test_the_schedule_summary_keeps_its_last_result_last_success_and_newest_outcomes(tenant, sched):
    finished_attempt(sched, ago=90, latency=100)
    for _ in range(ScheduleActivity.RECENT + 5):
        finished_attempt(sched, ago=60, outcome=AttemptOutcome.FAILED, status=503, latency=900,
                         error="HTTP 503 from target")
    drain(NOW)
    row = ScheduleActivity.objects.get(schedule_id=sched.id)
    assert (row.succeeded, row.failed) == (1, ScheduleActivity.RECENT + 5)
    assert row.last_outcome == "failed" and row.last_http_status == 503 and row.last_error == "HTTP 503 from target"
    assert row.last_success_at is not None and row.last_success_at < row.last_finished_at
    assert len(row.recent) == ScheduleActivity.RECENT
    assert {r[1] for r in row.recent} == {"f"}


def test_a_success_leaves_no_last_error(tenant, sched):
    finished_attempt(sched, ago=30, outcome=AttemptOutcome.FAILED, status=500, error="HTTP 500 from target")
    finished_attempt(sched, ago=20)
    drain(NOW)
    row = ScheduleActivity.objects.get(schedule_id=sched.id)
    assert row.last_outcome == "succeeded" and row.last_error == ""


def test_targets_are_counted_per_minute_and_ranked_by_failures(tenant, sched, other_tenant, target):
    other = make_schedule(other_tenant, target.url + "/other", name="other")
    finished_attempt(sched, ago=30, outcome=AttemptOutcome.FAILED, status=503)
    finished_attempt(sched, ago=90, outcome=AttemptOutcome.UNKNOWN, status=None, latency=None)
    finished_attempt(sched, ago=30)
    finished_attempt(other, ago=30, outcome=AttemptOutcome.FAILED, status=500)
    finished_attempt(other, ago=30)
    finished_attempt(other, ago=30)
    drain(NOW)
    drain(NOW)  # counted once
    now = db_now()
    top = failing_targets(now=now)
    assert [(t.target_url, t.failed, t.attempts) for t in top] == [(sched.current.target_url, 2, 3),
                                                                   (other.current.target_url, 1, 3)]
    assert top[0].last_failed_at is not None
    # A tenant's own view sees its own targets only.
    mine = failing_targets(tenant_ids=[other_tenant.id], now=now)
    assert [(t.target_url, t.failed, t.attempts) for t in mine] == [(other.current.target_url, 1, 3)]
    # Outside the hour: nothing.
    assert failing_targets(now=now + timedelta(hours=2)) == []


def test_unknown_outcomes_and_lease_expirations_are_summed_from_the_minutes(tenant, sched, other_tenant):
    expired = finished_attempt(sched, ago=90, outcome=AttemptOutcome.UNKNOWN, status=None, latency=None)
    Attempt.objects.filter(id=expired.id).update(error_class="LeaseExpired")
    finished_attempt(sched, ago=30, outcome=AttemptOutcome.UNKNOWN, status=None, latency=None)
    finished_attempt(sched, ago=30, outcome=AttemptOutcome.FAILED, status=500)
    finished_attempt(sched, ago=30)
    drain(NOW)
    now = db_now()
    f = attempt_figures(now=now)
    assert (f.lease_expirations_last_hour, f.unknown_last_day) == (1, 2)
    assert f.oldest_unknown_at == minute_of(expired.finished_at)
    assert attempt_figures(tenant_ids=[tenant.id], now=now).unknown_last_day == 2
    assert attempt_figures(tenant_ids=[other_tenant.id], now=now).unknown_last_day == 0
    later = attempt_figures(now=now + timedelta(hours=2))  # out of the hour, still in the day
    assert (later.lease_expirations_last_hour, later.unknown_last_day) == (0, 2)
    assert attempt_figures(now=now + timedelta(days=2)).unknown_last_day == 0


def test_a_target_url_longer_than_an_index_entry_is_counted(tenant, target):
    url = target.url + "/" + "é" * 1900  # about 3,800 bytes: too long for a b-tree key
    s = make_schedule(tenant, url, name="long url")
    finished_attempt(s, ago=30, outcome=AttemptOutcome.FAILED, status=500)
    drain(NOW)
    assert [(t.target_url, t.failed) for t in failing_targets(now=db_now())] == [(s.current.target_url, 1)]
    assert TargetMinute.objects.filter(tenant_id=ALL_TENANTS).count() == 1


def test_a_new_database_starts_from_a_bounded_tail(tenant, sched, monkeypatch):
    from dispatch import activity

    monkeypatch.setattr(activity, "INITIAL_TAIL", 2)
    attempts = [finished_attempt(sched, ago=30) for _ in range(4)]
    drain(NOW)
    assert minute_totals(tenant.id) == (2, 0, 0)
    assert ActivityCursor.objects.get().watermark == attempts[-1].id


def test_minute_rows_past_retention_are_pruned(tenant, sched):
    from dispatch import activity

    old = ActivityMinute.objects.create(tenant_id=tenant.id, minute=db_now() - activity.RETENTION - timedelta(hours=1),
                                        succeeded=3)
    recent = ActivityMinute.objects.create(tenant_id=tenant.id, minute=db_now() - timedelta(hours=1), succeeded=2)
    NOW.step()
    assert not ActivityMinute.objects.filter(id=old.id).exists()
    assert ActivityMinute.objects.filter(id=recent.id).exists()


def test_target_rows_are_kept_only_a_little_past_the_dashboards_hour(tenant, sched):
    from dispatch import activity

    now = db_now()
    old = TargetMinute.objects.create(tenant_id=tenant.id, minute=now - activity.TARGET_RETENTION - timedelta(minutes=5),
                                      url_key="a", target_url="https://x.example/a", attempts=1)
    recent = TargetMinute.objects.create(tenant_id=tenant.id, minute=now - timedelta(minutes=30), url_key="b",
                                         target_url="https://x.example/b", attempts=1)
    NOW.step()
    assert not TargetMinute.objects.filter(id=old.id).exists()
    assert TargetMinute.objects.filter(id=recent.id).exists()


@pytest.mark.django_db(transaction=True)
def test_after_a_real_worker_pass_the_figures_match_the_runs(tenant, target):
    target.responder = lambda d: (200, b"{}") if d["path"] == "/ok" else (503, b"")
    ok = make_schedule(tenant, target.url + "/ok", name="ok")
    bad = make_schedule(tenant, target.url + "/bad", name="bad", max_attempts=1)
    for s in (ok, bad):
        make_due(s)
    drain_step(scan_step)
    run_worker("w-activity", once=True, poll_seconds=0)
    assert set(Run.objects.values_list("state", flat=True)) == {RunState.SUCCEEDED, RunState.DEAD}
    drain(NOW)
    assert minute_totals(tenant.id) == (1, 1, 0)
    assert ScheduleActivity.objects.get(schedule_id=ok.id).last_outcome == "succeeded"
    bad_row = ScheduleActivity.objects.get(schedule_id=bad.id)
    assert bad_row.last_outcome == "failed" and bad_row.last_http_status == 503
    assert bad_row.last_success_at is None


def test_kept_counts_of_the_last_hour_too_old_to_be_served_are_pruned(tenant, sched):
    from runs import stats
    from runs.models import RecentStateCount

    now = db_now()
    RecentStateCount.objects.create(key="old", taken_at=now - stats.RECENT_COUNT_MAX_AGE - timedelta(minutes=1),
                                    counts={"ready": 1})
    RecentStateCount.objects.create(key="fresh", taken_at=now, counts={"ready": 2})
    NOW.step()
    assert list(RecentStateCount.objects.values_list("key", flat=True)) == ["fresh"]
