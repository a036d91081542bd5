"""The storage seam's contract: the same calls give the same results and the same return shapes on
both engines (this file runs in both passes of `python -m tests`; on PostgreSQL `store()` is the
single-statement PostgresStore, on SQLite the ORM's PortableStore)."""

from datetime import timedelta

import pytest
from django.db import transaction

from runs import decisions, queue
from runs.decisions import Claimed, Result
from runs.models import Attempt, Occurrence, OutboxEvent, Run
from runs.store import store
from runs.store.portable import PortableStore
from scheduler_project.foundation.dbclock import db_now
from schedules.services import SYSTEM
from schedules.tenants import set_notification_url
from tests.helpers import make_due, make_schedule

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_store_is_chosen_once_for_the_engine():
    from django.db import connection

    assert store() is store()
    assert isinstance(store(), PortableStore)
    assert (type(store()).__name__ == "PostgresStore") == (connection.vendor == "postgresql")


def made_triples(schedule, n=2):
    version = schedule.current
    now = db_now().replace(microsecond=0)
    occs = [decisions.manual_occurrence(version, now - timedelta(minutes=i)) for i in range(n)]
    return [decisions.build_run(schedule, version, o, state="ready", reason="", eligible_at=o.at, kind="scheduled",
                                now=now) for o in occs], now


def test_insert_runs_makes_each_occurrence_once_and_returns_the_ids_it_made(tenant, target):
    schedule = make_schedule(tenant, target.url + "/x")
    triples, now = made_triples(schedule)
    with transaction.atomic():
        made = store().run_insert_many(triples, stamp=now, now=now)
    assert made == {str(t[1].id) for t in triples} and all(isinstance(i, str) for i in made)
    again, _ = made_triples(schedule)  # the same instants, new ids
    with transaction.atomic():
        assert store().run_insert_many(again, stamp=now, now=now) == set()
    assert Run.objects.count() == Occurrence.objects.count() == 2
    created = OutboxEvent.objects.filter(kind="run.created")
    assert created.count() == 2
    # A tenant without a webhook has nobody to deliver to: its events are written published.
    assert all(e.published_at is not None for e in created)


def claim_one(tenant, target, *, webhook=False) -> Claimed:
    if webhook:
        set_notification_url(tenant, target.url + "/events", by=SYSTEM)
    make_due(make_schedule(tenant, target.url + "/job", max_attempts=3))
    queue.materialise_due(batch=10)
    with transaction.atomic():
        (c,) = store().run_claim_due(worker="w-1", limit=10, lease_seconds=30, shift=0, holding=queue.idle_holding())
    return c


def test_a_claim_leases_opens_the_attempt_and_returns_everything_the_call_needs(tenant, target):
    c = claim_one(tenant, target, webhook=True)
    run = Run.objects.get(id=c.run_id)
    assert (run.state, run.generation, run.attempts_used, run.lease_owner) == ("leased", 1, 1, "w-1")
    assert run.lease_until > db_now() + timedelta(seconds=20)
    assert (c.generation, c.attempts_used, c.max_attempts) == (1, 1, 3)
    assert Attempt.objects.get(id=c.attempt_id).generation == 1
    url, method, headers, timeout, payload = c.target
    assert url == target.url + "/job" and method == "POST" and isinstance(headers, str) and isinstance(payload, str)
    assert tuple(c.policy) == (1.0, 300.0, "allow")
    assert (c.run_text, c.schedule_text, c.scheduled_text) == (str(c.run_id), str(c.schedule_id),
                                                               decisions.iso(run.scheduled_time))
    leased = OutboxEvent.objects.get(run_id=c.run_id, kind="run.leased")
    assert leased.payload == {"runId": str(c.run_id), "generation": 1, "workerId": "w-1", "state": "leased"}
    assert leased.published_at is None  # this tenant has a webhook: the relay delivers it


def test_heartbeats_extend_only_leases_still_held(tenant, target):
    c = claim_one(tenant, target)
    with transaction.atomic():
        owned = store().run_extend_leases([(c.run_id, c.generation), (c.run_id, c.generation + 1)], worker="w-1",
                                          lease_seconds=60)
    assert owned == {(c.run_id, c.generation)}
    with transaction.atomic():
        assert store().run_extend_leases([(c.run_id, c.generation)], worker="w-other", lease_seconds=60) == set()


