"""The all-in-one `scheduler` with worker child processes: a child that dies takes the whole
command down (non-zero, so its supervisor restarts it), a SIGTERM stops every child, and no child
outlives the command."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.faults.harness import ROOT, database_url

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgresql_only("worker child processes are the PostgreSQL default (SQLite runs one in-process)"),
]


def children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        out += [int(x) for x in text]
    return out


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] if Path(f"/proc/{pid}/stat").exists() else "X"
    return state != "Z"


def start(tmp_path):
    env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "scheduler_project.settings",
           "SCHEDULER_ALLOW_DEV_SECRET": "1", "SCHEDULER_SHUTDOWN_GRACE_SECONDS": "1", "LOG_LEVEL": "INFO"}
    log = open(tmp_path / "scheduler.log", "wb")
    p = subprocess.Popen([sys.executable, "manage.py", "scheduler", "--workers", "2"], cwd=ROOT, env=env,
                         stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(children(p.pid)) < 2:
        time.sleep(0.2)
    kids = children(p.pid)
    assert len(kids) == 2, (tmp_path / "scheduler.log").read_text()
    return p, kids


def test_a_worker_child_that_dies_takes_the_scheduler_down_with_status_1(tmp_path):
    p, kids = start(tmp_path)
    time.sleep(2)
    os.kill(kids[0], signal.SIGKILL)
    assert p.wait(30) == 1
    log = (tmp_path / "scheduler.log").read_text()
    assert "a worker process exited" in log and "exiting with status 1" in log
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and alive(kids[1]):
        time.sleep(0.1)
    assert not alive(kids[1])


def test_sigterm_stops_the_scheduler_and_every_child(tmp_path):
    p, kids = start(tmp_path)
    time.sleep(2)
    p.send_signal(signal.SIGTERM)
    assert p.wait(30) == 0
    assert not any(alive(k) for k in kids)


def test_a_child_whose_scheduler_is_killed_stops_by_itself(tmp_path):
    p, kids = start(tmp_path)
    time.sleep(2)
    p.kill()
    p.wait(10)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(alive(k) for k in kids):
        time.sleep(0.2)
    assert not any(alive(k) for k in kids)
