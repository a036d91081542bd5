"""The fault-injection suite, short form (CI): real scan/work/reconcile subprocesses under
SIGKILL, terminated database sessions and a skewed worker clock, over 2,000+ runs from 50
schedules. The long form is `python bench/faults_long.py`."""

import os

import pytest

from tests.faults.harness import run_chaos

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]


def test_nothing_is_lost_duplicated_or_applied_stale_under_chaos(capsys):
    report = run_chaos(
        duration=float(os.environ.get("FAULTS_SECONDS", "20")),
        seed=int(os.environ.get("FAULTS_SEED", "7")),
        schedules=50,
        backlog_minutes=41,  # 50 x 41 = 2,050 runs before the clock adds more
    )
    with capsys.disabled():
        print("\n" + report.line())
        for d in report.details:
            print("  " + d)
    assert report.runs >= 2000
    assert report.kills > 0
    assert report.lost == 0, report.details
    assert report.duplicate_runs == 0
    assert report.stale_results_applied == 0
    assert report.audit_violations == 0
    assert report.duplicate_deliveries <= report.unknown_attempts, report.details
