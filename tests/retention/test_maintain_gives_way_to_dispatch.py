"""`maintain` beside the hot paths, on real connections: a scanner pass, a worker's claim and
completion, and a reader of runs, each stopped while it holds its locks, with a partition removal
(detach, attach, drop) coming in between.

The soak (bench/soak.py) had scanner passes and web requests fail with `deadlock detected`, and
maintenance steps fail with lock timeouts: the removal locked the runs tables, then, at its
ATTACH and DROP, the tables the partitions' foreign keys point at (schedules, versions, tenants),
while the scanner holds its schedules and then reads runs. Maintenance now takes every lock it
needs first, the referenced tables before the runs tables, and gives way when they are not granted
in time (runs.partitions, "Lock order"). Here: the hot path finishes as if maintenance were not
there, maintenance never waits for a lock while holding one later in that order, no step fails,
and a later step removes the partition once."""

import logging
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction

from dispatch.loops import drain, scan_step
from dispatch.maintenance import Maintenance
from dispatch.models import IncidentCursor
from runs import partitions, queue, retention
from runs.history_settings import get as history_setting
from runs.models import HistoryRemoval, Occurrence, OutboxEvent, Run
from runs.store import store
from tests.helpers import make_due, make_schedule
from tests.partitions.test_sealed_partitions import backfilled_long_ago
from tests.retention.test_removal import history_violations, present

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgresql_only("the partition DDL and its locks exist only on PostgreSQL"),
]

# The one order maintenance takes its locks in: the referenced tables, then the runs tables.
ORDER = partitions.REFERENCED + partitions.GROUPS[partitions.Group.RUNS]
WAIT = 60.0


@pytest.fixture(autouse=True)
def kept_partition_due(monkeypatch):
    # Every pass may rewrite the kept partition (not once a partition width), so the removal is due.
    monkeypatch.setattr(retention, "due_partitions",
                        lambda now, p=None, kept_every=None, f=retention.due_partitions: f(now, p, kept_every=timedelta(0)))


class Hold:
    """Where the hot path stops: `stop()` in its own code, or a method of the store's class wrapped
    so that in the hot path's thread it stops before the real statement or after it. Says so, and
    waits for `go`."""

    def __init__(self, monkeypatch=None, name: str | None = None, *, after: bool = False):
        self.holding, self.go = threading.Event(), threading.Event()
        self.thread = None
        if name is None:
            return
        real = getattr(type(store()), name)

        def held(this, *args, **kwargs):
            if threading.current_thread() is not self.thread:
                return real(this, *args, **kwargs)
            if not after:
                self.stop()
            out = real(this, *args, **kwargs)
            if after:
                self.stop()
            return out

        monkeypatch.setattr(type(store()), name, held)

    def stop(self):
        self.holding.set()
        assert self.go.wait(WAIT), "the test never let the hot path go on"


class Thread(threading.Thread):
    """A thread with its own database connection that keeps what its function returned or raised."""

    def __init__(self, fn):
        super().__init__(daemon=True)
        self.fn, self.result, self.error, self.pid = fn, None, None, None
        self.ready = threading.Event()

    def run(self):
        try:
            connection.ensure_connection()
            self.pid = connection.connection.info.backend_pid
            self.ready.set()
            self.result = self.fn()
        except BaseException as exc:  # kept for the assertion
            self.error = exc
        finally:
            self.ready.set()
            connection.close()


def waits_of(pid) -> tuple:
    """(relation it waits for, relations it holds in ACCESS EXCLUSIVE mode) of one backend."""
    with connection.cursor() as cur:
        cur.execute("""SELECT c.relname, l.granted, l.mode FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
                       WHERE l.pid = %s AND l.locktype = 'relation'""", [pid])
        rows = cur.fetchall()
    waiting = next((r for r, granted, _ in rows if not granted), None)
    return waiting, {r for r, granted, mode in rows if granted and mode == "AccessExclusiveLock"}


def backends() -> list:
    """Every other backend of this database: what it runs and waits for (a failure's evidence)."""
    with connection.cursor() as cur:
        cur.execute("""SELECT pid, state, wait_event_type, wait_event, left(query, 120) FROM pg_stat_activity
                       WHERE datname = current_database() AND pid <> pg_backend_pid()""")
        return cur.fetchall()


