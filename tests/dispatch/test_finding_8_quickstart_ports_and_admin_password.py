"""Issue 26, finding 8: quickstart with its web port taken printed its banner, ran its loops with no
web server and never exited; a first run that failed after creating `admin` never showed its
password again. Now both ports are checked before anything is made (a taken one: a non-zero exit
with the reason, quickly, and no database, login or tenant), the banner waits for the web server,
a web server that dies takes quickstart down non-zero with the reason, and `admin`'s password is
shown on the run that sets it (an interrupted first run leaves none set, so the next one sets and
shows it); a password already shown is kept.

Real `manage.py quickstart` processes on their own embedded database in a temporary folder.
"""

import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.faults.harness import ROOT

BANNER_SECONDS = 90  # migrate on a fresh file and gunicorn's boot, on a loaded 2-core host


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(var_dir: Path) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE", "SCHEDULER_TEST_DATABASE",
                        "SCHEDULER_ADMIN_PASSWORD")}
    return {**env, "SCHEDULER_VAR_DIR": str(var_dir), "LOG_LEVEL": "WARNING"}


_started: list[subprocess.Popen] = []


def _quickstart(var_dir: Path, web: int, demo: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "manage.py", "quickstart", "--addr", f"127.0.0.1:{web}",
                             "--demo-port", str(demo)], cwd=ROOT, env=_env(var_dir), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    _started.append(proc)
    return proc


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for t in Path(f"/proc/{pid}/task").iterdir() for c in (t / "children").read_text().split()]
    except OSError:
        return []


@pytest.fixture(autouse=True)
def _no_quickstart_outlives_its_test():
    """A failed assertion must not leave a quickstart (and its gunicorn, in a session of its own)."""
    yield
    while _started:
        proc = _started.pop()
        if proc.poll() is not None:
            continue
        web = _children(proc.pid)
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in web:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _finish(proc: subprocess.Popen, seconds: float) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"quickstart still ran after {seconds} s:\n{out[-2000:]}\n{err[-2000:]}")
    return proc.returncode, out, err


def _banner_login(proc: subprocess.Popen) -> str:
    """Read quickstart's output up to its banner's login line; return what follows `login`."""
    deadline = time.monotonic() + BANNER_SECONDS
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if "portal" in line and "login" in line:
            return line.split("login", 1)[1].strip()
    os.killpg(proc.pid, signal.SIGKILL)
    pytest.fail(f"no banner: {proc.stderr.read()[-3000:]}")


def _rows(var_dir: Path, sql: str) -> list:
    db = var_dir / "scheduler.sqlite3"
    if not db.exists():
        return []
    with sqlite3.connect(db) as conn:
        try:
            return conn.execute(sql).fetchall()
        except sqlite3.OperationalError:  # not migrated: no such table
            return []


def _hold(port: int) -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    s.listen(1)
    return s


@pytest.mark.parametrize("which", ["web", "demo"])
def test_finding_8_a_taken_port_is_a_quick_non_zero_exit_and_nothing_is_made(tmp_path, which):
    web, demo = _free_port(), _free_port()
    with _hold(web if which == "web" else demo):
        started = time.monotonic()
        code, out, err = _finish(_quickstart(tmp_path, web, demo), 60)
        elapsed = time.monotonic() - started
    taken = web if which == "web" else demo
    assert code != 0
    assert f"127.0.0.1:{taken}" in err and "in use" in err, err
    assert ("--addr" if which == "web" else "--demo-port") in err
    assert "portal" not in out  # no banner
    assert elapsed < 45, elapsed  # quickly: it does not start its loops, nor wait for anything
    assert not (tmp_path / "scheduler.sqlite3").exists()
    assert not (tmp_path / "quickstart.env").exists()


def test_finding_8_admin_is_shown_a_password_after_a_failed_first_run_and_a_dead_web_server_ends_quickstart(
        tmp_path):
    # The test settings hash with a fast hasher; quickstart's processes with the project's own.
    from django.contrib.auth.hashers import PBKDF2PasswordHasher

    web, demo = _free_port(), _free_port()
    with _hold(demo):  # the first run fails
        code, _, err = _finish(_quickstart(tmp_path, web, demo), 60)
    assert code != 0 and "demo target" in err

    proc = _quickstart(tmp_path, web, demo)
    login = _banner_login(proc)
    match = re.fullmatch(r"admin / (\S+)", login)
    assert match, login
    ((stored,),) = _rows(tmp_path, "select password from auth_user where username = 'admin'")
    assert PBKDF2PasswordHasher().verify(match[1], stored)
    with socket.create_connection(("127.0.0.1", web), timeout=5):
        pass  # the banner came once the web server listened

    # The web server dies: quickstart stops everything and exits non-zero, saying why.
    (gunicorn,) = _children(proc.pid)
    os.killpg(gunicorn, signal.SIGKILL)
    code, _, err = _finish(proc, 40)
    assert code != 0
    assert "web server (gunicorn) exited" in err, err[-2000:]

    # Run again: the password that was shown is kept, not replaced.
    proc = _quickstart(tmp_path, web, demo)
    assert "password set on an earlier run" in _banner_login(proc)
    os.killpg(proc.pid, signal.SIGINT)
    code, out, err = _finish(proc, 40)
    assert "quickstart stopped" in out
    assert _rows(tmp_path, "select password from auth_user where username = 'admin'") == [(stored,)]
