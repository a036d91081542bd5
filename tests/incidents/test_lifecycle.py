"""The incident lifecycle end to end, with real runs, a real worker calling a local target and the
notification relay delivering to the owner's webhook on the same local sink."""

import json
from datetime import timedelta

import pytest

from dispatch import signing
from dispatch.incidents import IncidentEvaluator, acknowledge_incident, resolve_incident
from dispatch.loops import drain, reconcile_step, scan_step
from dispatch.models import Incident, IncidentPolicy, IncidentRule, Notification
from dispatch.notifications import NotificationRelay
from dispatch.worker import run_worker
from runs.models import Run, RunState
from scheduler_project.foundation.dbclock import db_now
from schedules.models import AuditEntry, Schedule
from schedules.owners import create_owner
from tests.helpers import ACTOR, make_due, make_schedule

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _no_settle(settings):
    settings.SCHEDULER_INCIDENT_SETTLE_SECONDS = 0


class World:
    def __init__(self, tenant, target):
        self.tenant, self.target = tenant, target
        self.failing = True
        target.responder = lambda d: ((500, b"{}") if self.failing else (200, b"{}")) if d["path"] == "/job" \
            else (204, b"")
        self.owner = create_owner(tenant, {"slug": "billing", "name": "Billing team",
                                           "webhook_url": target.url + "/hooks/billing"}, by=ACTOR)
        self.evaluator = IncidentEvaluator()
        self.evaluator.step()  # the cursor starts here: what follows is evaluated
        self.notify = NotificationRelay()

    def due(self, s):
        """Make the schedule's next run now, at an instant of its own (two make_due in one second
        would name the same occurrence, which exists already)."""
        self.instants = getattr(self, "instants", 0) + 1
        make_due(s, db_now() - timedelta(seconds=20) + timedelta(seconds=self.instants))
        drain(scan_step)

    def schedule(self, **fields):
        s = make_schedule(self.tenant, self.target.url + "/job", **fields)
        Schedule.objects.filter(id=s.id).update(owner=self.owner)
        return s

    def attempt(self):
        """One worker pass; retries waiting for their backoff are made due first."""
        Run.objects.filter(state=RunState.READY, generation__gt=0).update(next_eligible_at=db_now() - timedelta(seconds=1))
        run_worker("w-test", once=True, poll_seconds=0)
        self.evaluate()

    def evaluate(self):
        self.evaluator.step()
        while self.notify.step():
            pass

    def hooks(self):
        return [d for d in self.target.deliveries if d["path"] == "/hooks/billing"]

    def job_calls(self):
        return [d for d in self.target.deliveries if d["path"] == "/job"]


@pytest.fixture
def world(tenant, target):
    w = World(tenant, target)
    yield w
    w.notify.close()


def test_three_failures_open_one_incident_and_one_notification_and_a_success_resolves_it(world, tenant):
    s = world.schedule()
    world.due(s)
    for _ in range(2):
        world.attempt()
    assert not Incident.objects.exists() and world.hooks() == []

    world.attempt()  # the third failure in a row
    (inc,) = Incident.objects.all()
    assert (inc.rule, inc.state, inc.occurrences, inc.schedule_id, inc.owner_id) == (
        IncidentRule.CONSECUTIVE_FAILURES, "open", 3, s.id, world.owner.id)
    (hook,) = world.hooks()
    body = json.loads(hook["body"])
    assert body["kind"] == "incident.opened" and body["incident"]["id"] == inc.id
    assert body["incident"]["rule"] == "consecutive_failures" and body["incident"]["owner"] == "billing"
    assert hook["headers"]["Idempotency-Key"] == hook["headers"]["X-Scheduler-Event-Id"] == body["eventId"]
    assert signing.verify(tenant.signing_secret, hook["headers"][signing.HEADER], hook["body"])

    # Attempts 4 and 5: the run goes dead. Both add to the open incident, neither pages.
    world.attempt()
    world.attempt()
    assert Run.objects.get(schedule=s).state == RunState.DEAD
    assert len(world.job_calls()) == 5
    (inc,) = Incident.objects.all()
    assert inc.occurrences == 5 and inc.state == "open"
    assert len(world.hooks()) == 1

    # The next run succeeds: resolved by itself, one recovery notification.
    world.failing = False
    world.due(s)
    world.attempt()
    inc.refresh_from_db()
    assert inc.state == "resolved" and inc.resolved_by == "system:incidents"
    hooks = world.hooks()
    assert [json.loads(h["body"])["kind"] for h in hooks] == ["incident.opened", "incident.resolved"]
    assert len({h["headers"]["X-Scheduler-Event-Id"] for h in hooks}) == 2
    assert set(AuditEntry.objects.filter(object_type="incident").values_list("action", flat=True)) == {
        "incident.open", "incident.resolve"}
    # Nothing is sent again.
    world.evaluate()
    assert len(world.hooks()) == 2
    assert not Notification.objects.filter(published_at__isnull=True).exists()


