"""Real processes through what a database restart under load does to them: their tables locked
for seconds and every one of their sessions terminated, three times over. Nothing is restarted:
afterwards every loop still works (a schedule made due then is materialised, claimed and called)
and the web process answers without a 5xx.

Run once with the loops as separate commands (`scan`, `work`, `reconcile`, `relay`) and once as
the all-in-one `scheduler`, each beside gunicorn."""

import os
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from django.db import connections

from runs.models import Run
from tests.faults.harness import ROOT, Proc, database_url
from tests.helpers import make_due, make_schedule

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgresql_only("locks tables and terminates sessions of other processes"),
]

LOOPS = {
    "separate": [["scan"], ["work", "--concurrency", "8"], ["reconcile"], ["relay"]],
    "scheduler": [["scheduler", "--concurrency", "8"]],
}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env() -> dict:
    return {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "scheduler_project.settings",
        "SCHEDULER_ALLOW_DEV_SECRET": "1",
        "SCHEDULER_POLL_SECONDS": "0.2",
        "SCHEDULER_RECONCILE_SECONDS": "0.5",
        "SCHEDULER_SHUTDOWN_GRACE_SECONDS": "1",
        "SCHEDULER_TARGET_ALLOWED_NETWORKS": "127.0.0.0/8",
        "LOG_LEVEL": "INFO",
    }


def disrupt(db_name: str, *, hold: float = 3.0) -> int:
    """Lock the tables the loops use for `hold` seconds while terminating every scheduler session
    (and again once the lock is gone): what a restart under load looks like from the processes."""
    locker = connections.create_connection("default")
    killer = connections.create_connection("default")
    killed = 0
    try:
        locker.set_autocommit(False)
        with locker.cursor() as cur:
            cur.execute("LOCK TABLE schedules_schedule, runs_run IN ACCESS EXCLUSIVE MODE")
        end = time.monotonic() + hold
        while time.monotonic() < end:
            killed += terminate(killer, db_name)
            time.sleep(0.5)
        locker.rollback()
        killed += terminate(killer, db_name)
    finally:
        locker.close()
        killer.close()
    return killed


def terminate(conn, db_name: str) -> int:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid() AND application_name LIKE 'scheduler-%%'",
            [db_name],
        )
        return cur.fetchone()[0]


class WebProbe(threading.Thread):
    """GETs /readyz and an API list in a loop, counting what came back once the database is back."""

    def __init__(self, base: str, key: str):
        super().__init__(daemon=True)
        self.base, self.key = base, key
        self.stop = threading.Event()
        self.statuses: list[int] = []

    def get(self, path: str, auth: bool = False) -> int:
        req = urllib.request.Request(self.base + path)
        if auth:
            req.add_header("Authorization", f"Bearer {self.key}")
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            return 0

    def run(self):
        while not self.stop.is_set():
            self.statuses.append(self.get("/api/v1/schedules", auth=True))
            time.sleep(0.2)


@pytest.mark.parametrize("layout", sorted(LOOPS))
def test_every_loop_and_the_web_process_work_on_after_three_restarts(tenant, target, layout, tmp_path):
    from schedules.tenants import create_api_key

    db_name = connections["default"].settings_dict["NAME"]
    _, key = create_api_key(tenant, label="probe")
    port = free_port()
    procs = [Proc(args[0], args, env(), log_path=tmp_path / f"{args[0]}.log") for args in LOOPS[layout]]
    procs.append(Proc("web", [], env(), log_path=tmp_path / "web.log", argv=[
        sys.executable, "-m", "gunicorn", "scheduler_project.wsgi", "--bind", f"127.0.0.1:{port}", "--workers", "2",
        "--threads", "2"]))
    for p in procs:
        p.start()
    probe = WebProbe(f"http://127.0.0.1:{port}", key)
    try:
        wait(lambda: probe.get("/readyz") == 200, 60, "gunicorn to answer")
        before = make_schedule(tenant, target.url + "/before")
        make_due(before)
        wait(lambda: delivered(target, "/before"), 60, "a run before any fault")

        killed = [disrupt(db_name) for _ in range(3)]
        assert all(k > 0 for k in killed), killed  # every round did terminate live sessions
        probe.start()
        time.sleep(1.0)

        after = make_schedule(tenant, target.url + "/after")
        make_due(after)
        wait(lambda: delivered(target, "/after"), 60, "a schedule made due after the faults to run")
        wait(lambda: Run.objects.get(schedule=after).state == "succeeded", 30, "its result to be recorded")
        assert all(p.alive() for p in procs), {p.kind: p.popen.poll() for p in procs}
        assert all(p.starts == 1 for p in procs)  # nothing was restarted
    finally:
        probe.stop.set()
        for p in procs:
            if p.alive():
                p.popen.terminate()
        for p in procs:
            if p.popen:
                try:
                    p.popen.wait(15)
                except Exception:
                    p.popen.kill()
    logs = "".join((tmp_path / f"{p.kind}.log").read_text(errors="replace") for p in procs)
    assert "step failed" in logs or "failed" in logs  # the loops did meet the faults
    # Once the database was back, the web process answered every request normally.
    assert probe.statuses and all(s == 200 for s in probe.statuses), sorted(set(probe.statuses))


def delivered(target, path: str) -> bool:
    return any(d["path"] == path for d in target.deliveries)


def wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")
