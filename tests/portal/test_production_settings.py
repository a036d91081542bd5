"""Production settings come from the environment: with the environment the README documents,
`manage.py check --deploy` finds nothing; without it, on a production database, the browser-facing
protections are on by default; the embedded quickstart and the development key keep plain HTTP.
The health endpoints stay reachable over plain HTTP for load balancers."""

import os
import secrets
import shlex
import subprocess
import sys

import pytest
from django.test import Client

from tests.faults.harness import ROOT


def documented_environment() -> dict:
    """The `export` lines of the README's production set-up, as a shell would set them (the
    SECRET_KEY line runs Python; a fresh key of the same kind stands in)."""
    text = (ROOT / "README.md").read_text()
    block = text.split("## Production set-up", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    env = {}
    for line in block.splitlines():
        if not line.startswith("export "):
            continue
        if "$(" in line:  # a command substitution: the name only
            env[line[len("export "):].split("=", 1)[0]] = None
            continue
        for word in shlex.split(line[len("export "):], comments=True):
            name, _, value = word.partition("=")
            env[name] = value
    assert "SECRET_KEY" in env, "the README no longer sets SECRET_KEY"
    del env["SECRET_KEY"]
    assert env["DATABASE_URL"].startswith("postgres://") and env["SECURE_HSTS_PRELOAD"] == "true", env
    return env


DOCUMENTED = documented_environment()


def run_django(env_extra: dict, *args) -> subprocess.CompletedProcess:
    # A clean environment: nothing of the test run's (DEBUG, the dev-secret switch) leaks in.
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"),
           "DJANGO_SETTINGS_MODULE": "scheduler_project.settings", **env_extra}
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def secret() -> str:
    return secrets.token_urlsafe(50)


def test_check_deploy_is_clean_with_the_documented_environment():
    result = run_django({**DOCUMENTED, "SECRET_KEY": secret()}, "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues (0 silenced)." in result.stdout


def test_check_deploy_names_what_an_environment_turns_off():
    env = {**DOCUMENTED, "SECRET_KEY": secret(), "SECURE_HSTS_INCLUDE_SUBDOMAINS": "false",
           "SESSION_COOKIE_SECURE": "false", "SECURE_SSL_REDIRECT": "false"}
    result = run_django(env, "check", "--deploy")
    for warning in ("security.W005", "security.W012", "security.W008"):
        assert warning in result.stderr + result.stdout, warning


SHOW = ("diffsettings", "--all")


def settings_of(env: dict) -> dict:
    result = run_django(env, *SHOW)
    assert result.returncode == 0, result.stderr
    out = {}
    for line in result.stdout.splitlines():
        name, sep, value = line.partition(" = ")
        if sep:
            out[name.strip().lstrip("#").strip()] = value.strip()
    return out


def test_production_defaults_are_on_and_each_can_be_turned_off():
    on = settings_of({"DATABASE_URL": DOCUMENTED["DATABASE_URL"], "SECRET_KEY": secret()})
    assert on["SESSION_COOKIE_SECURE"] == "True" and on["CSRF_COOKIE_SECURE"] == "True"
    assert on["SECURE_SSL_REDIRECT"] == "True" and on["SECURE_HSTS_SECONDS"] == "31536000"
    off = settings_of({"DATABASE_URL": DOCUMENTED["DATABASE_URL"], "SECRET_KEY": secret(),
                       "SECURE_SSL_REDIRECT": "false", "SECURE_HSTS_SECONDS": "0", "SESSION_COOKIE_SECURE": "0",
                       "SCHEDULER_SECURE_PROXY_SSL_HEADER": "HTTP_X_FORWARDED_SCHEME=https-yes"})
    assert off["SECURE_SSL_REDIRECT"] == "False" and off["SECURE_HSTS_SECONDS"] == "0"
    assert off["SESSION_COOKIE_SECURE"] == "False"
    assert off["SECURE_PROXY_SSL_HEADER"] == "('HTTP_X_FORWARDED_SCHEME', 'https-yes')"


def test_the_quickstart_database_keeps_plain_http(tmp_path):
    dev = settings_of({"SCHEDULER_VAR_DIR": str(tmp_path)})  # no DATABASE_URL: the embedded SQLite file
    assert dev["SESSION_COOKIE_SECURE"] == "False" and dev["SECURE_SSL_REDIRECT"] == "False"
    assert dev["SECURE_HSTS_SECONDS"] == "0"


@pytest.mark.django_db
def test_plain_http_is_redirected_except_the_health_endpoints(settings):
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    client = Client()  # middleware reads these settings when the client's handler loads it
    portal = client.get("/accounts/login/")
    assert portal.status_code == 301 and portal["Location"] == "https://testserver/accounts/login/"
    api = client.get("/api/v1/schedules")
    assert api.status_code == 301
    for path in ("/healthz", "/readyz"):
        assert client.get(path).status_code == 200, path
    assert client.get("/accounts/login/", HTTP_X_FORWARDED_PROTO="https").status_code == 200