def maintain_beside(hot: Thread, hold: Hold) -> list:
    """Start the hot path and let it stop holding its locks; run one maintenance step beside it
    until that step waits for a lock (or ends); let the hot path go on. Returns what maintenance
    was seen waiting for, with what it held then."""
    hold.thread = hot
    hot.start()
    assert hold.holding.wait(WAIT), (f"the hot path did not get to its locks: {hot.error!r}, alive "
                                     f"{hot.is_alive()}, waiting for {waits_of(hot.pid)[0]!r}; {backends()}")
    maint = Thread(lambda: Maintenance().step())
    maint.start()
    assert maint.ready.wait(WAIT)
    seen = []
    deadline = time.monotonic() + WAIT
    while maint.is_alive() and time.monotonic() < deadline:
        waiting, held = waits_of(maint.pid)
        if waiting in ORDER:
            seen.append((waiting, held & set(ORDER)))
            break
        time.sleep(0.005)
    hold.go.set()
    for t in (hot, maint):
        t.join(WAIT)
        assert not t.is_alive()
    assert hot.error is None, f"the hot path failed beside maintenance: {hot.error!r}"
    assert maint.error is None, f"the maintenance step failed instead of giving way: {maint.error!r}"
    return seen


def removal_done_by_later_steps() -> int:
    """Maintenance steps as the loop makes them (a busy one is tried again) until the kept
    partition has been rewritten; returns how many steps it took."""
    for n in range(1, 21):
        drain(Maintenance().step)
        if HistoryRemoval.objects.filter(what__startswith="runs_run").exists():
            return n
        time.sleep(0.2)
    raise AssertionError("maintenance never removed the partition")


@pytest.fixture
def history(tenant, target):
    """A finished run 40 days old (removed by the rewrite of the kept partition) and a dead one
    (kept)."""
    gone = backfilled_long_ago(tenant, target)
    (c,) = [c for c in queue.claim("w-old", 100) if c.run_id == gone.id]
    queue.complete([queue.Result(claimed=c, outcome="succeeded", http_status=200)])
    dead = backfilled_long_ago(tenant, target)
    (c,) = [c for c in queue.claim("w-old", 100) if c.run_id == dead.id]
    queue.complete([queue.Result(claimed=c, outcome="failed", http_status=400)])
    return gone, dead


def check_after(history, seen):
    for waiting, held in seen:
        later = {h for h in held if ORDER.index(h) >= ORDER.index(waiting)}
        assert not later, f"maintenance waited for {waiting} while holding {sorted(held)}"
    removal_done_by_later_steps()
    gone, dead = history
    assert present(gone, dead) == {gone.id: False, dead.id: True}
    assert HistoryRemoval.objects.filter(what__startswith="runs_run").count() == 1
    assert history_violations() == []


def test_a_scanner_pass_holding_its_schedules_is_not_deadlocked_by_a_removal(tenant, target, history, monkeypatch):
    # The scanner locks its due schedules, then reads their runs (overlap policies) and makes the
    # new ones: stopped in between.
    s = make_schedule(tenant, target.url + "/due")
    make_due(s)
    hold = Hold(monkeypatch, "run_active_per_schedule", after=False)
    seen = maintain_beside(Thread(lambda: drain(scan_step)), hold)
    assert Run.objects.filter(schedule=s).count() == 1
    check_after(history, seen)


def test_a_completion_holding_its_runs_is_not_deadlocked_by_a_removal(tenant, target, history, monkeypatch):
    # The worker's completion has applied its results (runs, attempts, events, tenants read) and
    # has not committed yet.
    s = make_schedule(tenant, target.url + "/done")
    make_due(s)
    drain(scan_step)
    (c,) = [c for c in queue.claim("w-1", 100) if c.schedule_id == s.id]
    hold = Hold(monkeypatch, "run_complete", after=True)
    seen = maintain_beside(Thread(lambda: queue.complete([queue.Result(claimed=c, outcome="succeeded",
                                                                       http_status=200)])), hold)
    assert Run.objects.get(id=c.run_id).state == "succeeded"
    check_after(history, seen)


