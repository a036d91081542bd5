"""The figures module the dashboard and the metrics endpoint share."""

from datetime import timedelta

from runs import stats
from runs.models import Attempt, AttemptOutcome, RecentStateCount, Run, RunState
from scheduler_project.foundation.dbclock import db_now

from .conftest import make_run


def test_lag_percentiles_come_from_first_starts(schedule):
    for seconds in (1, 2, 3, 4, 100):
        run = make_run(schedule, RunState.SUCCEEDED)
        Attempt.objects.filter(run=run).update(started_at=run.scheduled_time + timedelta(seconds=seconds))
    lag = stats.scheduled_to_start_lag()
    assert lag.sample == 5
    assert lag.p50_seconds == 3
    assert lag.p99_seconds == 100
    assert lag.now_seconds == 3  # all five started within the last minute


def test_a_busy_window_is_read_as_an_even_sample(schedule, other_schedule, monkeypatch):
    monkeypatch.setattr(stats, "LAG_SAMPLE", 8)
    for seconds in range(1, 41):  # 40 starts of acme, lags 1..40 s
        run = make_run(schedule, RunState.SUCCEEDED)
        Attempt.objects.filter(run=run).update(started_at=run.scheduled_time + timedelta(seconds=seconds))
    lone = make_run(other_schedule, RunState.SUCCEEDED)  # one start of globex
    Attempt.objects.filter(run=lone).update(started_at=lone.scheduled_time + timedelta(seconds=7))
    lag = stats.scheduled_to_start_lag()
    assert lag.stride == 6  # 41 starts, at most 8 read
    assert 5 <= lag.sample <= 8 and 30 <= lag.starts <= 48
    assert 10 <= lag.p50_seconds <= 30 and lag.p99_seconds >= 30
    # globex's own view: its share of the window is small, so it is read whole.
    own = stats.scheduled_to_start_lag(tenant_ids=[other_schedule.tenant_id])
    assert (own.stride, own.sample, own.p50_seconds) == (1, 1, 7)


def test_backfills_do_not_count_as_lag(schedule):
    run = make_run(schedule, RunState.SUCCEEDED)
    Run.objects.filter(id=run.id).update(kind="backfill")
    assert stats.scheduled_to_start_lag().sample == 0


def test_oldest_overdue_is_the_earliest_due_ready_run(schedule):
    make_run(schedule, RunState.READY, age=timedelta(minutes=2))
    oldest = make_run(schedule, RunState.READY, age=timedelta(minutes=9))
    o = stats.overdue()
    assert o.count == 2
    assert o.oldest_run_id == str(oldest.id)
    assert 9 * 60 - 5 < o.age_seconds < 9 * 60 + 60


def test_runs_by_state_has_exact_live_totals_and_the_last_hour(schedule):
    for s in RunState.values:
        make_run(schedule, s)
    counts = stats.runs_by_state()
    assert counts.live == {"ready": 1, "leased": 1, "dead": 1}
    assert all(counts.recent[s] == 1 for s in RunState.values)


def test_dead_letter_growth_compares_the_last_hour_with_the_one_before(schedule):
    now = db_now()
    recent = [make_run(schedule, RunState.DEAD) for _ in range(3)]
    older = make_run(schedule, RunState.DEAD)
    Run.objects.filter(id=older.id).update(finished_at=now - timedelta(minutes=90))
    dl = stats.dead_letter()
    assert (dl.size, dl.last_hour, dl.hour_before, dl.growth) == (4, 3, 1, 2)
    assert recent


def test_per_tenant_in_flight_and_backlog_are_scoped(schedule, other_schedule):
    make_run(schedule, RunState.LEASED)
    make_run(schedule, RunState.READY)
    make_run(other_schedule, RunState.READY)
    all_ = {t.slug: (t.in_flight, t.backlog) for t in stats.per_tenant()}
    assert all_ == {"acme": (1, 1), "globex": (0, 1)}
    only = stats.per_tenant(tenant_ids=[schedule.tenant_id])
    assert [t.slug for t in only] == ["acme"]


def test_the_fingerprint_changes_only_when_the_figures_would(schedule):
    fp = stats.fingerprint()
    assert stats.fingerprint() == fp
    make_run(schedule, RunState.DEAD)
    assert stats.fingerprint() != fp