def test_complete_applies_a_held_result_and_keeps_a_fenced_one_as_evidence(tenant, target):
    c = claim_one(tenant, target)
    ok = decisions.Decided(Result(c, "succeeded", http_status=200, latency_ms=12, response_excerpt="ok"), "succeeded",
                           None)
    stale = Claimed(**{**c.__dict__, "generation": c.generation + 7})
    late = decisions.Decided(Result(stale, "failed", retryable=True, http_status=503, error="busy"), "ready", 1.0)
    with transaction.atomic():
        applied, now = store().run_complete([ok, late])
    assert applied == {(str(c.run_id), c.generation)}
    assert now is not None
    run = Run.objects.get(id=c.run_id)
    assert (run.state, run.last_error, run.lease_until) == ("succeeded", "", None) and run.finished_at is not None
    a = Attempt.objects.get(id=c.attempt_id)
    assert (a.outcome, a.http_status, a.latency_ms, a.response_excerpt) == ("succeeded", 200, 12, "ok")
    assert a.late_result["outcome"] == "failed" and a.late_result["httpStatus"] == 503 and "receivedAt" in a.late_result
    ev = OutboxEvent.objects.get(run_id=c.run_id, kind="run.succeeded")
    assert ev.payload == {"runId": str(c.run_id), "generation": 1, "state": "succeeded", "nextEligibleAt": None,
                          "outcome": "succeeded", "httpStatus": 200, "errorClass": None, "error": None, "latencyMs": 12}


def test_a_retryable_failure_sets_the_backoff_and_its_error(tenant, target):
    c = claim_one(tenant, target)
    d = decisions.Decided(Result(c, "failed", retryable=True, http_status=503), "ready", 30.0)
    with transaction.atomic():
        applied, now = store().run_complete([d])
    run = Run.objects.get(id=c.run_id)
    assert (run.state, run.last_error, run.finished_at) == ("ready", "HTTP 503", None)
    assert timedelta(seconds=29) < run.next_eligible_at - now < timedelta(seconds=31)
    assert OutboxEvent.objects.filter(run_id=c.run_id, kind="run.retry_scheduled").count() == 1


def test_release_unstarted_gives_runs_back_without_using_an_attempt(tenant, target):
    c = claim_one(tenant, target)
    with transaction.atomic():
        released = store().run_release_unstarted([c], now=db_now())
    assert [r.run_id for r in released] == [c.run_id]
    run = Run.objects.get(id=c.run_id)
    assert (run.state, run.attempts_used, run.generation) == ("ready", 0, 1)
    assert Attempt.objects.get(id=c.attempt_id).outcome == "abandoned"
    with transaction.atomic():
        assert store().run_release_unstarted([c], now=db_now()) == []  # no longer held: fenced


def test_cancel_unstarted_and_skip_unclaimed_write_their_events(tenant, target):
    schedule = make_schedule(tenant, target.url + "/x")
    triples, now = made_triples(schedule, n=3)
    with transaction.atomic():
        store().run_insert_many(triples, stamp=now, now=now)
    ids = [t[1].id for t in triples]
    with transaction.atomic():
        assert store().run_skip_unclaimed(ids[:1], now=now, reason="misfire") == 1
    with transaction.atomic():
        assert store().run_cancel_unstarted(schedule.id, now=now, reason="paused") == 2
    states = dict(Run.objects.values_list("id", "state"))
    assert [states[i] for i in ids] == ["skipped", "canceled", "canceled"]
    assert OutboxEvent.objects.filter(kind="run.skipped").count() == 1
    assert OutboxEvent.objects.filter(kind="run.canceled", payload__reason="paused").count() == 2


def test_insert_schedule_stores_the_three_rows_as_the_instances_hold_them(tenant, target):
    """A new schedule's version, schedule and audit entry (one round trip on PostgreSQL, three
    saves on SQLite): the stored rows equal the instances afterwards, and the version's new id is
    both on the version and the schedule's current version."""
    from runs.actions import create_schedule
    from schedules.models import AuditEntry, Schedule, ScheduleVersion

    now = db_now()
    made = create_schedule(tenant, {"name": "contract", "expression": "0 3 * * *", "time_zone": "Europe/Paris",
                                    "target_url": target.url + "/x", "payload": {"k": [1, "é"]}},
                           by=SYSTEM, now=now)
    version = made.current
    assert version.id is not None and made.current_id == version.id
    stored = Schedule.objects.select_related("current").get(id=made.id)
    for field in Schedule._meta.concrete_fields:
        assert getattr(stored, field.attname) == getattr(made, field.attname), field.name
    for field in ScheduleVersion._meta.concrete_fields:
        assert getattr(stored.current, field.attname) == getattr(version, field.attname), field.name
    assert stored.current.payload == {"k": [1, "é"]} and stored.current.schedule_id == made.id
    entry = AuditEntry.objects.get(object_id=str(made.id))
    assert (entry.action, entry.tenant_id, entry.actor) == ("schedule.create", tenant.id, SYSTEM.name)
    assert entry.after["name"] == "contract" and entry.after["payload"] == {"k": [1, "é"]}
    # A second one takes the next version id: the schedule points at its own version, not the last.
    other = create_schedule(tenant, {"name": "second", "expression": "0 4 * * *", "time_zone": "UTC",
                                     "target_url": target.url + "/y"}, by=SYSTEM, now=now)
    assert Schedule.objects.get(id=other.id).current.name == "second"
    assert Schedule.objects.get(id=made.id).current.name == "contract"


