"""After real scanner, worker, reconciler and relay passes over a mix of outcomes, the audit finds
nothing; corrupt one row and the command says so and exits 1."""

import json
from io import StringIO

import pytest
from django.core.management import call_command

from dispatch import invariants
from dispatch.loops import drain, reconcile_step, scan_step
from dispatch.relay import Relay
from dispatch.worker import run_worker
from runs import queue
from runs.actions import cancel_run, retry_run
from runs.models import Run
from schedules.models import Schedule
from tests.helpers import ACTOR, expire_lease, make_due, make_schedule

pytestmark = pytest.mark.django_db(transaction=True)


def audit_command(*args):
    out = StringIO()
    try:
        call_command("audit", *args, stdout=out)
        code = 0
    except SystemExit as exc:
        code = exc.code
    return code, out.getvalue()


def test_a_full_cycle_leaves_no_violations(tenant, target):
    target.responder = lambda d: {"/ok": (200, b"{}"), "/flaky": (503, b""), "/bad": (400, b""), "/events": (204, b"")}[d["path"]]
    type(tenant).objects.filter(id=tenant.id).update(notification_url=target.url + "/events")
    # A worker that claimed a run and died: its lease runs out and the reconciler recovers it.
    lost = make_schedule(tenant, target.url + "/ok", name="lost")
    make_due(lost)
    drain(scan_step)
    lost_run = Run.objects.get(schedule=lost)
    (c,) = queue.claim("w-dead", 10)
    assert c.run_id == lost_run.id

    ok = make_schedule(tenant, target.url + "/ok")
    flaky = make_schedule(tenant, target.url + "/flaky")
    bad = make_schedule(tenant, target.url + "/bad")
    canceled = make_schedule(tenant, target.url + "/ok", name="canceled")
    for s in (ok, flaky, bad, canceled):
        make_due(s)
    drain(scan_step)
    cancel_run(Run.objects.get(schedule=canceled), by=ACTOR)
    run_worker("w-test", once=True, poll_seconds=0)
    expire_lease(lost_run.id)
    drain(reconcile_step)
    retry_run(Run.objects.get(schedule=bad), by=ACTOR)
    run_worker("w-test", once=True, poll_seconds=0)

    states = dict(Run.objects.values_list("schedule__name", "state"))
    flaky_run = Run.objects.get(schedule=flaky)
    assert Run.objects.get(schedule=ok).state == "succeeded"
    # Waiting to retry. Full jitter can make the backoff tiny, so the second worker pass may
    # already have tried it again: every attempt failed with the 503, none is open.
    assert flaky_run.state == "ready" and flaky_run.generation >= 1
    assert set(flaky_run.attempts.values_list("outcome", "http_status")) == {("failed", 503)}
    assert Run.objects.get(schedule=bad).state == "dead" and Run.objects.get(schedule=bad).generation == 2
    assert states["canceled"] == "canceled"
    assert Run.objects.get(id=lost_run.id).attempts.get(generation=1).outcome == "unknown"

    relay = Relay()
    try:
        drain(relay.step)
    finally:
        relay.close()
    assert len([d for d in target.deliveries if d["path"] == "/events"]) > 10

    assert invariants.run_all() == []
    code, out = audit_command()
    assert (code, out.strip()) == (0, "0 violations")


def test_the_command_lists_violations_and_exits_1(tenant, target):
    s = make_schedule(tenant, target.url + "/ok")
    make_due(s)
    drain(scan_step)
    run = Run.objects.get(schedule=s)
    Schedule.objects.filter(id=s.id).update(next_run_at=None)
    Run.objects.filter(id=run.id).update(generation=3)

    code, out = audit_command()
    assert code == 1
    assert "invariant 2 [error] attempt_generations: 1" in out and str(run.id) in out
    assert "invariant 7 [error] schedule_left_behind: 1" in out and str(s.id) in out
    assert out.strip().endswith("2 violations")

    code, out = audit_command("--json")
    assert code == 1
    got = json.loads(out)
    assert got["count"] == 2
    assert {(v["invariant"], v["check"], tuple(v["ids"])) for v in got["violations"]} == {
        (2, "attempt_generations", (str(run.id),)),
        (7, "schedule_left_behind", (str(s.id),)),
    }