def test_the_dashboard_is_plain_data_for_the_metrics_endpoint(schedule):
    make_run(schedule, RunState.DEAD)
    d = stats.dashboard()
    data = stats.as_dict(d)
    assert data["dead_letter"]["size"] == 1
    assert data["states"]["live"]["dead"] == 1


def test_latest_dead_are_the_newest_whether_they_died_today_or_long_ago(schedule, other_schedule):
    now = db_now()
    old = make_run(schedule, RunState.DEAD)
    Run.objects.filter(id=old.id).update(finished_at=now - timedelta(days=20))
    recent = [make_run(other_schedule, RunState.DEAD) for _ in range(2)]
    # Fewer than five died in the last day: the older one is listed too, last.
    assert [r.id for r in stats.latest_dead(now=now)][-1] == old.id
    assert {r.id for r in stats.latest_dead(now=now)} == {old.id, *(r.id for r in recent)}
    # Five or more in the last day: only those, newest first.
    more = [make_run(schedule, RunState.DEAD) for _ in range(4)]
    latest = stats.latest_dead(now=db_now())
    assert old.id not in {r.id for r in latest} and len(latest) == 5
    assert [r.finished_at for r in latest] == sorted((r.finished_at for r in latest), reverse=True)
    assert latest[0].id in {r.id for r in more}
    # A tenant's own view.
    assert {r.id for r in stats.latest_dead(tenant_ids=[other_schedule.tenant_id], now=db_now())} == {r.id for r in recent}


def test_a_cheap_last_hour_is_counted_on_every_call_and_nothing_is_kept(schedule):
    make_run(schedule, RunState.READY)
    first = stats.runs_by_state()
    make_run(schedule, RunState.READY)
    second = stats.runs_by_state()
    assert (first.recent["ready"], second.recent["ready"]) == (1, 2)
    assert first.recent_as_of is None and second.recent_as_of is None
    assert not RecentStateCount.objects.exists()


def test_a_slow_last_hour_is_kept_and_served_until_it_is_too_old(schedule, other_schedule, monkeypatch):
    # Every count is "slow" here: the rule is what is tested, not a machine's speed.
    monkeypatch.setattr(stats, "RECENT_COUNT_SLOW_SECONDS", -1.0)
    make_run(schedule, RunState.READY)
    first = stats.runs_by_state()
    kept = RecentStateCount.objects.get(key="all")
    assert first.recent["ready"] == 1 and first.recent_as_of is None and kept.counts["ready"] == 1
    make_run(schedule, RunState.READY)
    served = stats.runs_by_state()
    assert served.recent["ready"] == 1 and served.recent_as_of == kept.taken_at  # the kept count
    assert served.live["ready"] == 2  # the live totals are never kept
    RecentStateCount.objects.filter(key="all").update(taken_at=db_now() - stats.RECENT_COUNT_MAX_AGE - timedelta(seconds=1))
    again = stats.runs_by_state()
    assert again.recent["ready"] == 2 and again.recent_as_of is None
    assert RecentStateCount.objects.get(key="all").counts["ready"] == 2


def test_a_kept_count_is_only_served_for_the_tenants_it_counted(schedule, other_schedule, monkeypatch):
    monkeypatch.setattr(stats, "RECENT_COUNT_SLOW_SECONDS", -1.0)
    make_run(schedule, RunState.READY)
    make_run(other_schedule, RunState.DEAD)
    mine = stats.runs_by_state(tenant_ids=[schedule.tenant_id])
    theirs = stats.runs_by_state(tenant_ids=[other_schedule.tenant_id])
    both = stats.runs_by_state(tenant_ids=[other_schedule.tenant_id, schedule.tenant_id])
    every = stats.runs_by_state()
    assert (mine.recent["ready"], mine.recent["dead"]) == (1, 0)
    assert (theirs.recent["ready"], theirs.recent["dead"]) == (0, 1)
    assert (both.recent["ready"], both.recent["dead"]) == (1, 1) == (every.recent["ready"], every.recent["dead"])
    assert RecentStateCount.objects.count() == 4
    # Served again from what was kept, each to its own set of tenants (in any order).
    assert stats.runs_by_state(tenant_ids=[schedule.tenant_id, other_schedule.tenant_id]).recent_as_of is not None
    assert stats.runs_by_state(tenant_ids=[schedule.tenant_id]).recent["dead"] == 0