def test_insert_schedule_is_all_or_nothing_without_a_transaction_of_the_callers(tenant, target):
    """create_schedule opens no transaction when no quota applies: the three inserts must then be
    atomic by themselves. The audit entry fails here (an actor longer than its column on
    PostgreSQL; SQLite does not check lengths, so a foreign key to no tenant there), after the
    version and the schedule were sent: neither may remain."""
    from django.db import connection

    from runs.actions import _created_entry, _new_schedule
    from schedules.models import AuditEntry, Schedule, ScheduleVersion
    from schedules.services import VERSIONED_DEFAULTS, validate_fields

    assert connection.get_autocommit()
    now = db_now()
    fields = {**VERSIONED_DEFAULTS, "name": "atomic", "expression": "0 3 * * *", "time_zone": "UTC",
              "target_url": target.url + "/x"}
    rule = validate_fields(tenant, fields, now=now, quotas=False)
    schedule, version = _new_schedule(tenant, fields, rule, by=SYSTEM, enabled=True, now=now)
    entry = _created_entry(schedule, fields, tenant=tenant, by=SYSTEM)
    if connection.vendor == "postgresql":
        entry.actor = "x" * 500
    else:
        entry.tenant_id = "00000000-0000-0000-0000-000000000000"
    with pytest.raises(Exception):
        store().schedule_insert(schedule, version, entry)
    assert not Schedule.objects.filter(id=schedule.id).exists()
    assert not ScheduleVersion.objects.filter(schedule_id=schedule.id).exists()
    assert not AuditEntry.objects.filter(object_id=str(schedule.id)).exists()


