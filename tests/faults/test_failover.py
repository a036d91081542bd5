"""The database primary dies (SIGKILL of the whole node), then a planned switchover, under a
steady flow plus a burst in flight: pg_auto_failover promotes the synchronous standby and the
scheduler goes on by itself. The long form is `python bench/faults_failover.py`.

Uses its own formation (three PostgreSQL instances on free ports, under a temporary folder), not
the suite's database."""

import os
from dataclasses import replace

import pytest

from tests.faults.failover import run_failover

pytestmark = [pytest.mark.faults]


def test_a_failover_loses_nothing_and_the_scheduler_goes_on_by_itself(django_db_blocker, capsys):
    with django_db_blocker.unblock():
        report = run_failover(
            faults=["kill", "switchover"],
            seed=int(os.environ.get("FAULTS_SEED", "7")),
            observe=float(os.environ.get("FAILOVER_OBSERVE_SECONDS", "12")),
        )
    with capsys.disabled():
        print("\n" + report.line())
        print(f"  promoted after {', '.join(f'{s:.1f}s' for s in report.promote_s)}; "
              f"runs in flight at each fault: {report.in_flight_at_fault}; gaps: "
              f"{', '.join(f'{g:.1f}s' for g in report.gaps)}; web answers during the faults: "
              f"{dict(report.web_during_faults)}")
        print("  /metrics (min, max, last): " + ", ".join(f"{k}={v}" for k, v in report.metrics.items()))
        for d in report.details:
            print("  " + d)
    assert report.failovers == 2 and report.node_kills == 1
    # Every fault found commits waiting for the standby (the promise's precondition), and with the
    # old primary dead the new one said it had none.
    assert [r.synchronous >= 1 and not r.degraded for r in report.replication_before_fault] == [True, True]
    assert [(r.standbys, r.synchronous) for r in report.replication_after_kill] == [(0, 0)]
    assert all(replace(r, expected=True).degraded for r in report.replication_after_kill)
    assert report.async_at_fault == 0, report.details
    assert all(n > 0 for n in report.in_flight_at_fault), "a fault must find runs in flight"
    assert report.committed_checked > 0
    assert report.committed_missing == 0, report.details
    assert report.lost == 0, report.details
    assert report.duplicate_runs == 0
    assert report.stale_results_applied == 0
    assert report.audit_violations == 0, report.details
    assert report.duplicate_deliveries <= report.unknown_attempts, report.details
    assert report.exits == 0, report.details
    assert report.stalled_loops == [], report.stalled_loops
    assert report.dispatch_gap_s <= 30.0
    assert report.web_requests > 0 and report.web_errors == 0, report.details