def test_a_reader_of_runs_then_their_occurrences_is_not_deadlocked_by_a_removal(tenant, target, history):
    # A report read in one transaction: the runs with their schedules, then their occurrences.
    s = make_schedule(tenant, target.url + "/read")
    make_due(s)
    drain(scan_step)
    hold = Hold()

    def read():
        with transaction.atomic():
            runs = list(Run.objects.filter(schedule=s).select_related("schedule"))
            hold.stop()  # holding what it has read
            return runs, list(Occurrence.objects.filter(id__in=[r.occurrence_id for r in runs]))

    hot = Thread(read)
    seen = maintain_beside(hot, hold)
    runs, occurrences = hot.result
    assert len(runs) == len(occurrences) == 1
    check_after(history, seen)


def test_its_lock_timeout_stays_below_half_the_servers_deadlock_timeout(settings):
    # Longer, and a hot path waiting on maintenance in a cycle would run its deadlock check first
    # and be the one rolled back.
    with connection.cursor() as cur:
        cur.execute("SELECT extract(epoch FROM current_setting('deadlock_timeout')::interval) * 1000")
        half = int(cur.fetchone()[0] / 2)
    for asked, got in ((half * 10, half), (half // 2, half // 2)):
        settings.SCHEDULER_PARTITION_LOCK_TIMEOUT_MS = asked
        with partitions.ddl(None) as cur:
            cur.execute("SELECT current_setting('lock_timeout')")
            assert cur.fetchone()[0] == f"{got}ms"


def test_a_step_that_gives_way_says_who_held_the_tables(tenant, target, history, caplog):
    # An operator whose history keeps growing reads in the `maintain` log what it gave way to.
    hold = Hold()

    def read():
        with transaction.atomic():
            with connection.cursor() as cur:
                cur.execute("SET LOCAL application_name = 'month-end-report'")
            list(Run.objects.all()[:1])
            hold.stop()  # holding runs_run, idle in its transaction

    hot = Thread(read)
    hold.thread = hot
    hot.start()
    assert hold.holding.wait(WAIT)
    try:
        with caplog.at_level(logging.INFO, logger="scheduler.maintain"):
            step = Maintenance()
            for _ in range(5):  # a first step may only make what it makes ahead
                step.step()
                if step.busy:
                    break
    finally:
        hold.go.set()
        hot.join(WAIT)
    assert hot.error is None
    assert step.busy, (step.last, caplog.text)
    said = [r.getMessage() for r in caplog.records if "the tables were busy" in r.getMessage()]
    assert len(said) == 1 and "month-end-report for " in said[0] and "idle in transaction" in said[0], said
    assert "SELECT" in said[0]  # its last statement
    removal_done_by_later_steps()  # and once it has gone, the removal is made
    gone, dead = history
    assert present(gone, dead) == {gone.id: False, dead.id: True}


def test_an_incidents_pass_holds_nothing_maintenance_needs_while_it_evaluates(tenant, target, monkeypatch, settings):
    # The soak's `maintain` gave way mostly to the incidents loop: its pass read the runs, schedules
    # and tenants inside the transaction in which it then evaluated thousands of events (seconds
    # on a busy host). Now those reads are a transaction of their own, ended before the evaluation.
    from dispatch import incidents

    settings.SCHEDULER_INCIDENT_SETTLE_SECONDS = 0
    incidents.IncidentEvaluator().step(probe=False)  # the cursor, which starts at the outbox's end
    s = make_schedule(tenant, target.url + "/evaluated")
    make_due(s)
    drain(scan_step)
    (c,) = queue.claim("w-1", 10)
    queue.complete([queue.Result(claimed=c, outcome="succeeded", http_status=200)])
    hold = Hold()
    real = incidents.apply_events

    def evaluating(*args):
        out = real(*args)
        if threading.current_thread() is hold.thread:
            hold.stop()  # in the middle of the pass: its events evaluated, nothing written yet
        return out

    monkeypatch.setattr(incidents, "apply_events", evaluating)
    hot = Thread(lambda: incidents.IncidentEvaluator().step(probe=True))
    hold.thread = hot
    removal_locks_granted_while_held(hot, hold)
    # And the pass went on to its end.
    assert IncidentCursor.objects.get(id=1).watermark == OutboxEvent.objects.order_by("-id").values_list("id", flat=True)[0]


def test_an_activity_pass_holds_nothing_maintenance_needs_while_it_folds(tenant, target, monkeypatch):
    # After the incidents loop's split, the soak's `maintain` gave way mostly to the activity loop:
    # its pass read the attempts (and their runs) inside the transaction in which it then folded
    # them into the portal's rows. Now those reads end before the pass's transaction begins.
    from dispatch import activity, activity_store
    from dispatch.models import ActivityCursor, ScheduleActivity

    activity.ActivityAggregator(settle=timedelta(0)).step()  # the cursor, which starts at the attempts' end
    s = make_schedule(tenant, target.url + "/folded")
    make_due(s)
    drain(scan_step)
    (c,) = queue.claim("w-1", 10)
    queue.complete([queue.Result(claimed=c, outcome="succeeded", http_status=200)])
    hold = Hold()
    real = activity_store.add_schedule_batches

    def folding(batches):
        if threading.current_thread() is hold.thread:
            hold.stop()  # in the middle of the fold: the cursor locked, the summaries not yet written
        return real(batches)

    monkeypatch.setattr(activity_store, "add_schedule_batches", folding)
    hot = Thread(lambda: activity.ActivityAggregator(settle=timedelta(0)).step())
    hold.thread = hot
    removal_locks_granted_while_held(hot, hold)
    # And the pass went on to its end.
    assert ScheduleActivity.objects.get(schedule_id=s.id).succeeded == 1
    assert ActivityCursor.objects.get(id=1).watermark >= c.attempt_id


def removal_locks_granted_while_held(hot: Thread, hold: Hold) -> None:
    """Starts `hot`; once it stops at `hold`, takes what a removal takes first (every table, under
    a short lock timeout: it raises if any is held), then lets the hot path finish."""
    hot.start()
    try:
        assert hold.holding.wait(WAIT), hot.error
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute("SET LOCAL lock_timeout = '2s'")
            cur.execute(f"LOCK TABLE {', '.join(ORDER)} IN ACCESS EXCLUSIVE MODE")
    finally:
        hold.go.set()
        hot.join(WAIT)
    assert hot.error is None, hot.error


def test_a_removal_gets_past_scanner_passes_that_follow_each_other_with_no_gap(tenant, target, history, monkeypatch):
    # The soak's `maintain` gave way to the scanner pass after pass: on a loaded host a pass holds
    # its schedules longer than maintenance's lock timeout (while it plans them), and three
    # scanners' passes overlap, so there was always one in progress. Here each pass holds its
    # locks longer than that timeout; with the scanner's gate (runs.partitions) the removal waits
    # for the passes in progress while new ones step aside: no step gives way.
    from dispatch.loops import Scanner

    s = make_schedule(tenant, target.url + "/scanned")
    make_due(s)
    hold = history_setting("SCHEDULER_PARTITION_LOCK_TIMEOUT_MS") / 1000 * 3
    scanners, stop = set(), threading.Event()
    real = type(store()).schedule_lock_due

    def slow(this, *args, **kwargs):
        out = real(this, *args, **kwargs)
        if threading.current_thread() in scanners:
            time.sleep(hold)  # planning, its schedules locked
        return out

    monkeypatch.setattr(type(store()), "schedule_lock_due", slow)
    passes = []

    def scan():
        # As under a load that keeps every scanner busy: one pass after another (a pass that
        # stepped aside waits a moment itself).
        scanner = Scanner()
        while not stop.is_set():
            scanner.step()
            passes.append(scanner.stepped_aside)

    threads = [Thread(scan) for _ in range(3)]
    scanners.update(threads)
    for t in threads:
        t.start()
        time.sleep(hold / 3)  # out of phase: one pass or more in progress at every moment
    try:
        steps = []
        for _ in range(3):
            step = Maintenance()
            drain(step.step)
            steps.append(step.busy)
            if HistoryRemoval.objects.filter(what__startswith="runs_run").exists():
                break
    finally:
        stop.set()
        for t in threads:
            t.join(WAIT)
    assert all(t.error is None for t in threads), [t.error for t in threads]
    assert not any(steps), f"maintenance gave way to the scanners: {steps}"
    assert any(passes) and not all(passes)  # some passes stepped aside, and the others went on
    gone, dead = history
    assert present(gone, dead) == {gone.id: False, dead.id: True}
    assert Run.objects.filter(schedule=s).count() == 1
    assert history_violations() == []
