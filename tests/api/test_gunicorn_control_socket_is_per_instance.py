"""Issue 26, finding 12: gunicorn's control socket was left at its default, under the user's home
(`~/.gunicorn/gunicorn.ctl`) and shared with any other gunicorn the user runs. The project's
gunicorn settings (scheduler_project.gunicorn_conf, used by the README's production line and by
quickstart) turn it off, or put it where SCHEDULER_GUNICORN_CONTROL_SOCKET says."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.faults.harness import ROOT

CONFIG = "python:scheduler_project.gunicorn_conf"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(home: Path, *extra: str, env_extra=None, while_up=lambda: None) -> None:
    """Start gunicorn with HOME=home, wait until it answers /healthz, call while_up(), stop it."""
    port = _free_port()
    env = {**os.environ, "HOME": str(home), "DJANGO_SETTINGS_MODULE": "scheduler_project.settings",
           "SCHEDULER_ALLOW_DEV_SECRET": "1", "LOG_LEVEL": "WARNING", **(env_extra or {})}
    proc = subprocess.Popen([sys.executable, "-m", "gunicorn", *extra, "scheduler_project.wsgi", "--bind",
                             f"127.0.0.1:{port}", "--workers", "1", "--log-level", "warning"], cwd=ROOT, env=env)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                    if sock.recv(64).startswith(b"HTTP/1.1 200"):
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("gunicorn did not start")
            time.sleep(0.2)
        time.sleep(1.0)  # the control socket, when there is one, is opened as the arbiter starts
        while_up()
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_gunicorn_control_socket_is_per_instance(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    seen = {}
    _serve(home, "-c", CONFIG, while_up=lambda: seen.update(home=(home / ".gunicorn").exists()))
    assert seen == {"home": False}
    own = tmp_path / "instance" / "gunicorn.ctl"
    own.parent.mkdir()
    try:
        import gunicorn.config

        has_control = "control_socket" in gunicorn.config.Config().settings
    except ImportError:  # pragma: no cover
        has_control = False
    if has_control:
        _serve(home, "-c", CONFIG, env_extra={"SCHEDULER_GUNICORN_CONTROL_SOCKET": str(own)},
               while_up=lambda: seen.update(home=(home / ".gunicorn").exists(), own=own.exists()))
        assert seen == {"home": False, "own": True}


def test_the_documented_and_quickstart_gunicorn_commands_use_the_project_settings():
    readme = (Path(ROOT) / "README.md").read_text()
    (line,) = [ln for ln in readme.splitlines() if ln.startswith("gunicorn scheduler_project.wsgi")]
    assert f"-c {CONFIG}" in line
    assert CONFIG in (Path(ROOT) / "dispatch" / "management" / "commands" / "quickstart.py").read_text()
