"""The soak's CI form (bench/soak.py --ci: 4 minutes at a quarter of the short form's load): the
design load in small, every fault of the fault suites in the middle of it (kill -9 of the scanner
and of a worker, a switchover, a worker host cut off for twice its lease, a spike across a
partition drop, the primary's node killed), on a pg_auto_failover formation of its own. The soak
exits 1 when a zero figure is not zero: runs lost, duplicate runs, stale results applied, audit
violations, a 5xx other than a 503 during a fault.
Its table is printed into the test log (lags and times are printed, not asserted).

`python -m tests` runs it in a lane of its own beside the PostgreSQL pass (tests/__main__.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.soak]

ROOT = Path(__file__).resolve().parents[2]
# Generous: the form takes about five minutes on an idle 2-core machine, more on a busy one.
TIMEOUT_SECONDS = 20 * 60


# Above the suite's per-test timeout (pyproject's), which killed the soak mid-run with SIGKILL and
# left its formation and processes behind; past TIMEOUT_SECONDS the soak gets SIGTERM, which it
# handles as Ctrl-C: through its teardown.
@pytest.mark.timeout(TIMEOUT_SECONDS + 120)
def test_the_soak_ci_form_loses_nothing(capsys):
    if os.geteuid() != 0:
        pytest.fail("the soak needs root: network namespaces, pg_autoctl as the postgres user (CI runs as root)")
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "SCHEDULER_TEST_DATABASE")}
    soak = subprocess.Popen([sys.executable, "bench/soak.py", "--ci"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = soak.communicate(timeout=TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        soak.terminate()  # the soak's teardown: processes stopped, formation and namespaces removed
        out, err = soak.communicate(timeout=120)
        pytest.fail(f"the soak did not end within {TIMEOUT_SECONDS} s\n{out[-6000:]}\n{err[-4000:]}")
    table = out[out.find("SOAK:"):] if "SOAK:" in out else out[-6000:]
    with capsys.disabled():
        print("\n" + table)
    assert soak.returncode == 0, f"soak exit {soak.returncode}\n{table}\n{err[-4000:]}"
    assert "zeros all 0: OK" in out