def test_a_new_streak_after_recovery_opens_a_new_incident(world):
    s = world.schedule(max_attempts=1)
    IncidentPolicy.objects.create(tenant=world.tenant, schedule=s, rule=IncidentRule.CONSECUTIVE_FAILURES,
                                  threshold=2)
    # Every failure is a dead run here (one attempt each): only the streak rule is on.
    IncidentPolicy.objects.create(tenant=world.tenant, rule=IncidentRule.DEAD, enabled=False)
    for failing in (True, True, False, True, True):
        world.failing = failing
        world.due(s)
        world.attempt()
    incidents = list(Incident.objects.order_by("id"))
    assert [(i.state, i.rule) for i in incidents] == [("resolved", "consecutive_failures"),
                                                      ("open", "consecutive_failures")]
    assert [json.loads(h["body"])["kind"] for h in world.hooks()] == [
        "incident.opened", "incident.resolved", "incident.opened"]


def test_a_dead_run_opens_an_incident_when_the_streak_rule_is_off(world):
    s = world.schedule(max_attempts=1)
    IncidentPolicy.objects.create(tenant=world.tenant, rule=IncidentRule.CONSECUTIVE_FAILURES, enabled=False)
    world.due(s)
    world.attempt()
    (inc,) = Incident.objects.all()
    assert inc.rule == IncidentRule.DEAD and inc.occurrences == 1
    assert len(world.hooks()) == 1


def test_missed_start_fires_when_no_worker_runs_past_the_grace_and_resolves_when_they_run(world):
    world.failing = False
    s = world.schedule(misfire_grace_seconds=5)
    make_due(s, db_now() - timedelta(seconds=30))
    drain(scan_step)  # made, but no worker claims it
    world.evaluator.step(probe=True)
    (inc,) = Incident.objects.all()
    assert inc.rule == IncidentRule.MISSED_START and inc.state == "open"
    # The reconciler applies the misfire policy: the skip adds to the same incident.
    drain(reconcile_step)
    world.evaluate()
    assert Incident.objects.count() == 1
    while world.notify.step():
        pass
    assert [json.loads(h["body"])["kind"] for h in world.hooks()] == ["incident.opened"]

    # Workers are back: the schedule's next run starts and the incident resolves.
    world.due(s)
    world.attempt()
    inc.refresh_from_db()
    assert inc.state == "resolved"
    assert [json.loads(h["body"])["kind"] for h in world.hooks()] == ["incident.opened", "incident.resolved"]


def test_a_person_acknowledges_and_resolves_and_each_step_is_audited(world):
    s = world.schedule(max_attempts=1)
    IncidentPolicy.objects.create(tenant=world.tenant, rule=IncidentRule.CONSECUTIVE_FAILURES, threshold=1)
    world.due(s)
    world.attempt()
    inc = Incident.objects.get()
    acknowledge_incident(inc.id, tenant_id=world.tenant.id, by=ACTOR)
    world.due(s)
    world.attempt()  # still failing: adds to the acknowledged incident
    inc.refresh_from_db()
    assert inc.state == "acknowledged" and inc.occurrences == 2
    resolve_incident(inc.id, tenant_id=world.tenant.id, by=ACTOR)
    world.evaluate()
    actions = list(AuditEntry.objects.filter(object_type="incident").order_by("id").values_list("action", "actor"))
    assert actions == [("incident.open", "system:incidents"), ("incident.acknowledge", "user:tests"),
                       ("incident.resolve", "user:tests")]
    assert [json.loads(h["body"])["kind"] for h in world.hooks()] == ["incident.opened", "incident.resolved"]


def test_a_start_lag_above_the_threshold_opens_and_one_under_it_resolves(world):
    world.failing = False
    s = world.schedule()
    IncidentPolicy.objects.create(tenant=world.tenant, rule=IncidentRule.START_LAG, threshold=10)
    make_due(s, db_now() - timedelta(seconds=40))
    drain(scan_step)
    world.attempt()
    (inc,) = Incident.objects.all()
    assert inc.rule == IncidentRule.START_LAG
    make_due(s)
    drain(scan_step)
    world.attempt()
    inc.refresh_from_db()
    assert inc.state == "resolved"


def test_dlq_growth_opens_one_tenant_incident(world):
    s = world.schedule(max_attempts=1)
    IncidentPolicy.objects.create(tenant=world.tenant, rule=IncidentRule.DLQ_GROWTH, threshold=1)
    IncidentPolicy.objects.create(tenant=world.tenant, rule=IncidentRule.CONSECUTIVE_FAILURES, enabled=False)
    IncidentPolicy.objects.create(tenant=world.tenant, rule=IncidentRule.DEAD, enabled=False)
    world.tenant.default_owner = world.owner
    world.tenant.save(update_fields=["default_owner"])
    for _ in range(3):
        world.due(s)
        world.attempt()
    (inc,) = Incident.objects.all()
    assert inc.rule == IncidentRule.DLQ_GROWTH and inc.schedule_id is None and inc.occurrences == 3
    assert inc.owner_id == world.owner.id
    assert len(world.hooks()) == 1
