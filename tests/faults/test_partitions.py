"""Hosts on a network, each in its own namespace, while the links between them fail: a worker cut
from the database past its lease, a worker cut from the target, latency and loss on a database
link, a worker with a skewed clock. The long form is `python bench/faults_failover.py`.

Uses its own PostgreSQL (started inside the database host's namespace), not the suite's."""

import os

import pytest

from tests.faults.partitions import LEASE_SECONDS, SKEW_SECONDS, run_partitions

pytestmark = [pytest.mark.faults]


def test_partitions_lose_nothing_and_leave_their_evidence(django_db_blocker, capsys):
    if os.geteuid() != 0:
        pytest.fail("network namespaces need root (CI runs as root)")
    with django_db_blocker.unblock():
        report = run_partitions(
            faults=["db_cut", "target_cut", "degrade", "db_cut"],
            seed=int(os.environ.get("FAULTS_SEED", "7")),
        )
    with capsys.disabled():
        print("\n" + report.line())
        print(f"  cut workers' expired leases={report.cut_worker_unknown} target-cut failures="
              f"{report.target_cut_failures} attempts on a degraded link={report.degraded_attempts} "
              f"skewed worker's calls={report.skewed_attempts} (largest distance from the database's "
              f"start time {report.skew_max_s:.1f}s, its clock {SKEW_SECONDS}s off)")
        for d in report.timeline + report.details + report.problems:
            print("  " + d)
    assert report.partitions == 4
    assert report.lost == 0, report.details
    assert report.duplicate_runs == 0
    assert report.stale_results_applied == 0
    assert report.audit_violations == 0, report.details
    assert report.duplicate_deliveries <= report.unknown_attempts, report.details
    assert report.exits == 0, report.details
    assert report.web_errors == 0, report.details
    assert report.problems == []
    # Evidence of each promise, from the database and the target's log.
    assert report.cut_worker_unknown > 0
    assert report.unknown_retried_same_key > 0
    assert report.late_results_kept > 0
    assert report.target_cut_failures > 0
    assert report.degraded_attempts > 0
    assert report.skewed_attempts > 0 and report.skew_max_s < LEASE_SECONDS + 2
    assert report.dispatch_gap_s <= 30.0
