"""A request body over the limit is refused by its Content-Length before a byte of it is read (413,
JSON on the API), whatever its size: bodies between the limit and Django's own read limit used to
be read whole, and larger ones answered 500. A chunked body is read under the same bound where the
server de-chunks it (gunicorn), and refused with 411 where it does not. What depends on the server
is checked against a real gunicorn started on the test database."""

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from io import BytesIO

import pytest
from django.db import connection

from scheduler_project.web.bodylimit import max_request_bytes
from tests.api.conftest import schedule_body

API_PATHS = ["/api/v1/schedules", "/api/v1/expressions/preview", "/api/v1/keys"]


class Unreadable(BytesIO):
    """A request body that fails the test if anything reads it."""

    def read(self, *args, **kwargs):
        raise AssertionError("the body was read")

    readline = read


@pytest.mark.django_db
@pytest.mark.parametrize("path", API_PATHS)
@pytest.mark.parametrize("declared", [max_request_bytes() + 1, 50 * 1024 * 1024])
def test_a_body_declared_over_the_limit_is_a_413_without_reading_it(api, path, declared):
    # Just over the limit used to be read whole (DRF reads the body before its parser can check).
    resp = api.generic("POST", path, b"", content_type="application/json",
                       CONTENT_LENGTH=str(declared), **{"wsgi.input": Unreadable()})
    assert resp.status_code == 413
    assert resp.json()["error"] == f"the request body is {declared} bytes; the limit is {max_request_bytes()} bytes"


@pytest.mark.django_db
@pytest.mark.parametrize("size", [max_request_bytes() + 1, 3 * 1024 * 1024, 12 * 1024 * 1024])
def test_bodies_over_the_limit_are_413_never_500_at_any_size(api, size):
    # 3 MiB and up passed Django's DATA_UPLOAD_MAX_MEMORY_SIZE, which a DRF view answered with a 500.
    raw = b'{"expression": "' + b"a" * size + b'"}'
    for path in API_PATHS:
        resp = api.generic("POST", path, raw, content_type="application/json")
        assert resp.status_code == 413, (path, resp.content[:200])
        assert "limit" in resp.json()["error"]
    resp = api.generic("POST", "/api/v1/schedules", raw, content_type="application/json",
                       HTTP_IDEMPOTENCY_KEY="big-body")
    assert resp.status_code == 413


@pytest.mark.django_db
def test_a_body_at_the_limit_is_read_and_parsed(api, target, settings):
    body = json.dumps(schedule_body(target)).encode()
    settings.SCHEDULER_MAX_REQUEST_BYTES = len(body)
    resp = api.generic("POST", "/api/v1/schedules", body, content_type="application/json")
    assert resp.status_code == 201, resp.content


@pytest.mark.django_db
def test_portal_and_admin_bodies_are_bounded_by_the_form_limit(client, settings):
    declared = settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1
    for path in ("/accounts/login/", "/admin/login/", "/tenants/"):
        resp = client.generic("POST", path, b"", content_type="application/x-www-form-urlencoded",
                              CONTENT_LENGTH=str(declared), **{"wsgi.input": Unreadable()})
        assert resp.status_code == 413, path
        assert b"limit" in resp.content


@pytest.mark.django_db
def test_a_content_length_that_is_not_a_number_is_a_400(api):
    resp = api.generic("POST", "/api/v1/keys", b"{}", content_type="application/json", CONTENT_LENGTH="12abc")
    assert resp.status_code == 400 and "Content-Length" in resp.json()["error"]


@pytest.mark.django_db
def test_a_chunked_body_is_refused_with_411_by_a_server_that_does_not_dechunk_it(api):
    # Django's runserver and its test client do not set wsgi.input_terminated: the body cannot
    # be read safely without a length, so the client is told to send one.
    resp = api.generic("POST", "/api/v1/keys", b"", content_type="application/json",
                       HTTP_TRANSFER_ENCODING="chunked", CONTENT_LENGTH="")
    assert resp.status_code == 411
    assert "Content-Length" in resp.json()["error"]


@pytest.mark.django_db
def test_a_dechunked_body_is_read_under_the_limit_and_no_further(api, settings):
    settings.SCHEDULER_MAX_REQUEST_BYTES = 1000

    class Counting(BytesIO):
        asked = 0

        def read(self, n=-1):
            Counting.asked = n
            return super().read(n)

    stream = Counting(b"x" * 50_000)
    resp = api.generic("POST", "/api/v1/keys", b"", content_type="application/json", CONTENT_LENGTH="",
                       HTTP_TRANSFER_ENCODING="chunked", **{"wsgi.input": stream, "wsgi.input_terminated": True})
    assert resp.status_code == 413
    assert Counting.asked == 1001 and stream.tell() == 1001


