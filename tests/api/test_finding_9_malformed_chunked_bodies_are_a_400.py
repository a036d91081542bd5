"""Issue 26, finding 9: a chunked request body gunicorn cannot de-chunk (a chunk size that is not
hexadecimal, a missing chunk terminator, the client closing its side mid-body) raised out of the
body-limit middleware's read and was a 500. It is a 400 saying the body is malformed, and nothing
is stored. Checked through a real gunicorn on the test database, as the other chunked-body tests."""

import json
import socket

import pytest

from tests.api.test_request_body_limits import _exchange, _head, gunicorn, key  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db(transaction=True)


def _answer_after_half_close(port: int, data: bytes) -> tuple[int, bytes]:
    """Send `data`, close the sending side (the client gives up mid-body), read the answer."""
    import http.client

    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        answer = http.client.HTTPResponse(sock)
        answer.begin()
        return answer.status, answer.read()


@pytest.mark.parametrize("body", [
    b"zz\r\n{}\r\n0\r\n\r\n",               # a chunk size that is not hexadecimal
    b"-5\r\n{}\r\n0\r\n\r\n",               # a negative one
    b"2\r\n{}XX0\r\n\r\n",                  # a chunk without its CRLF terminator
], ids=["not-hex", "negative", "no-terminator"])
def test_finding_9_a_malformed_chunked_body_is_a_400(gunicorn, key, body):  # noqa: F811
    from schedules.models import Schedule

    status, payload = _exchange(gunicorn, _head(key, chunked=True), [body])
    assert status == 400, payload
    assert "chunked" in json.loads(payload)["error"]
    assert not Schedule.objects.exists()


def test_finding_9_a_client_closing_mid_chunked_body_is_a_400(gunicorn, key):  # noqa: F811
    from schedules.models import Schedule

    status, payload = _answer_after_half_close(gunicorn, _head(key, chunked=True) + b"40\r\n{\"expression\": ")
    assert status == 400, payload
    assert "chunked" in json.loads(payload)["error"]
    assert not Schedule.objects.exists()


def test_finding_9_the_portal_answers_a_malformed_chunked_body_with_a_400(gunicorn):  # noqa: F811
    head = (b"POST /portal/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
    status, payload = _exchange(gunicorn, head, [b"zz\r\nab\r\n0\r\n\r\n"])
    assert status == 400 and b"chunked" in payload, payload
