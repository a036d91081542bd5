"""The soak's ledger (bench/soak.py) reconciles each firing schedule's instants against the runs
made, a window at a time, once every instant of the window is made. Retention removes finished runs
once their partition is past it, which can come first when an instant of the window is made late
(a spike, the scanner behind): a reduced soak counted 8,921 runs lost that had been made, run and
removed. While a window's check is held back the ledger reads its finished runs ahead; a run read
then and removed by the check counts as read, not lost."""

import importlib.util
import sys
from datetime import timedelta

import pytest
from django.db import transaction

from dispatch.loops import drain, scan_step
from runs import queue
from runs.models import Run
from runs.store import store
from schedules.models import Schedule
from tests.helpers import make_due, make_schedule

pytestmark = pytest.mark.django_db(transaction=True)


def soak_module():
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "soak.py"
    spec = importlib.util.spec_from_file_location("bench_soak", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def finished_run(tenant, target):
    s = make_schedule(tenant, target.url + "/ledger")
    make_due(s)
    s = Schedule.objects.select_related("current").get(id=s.id)
    first = s.next_run_at
    drain(scan_step)
    (c,) = queue.claim("w-ledger", 10)
    queue.complete([queue.Result(claimed=c, outcome="succeeded", http_status=200)])
    return s, first, Run.objects.get(id=c.run_id)


def removed_by_retention(run):
    with transaction.atomic():
        store().history_delete_runs([run.id])


@pytest.mark.parametrize("read_ahead", [True, False], ids=["read-ahead", "not-read"])
def test_a_finished_run_removed_before_its_window_is_checked_was_made(tenant, target, read_ahead):
    Ledger = soak_module().Ledger
    s, first, run = finished_run(tenant, target)
    ledger = Ledger(first - timedelta(seconds=1), noisy="-", first_quiet=str(tenant.id))
    ledger.add([s], steady=True, starts={s.id: first})
    # Another set's versions are not read ahead (the soak's spikes: their own figures read them).
    ledger.skip_versions = [(s.current_id + 1, s.current_id + 1000)]
    until = first + timedelta(seconds=1)  # the window holding the one instant made
    if read_ahead:
        ledger.peek(until)
    removed_by_retention(run)
    ledger.check(until)
    assert ledger.expected == 1
    if read_ahead:
        assert (ledger.lost, ledger.removed_before_check, len(ledger.lag)) == (0, 1, 1)
    else:  # what the soak did before: a run made, run and removed, counted lost
        assert (ledger.lost, ledger.removed_before_check) == (1, 0)