# ------------------------------------------------------------------ through a real gunicorn


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _database_url() -> str:
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    return f"postgres://{s['USER'] or 'postgres'}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


@pytest.fixture(scope="module")
def gunicorn(django_db_setup, django_db_blocker):
    from tests.faults.harness import ROOT

    with django_db_blocker.unblock():
        url = _database_url()
    port = _free_port()
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "scheduler_project.settings",
           "SCHEDULER_ALLOW_DEV_SECRET": "1", "SCHEDULER_TARGET_ALLOWED_NETWORKS": "127.0.0.0/8",
           "SCHEDULER_API_RATE_LIMIT_PER_MINUTE": "0", "LOG_LEVEL": "WARNING"}
    proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "scheduler_project.wsgi", "--bind",
                             f"127.0.0.1:{port}", "--workers", "1", "--log-level", "warning"],
                            cwd=ROOT, env=env)
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("gunicorn did not start")
            time.sleep(0.1)
    yield port
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


def _exchange(port: int, head: bytes, body_parts=(), timeout: float = 10.0) -> tuple[int, bytes]:
    """Send a request's head and body parts on one connection; return the answer's status and body."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head)
        try:
            for part in body_parts:
                sock.sendall(part)
        except (BrokenPipeError, ConnectionResetError):
            # The server answered before the body was all sent and closed its side: as an HTTP
            # client does, stop sending and read what it answered (it is already queued here).
            pass
        answer = http.client.HTTPResponse(sock)
        answer.begin()
        return answer.status, answer.read()


def _head(key: str, *, length: int | None = None, chunked: bool = False) -> bytes:
    lines = ["POST /api/v1/schedules HTTP/1.1", "Host: 127.0.0.1", f"Authorization: Bearer {key}",
             "Content-Type: application/json"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _chunks(data: bytes, size: int = 100) -> list[bytes]:
    return [b"%x\r\n%s\r\n" % (len(data[i:i + size]), data[i:i + size]) for i in range(0, len(data), size)]


@pytest.fixture
def key(tenant):
    from schedules.tenants import create_api_key

    return create_api_key(tenant, label="gunicorn")[1]


@pytest.mark.django_db(transaction=True)
def test_gunicorn_answers_413_to_a_huge_declared_body_without_waiting_for_it(gunicorn, key):
    started = time.monotonic()
    # Only the head is sent: had anything tried to read the 50 MB, this would wait for the timeout.
    status, payload = _exchange(gunicorn, _head(key, length=50_000_000), timeout=15)
    assert status == 413 and "limit" in json.loads(payload)["error"]
    assert time.monotonic() - started < 10


@pytest.mark.django_db(transaction=True)
def test_gunicorn_answers_413_to_a_body_over_the_limit_that_is_really_sent(gunicorn, key):
    raw = b'{"expression": "' + b"a" * (3 * 1024 * 1024) + b'"}'
    # An answer must arrive, whether the whole body was sent before it or not (_exchange reads it).
    status, _ = _exchange(gunicorn, _head(key, length=len(raw)), [raw], timeout=15)
    assert status == 413


@pytest.mark.django_db(transaction=True)
def test_gunicorn_parses_a_chunked_body_under_the_same_bound(gunicorn, key, target):
    from schedules.models import Schedule

    body = json.dumps(schedule_body(target, name="sent-chunked")).encode()
    status, payload = _exchange(gunicorn, _head(key, chunked=True), [*_chunks(body), b"0\r\n\r\n"])
    assert status == 201, payload
    assert json.loads(payload)["name"] == "sent-chunked"
    assert Schedule.objects.filter(name="sent-chunked").count() == 1


@pytest.mark.django_db(transaction=True)
def test_gunicorn_refuses_a_chunked_body_over_the_limit(gunicorn, key):
    limit = max_request_bytes()
    # One chunk one byte over the limit and no terminator: what is over the limit is read and no more.
    status, payload = _exchange(gunicorn, _head(key, chunked=True), [b"%x\r\n" % (limit + 1), b"a" * (limit + 1)])
    assert status == 413 and "limit" in json.loads(payload)["error"]
