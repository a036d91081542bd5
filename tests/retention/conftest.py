"""Runs in every state, made through the real transitions (so the invariant checker stays clean),
and a retention pass seen from the future."""

from dataclasses import dataclass
from datetime import timedelta

import pytest

from dispatch.loops import drain, scan_step
from runs import queue, retention
from runs.actions import cancel_run
from runs.models import Run
from scheduler_project.foundation.dbclock import db_now
from tests.helpers import ACTOR, make_due, make_schedule


def one_run(tenant, target, path, *, to: str, **fields) -> Run:
    """A run of a new schedule of `tenant`, brought to state `to` (ready, leased, succeeded, dead,
    canceled, skipped) by the queue's own transitions."""
    s = make_schedule(tenant, target.url + path, **fields)
    if to == "skipped":
        # Missed an hour ago under the skip policy: the scanner records it as skipped.
        assert fields.get("misfire_policy") == "skip"
        make_due(s, db_now() - timedelta(hours=1))
    else:
        make_due(s)
    drain(scan_step)
    runs = Run.objects.filter(schedule=s).order_by("scheduled_time")
    run = runs.filter(state="skipped").first() if to == "skipped" else runs.last()
    if to in ("ready", "skipped", "canceled"):
        if to == "canceled":
            cancel_run(run, by=ACTOR)
        return Run.objects.get(id=run.id)
    (c,) = [c for c in queue.claim("w-retention", 50) if c.run_id == run.id]
    if to == "succeeded":
        queue.complete([queue.Result(claimed=c, outcome="succeeded", http_status=200)])
    elif to == "dead":
        queue.complete([queue.Result(claimed=c, outcome="failed", http_status=400, retryable=False)])
    return Run.objects.get(id=run.id)


@dataclass
class Pass:
    result: retention.PassResult
    passes: int


def run_retention(now, **kwargs) -> Pass:
    """Retention passes as the maintenance loop makes them, until nothing more is due."""
    total = retention.PassResult()
    for n in range(1, 50):
        res = retention.run_pass(now=now, kept_every=timedelta(0), **kwargs)
        total.swaps += res.swaps
        total.held_back += res.held_back
        for k, v in res.trimmed.items():
            total.trimmed[k] = total.trimmed.get(k, 0) + v
        if not res.more:
            return Pass(total, n)
    raise AssertionError("retention kept reporting more work")


@pytest.fixture
def later():
    """A moment 35 days from now: finished runs of today are past the default 14 days, dead ones
    past the default 30."""
    return db_now() + timedelta(days=35)