def test_with_history_reads_each_runs_occurrence_and_attempts(tenant, target):
    """Two queries for any number of runs, by id and scheduled time; a run whose occurrence's time
    does not match its own (never made by the scheduler) still gets its occurrence, by id."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from runs.actions import trigger_schedule
    from runs.models import Occurrence, with_history

    schedule = make_schedule(tenant, target.url + "/x")
    runs = [trigger_schedule(schedule, by=SYSTEM) for _ in range(3)]
    Attempt.objects.create(run=runs[0], generation=1, worker_id="w:1", started_at=db_now())
    fresh = list(Run.objects.filter(id__in=[r.id for r in runs]))
    with CaptureQueriesContext(connection) as ctx:
        with_history(fresh)
        assert all(r.occurrence.id == r.occurrence_id and r.occurrence.scheduled_time == r.scheduled_time
                   for r in fresh)
    assert len(ctx.captured_queries) == 2
    by_id = {r.id: r for r in fresh}
    assert [a.generation for a in by_id[runs[0].id].attempt_list] == [1]
    assert by_id[runs[1].id].attempt_list == []
    stray = runs[2]
    Occurrence.objects.filter(id=stray.occurrence_id).update(scheduled_time=stray.scheduled_time - timedelta(hours=1))
    (again,) = with_history([Run.objects.get(id=stray.id)])
    assert again.occurrence.id == stray.occurrence_id


def test_keep_recent_count_inserts_then_replaces_the_row_of_its_key():
    from runs.models import RecentStateCount

    t0 = db_now()
    assert store().counter_keep_recent("k", taken_at=t0, counts={"ready": 1})
    assert store().counter_keep_recent("k", taken_at=t0 + timedelta(seconds=1), counts={"ready": 2})
    assert store().counter_keep_recent("other", taken_at=t0, counts={"dead": 3})
    rows = {r.key: (r.taken_at, r.counts) for r in RecentStateCount.objects.all()}
    assert rows == {"k": (t0 + timedelta(seconds=1), {"ready": 2}), "other": (t0, {"dead": 3})}


def test_keeping_a_count_never_waits_for_another_writer():
    """A page or a scrape keeps the count on its way; it must not hang on another writer. SQLite:
    another connection holding the file's write lock means not kept, at once, and the connection's
    own busy wait is as before. PostgreSQL: locks are per row, and another writer's row is no
    obstacle."""
    import sqlite3
    import time

    import psycopg
    from django.db import connection

    from runs.models import RecentStateCount

    connection.ensure_connection()
    if connection.vendor == "sqlite":
        with connection.cursor() as cur:
            cur.execute("PRAGMA busy_timeout")
            (wait_ms,) = cur.fetchone()
        assert wait_ms >= 5000  # the configured wait, which this save must not take
        other = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        started = time.monotonic()
        kept = store().counter_keep_recent("k", taken_at=db_now(), counts={"ready": 1})
        waited = time.monotonic() - started
        other.execute("COMMIT")
        other.close()
        assert kept is False and waited < wait_ms / 1000 / 2
        with connection.cursor() as cur:
            cur.execute("PRAGMA busy_timeout")
            assert cur.fetchone()[0] == wait_ms
        assert not RecentStateCount.objects.exists()
    else:
        store().counter_keep_recent("theirs", taken_at=db_now(), counts={})
        with psycopg.connect(**connection.get_connection_params()) as other:
            other.execute("SELECT 1 FROM runs_recentstatecount WHERE key = 'theirs' FOR UPDATE")
            kept = store().counter_keep_recent("k", taken_at=db_now(), counts={"ready": 1})
        assert kept is True
    assert store().counter_keep_recent("k", taken_at=db_now(), counts={"ready": 1})
    assert RecentStateCount.objects.get(key="k").counts == {"ready": 1}


# --- the changes people and clients ask for (runs.store.requested.RequestedChanges) ------------


def test_cancel_run_closes_a_leased_runs_open_attempt_and_retry_run_makes_it_ready(tenant, target):
    c = claim_one(tenant, target)
    run = Run.objects.get(id=c.run_id)
    now = db_now()
    with transaction.atomic():
        store().run_set_canceled(run, reason="canceled", by="ops@example", now=now)
    stored = Run.objects.get(id=c.run_id)
    assert (stored.state, stored.reason, stored.lease_until, stored.lease_owner, stored.next_eligible_at,
            stored.finished_at) == ("canceled", "canceled", None, "", None, now)
    a = Attempt.objects.get(id=c.attempt_id)
    assert (a.outcome, a.finished_at, a.canceled_in_flight, a.error_class) == ("abandoned", now, True, "Canceled")
    assert "ops@example" in a.error
    later = db_now()
    with transaction.atomic():
        store().run_set_retried(stored, by="ops@example", now=later)
    again = Run.objects.get(id=c.run_id)
    assert (again.state, again.reason, again.next_eligible_at, again.finished_at, again.attempts_used,
            again.retried_by, again.retried_at, again.generation) == ("ready", "", later, None, 0, "ops@example",
                                                                      later, 1)
    # The row and the instance agree (the caller returns the instance).
    assert (stored.state, stored.retried_at) == (again.state, again.retried_at)


def test_cancel_run_of_a_ready_run_touches_no_attempt(tenant, target):
    schedule = make_schedule(tenant, target.url + "/x")
    triples, now = made_triples(schedule, n=1)
    with transaction.atomic():
        store().run_insert_many(triples, stamp=now, now=now)
    run = Run.objects.get(id=triples[0][1].id)
    with transaction.atomic():
        store().run_set_canceled(run, reason="canceled", by="ops", now=now)
    assert Run.objects.get(id=run.id).state == "canceled" and not Attempt.objects.filter(run_id=run.id).exists()


def test_pause_resume_and_archive_write_the_schedule_row(tenant, target):
    from schedules.models import Schedule

    schedule = make_schedule(tenant, target.url + "/x")
    now = db_now()
    with transaction.atomic():
        store().schedule_set_paused(schedule, now=now)
    stored = Schedule.objects.get(id=schedule.id)
    assert (stored.enabled, stored.paused_at, stored.next_run_at) == (False, now, None)
    next_at = now + timedelta(minutes=1)
    with transaction.atomic():
        store().schedule_set_resumed(stored, next_run_at=next_at, completed_at=now)
    stored = Schedule.objects.get(id=schedule.id)
    assert (stored.enabled, stored.paused_at, stored.next_run_at, stored.status) == (True, None, next_at, "active")
    # An active schedule with no next instant left is completed as it resumes.
    with transaction.atomic():
        store().schedule_set_resumed(stored, next_run_at=None, completed_at=now)
    stored = Schedule.objects.get(id=schedule.id)
    assert (stored.status, stored.completed_at, stored.next_run_at) == ("completed", now, None)
    with transaction.atomic():
        store().schedule_set_archived(stored, now=now)
    stored = Schedule.objects.get(id=schedule.id)
    assert (stored.status, stored.archived_at, stored.next_run_at) == ("archived", now, None)


def test_insert_version_points_the_schedule_at_its_new_version(tenant, target):
    from schedules.models import Owner, Schedule, ScheduleVersion

    schedule = make_schedule(tenant, target.url + "/x")
    first = schedule.current
    version = ScheduleVersion(**{f.attname: getattr(first, f.attname) for f in ScheduleVersion._meta.concrete_fields
                                 if f.attname != "id"})
    version.version, version.changes, version.expression = 2, {"expression": ["x", "y"]}, "0 5 * * *"
    schedule.name = "renamed"
    with transaction.atomic():
        store().version_insert(schedule, version)
    stored = Schedule.objects.select_related("current").get(id=schedule.id)
    assert (stored.version, stored.current_id, stored.current.expression, stored.name) == (
        2, version.id, "0 5 * * *", "renamed")
    assert ScheduleVersion.objects.filter(schedule_id=schedule.id).count() == 2
    owner = Owner.objects.create(tenant=tenant, slug="team-a", name="Team A")
    with transaction.atomic():
        store().schedule_set_owner(schedule.id, owner.id)
        store().schedule_set_managed_name(schedule.id, "nightly")
    stored = Schedule.objects.get(id=schedule.id)
    assert (stored.owner_id, stored.managed_name) == (owner.id, "nightly")


@pytest.mark.parametrize("capped", [False, True], ids=["no caps", "caps in play"])
def test_a_run_is_not_claimed_before_its_scheduled_time_though_it_is_eligible(tenant, target, capped):
    # Eligibility never comes before the instant (the scanner makes a run eligible at its instant
    # or a spread offset later); a run set eligible earlier waits for its instant. PostgreSQL's
    # claim statements rely on it to leave the partitions made ahead of now out of their plans.
    if capped:
        type(tenant).objects.filter(id=tenant.id).update(max_in_flight=5)
    queue._limits.loaded_at = -1e9
    make_due(make_schedule(tenant, target.url + "/job"))
    queue.materialise_due(batch=10)
    now = db_now()
    Run.objects.update(scheduled_time=now + timedelta(minutes=5), next_eligible_at=now - timedelta(minutes=5))
    assert queue.claim("w-1", 10) == []
    Run.objects.update(scheduled_time=now - timedelta(seconds=1))
    (c,) = queue.claim("w-1", 10)
    assert c.scheduled_time == now - timedelta(seconds=1)


def test_the_earliest_ready_run_is_found_within_the_time_asked_and_only_then(tenant, target):
    make_due(make_schedule(tenant, target.url + "/job"))
    queue.materialise_due(batch=10)
    now = db_now()
    Run.objects.update(scheduled_time=now + timedelta(seconds=30), next_eligible_at=now + timedelta(seconds=30))
    assert 0 < queue.seconds_until_next_ready(60) <= 30
    assert queue.seconds_until_next_ready(10) is None
    Run.objects.update(next_eligible_at=now + timedelta(seconds=45))  # a spread offset after its instant
    assert 30 < queue.seconds_until_next_ready(60) <= 45


def test_a_scanner_pass_begins_with_the_databases_clock_and_steps_aside_only_for_partition_ddl(tenant, target):
    from django.db import connection

    from tests.helpers import at_once

    s = make_schedule(tenant, target.url + "/gated")
    make_due(s)
    with transaction.atomic():
        now, admitted = store().schedule_scan_begin()
    assert admitted and abs((db_now() - now).total_seconds()) < 60
    if connection.vendor == "postgresql":
        # Partition DDL holding the scanner's gate (runs.partitions): a pass makes nothing meanwhile,
        # and the next one after it does.
        from runs import partitions

        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(partitions.GATE_CLOSE_SQL, {"gate": partitions.SCAN_GATE})
            (gated,) = at_once(lambda: queue.materialise_due(batch=10), 1)
        assert gated.stepped_aside and gated.runs == 0 and not Run.objects.filter(schedule=s).exists()
        # The scanner's step says more is due (a `scan --once` drain goes on after the DDL).
        from dispatch.loops import scan_step

        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(partitions.GATE_CLOSE_SQL, {"gate": partitions.SCAN_GATE})
            assert at_once(scan_step, 1) == [True]
        assert not Run.objects.filter(schedule=s).exists()
    made = queue.materialise_due(batch=10)
    assert not made.stepped_aside and made.runs == 1 and Run.objects.filter(schedule=s).count() == 1
