"""The HTTP/1.1 transport under SafeClient (dispatch/http1.py): framing of odd answers,
connection reuse and limits, TLS, and that concurrent calls never get each other's answers."""

import asyncio
import socket
import ssl
import subprocess

import pytest

from dispatch.safehttp import SafeClient

from .support import LOCAL, RawServer, answering_ok, answering_once, keep_alive_ok, post, read_request, serving


def test_a_head_answer_ends_at_its_headers_whatever_its_content_length():
    handler = answering_once(b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n", hold=5)
    (result,), _ = serving(handler, lambda c, b: post(c, b, method="HEAD"))
    assert (result.status, result.outcome, result.body_excerpt) == (200, "succeeded", b"")
    assert result.latency_ms < 1000


def test_an_informational_answer_is_skipped_for_the_final_one():
    handler = answering_once(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 4\r\n\r\ndone")
    (result,), _ = serving(handler, post)
    assert (result.status, result.body_excerpt) == (201, b"done")


def test_an_answer_without_length_ends_when_the_connection_closes():
    handler = answering_once(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end")
    (first, second), server = serving(handler, post, post)
    assert (first.status, first.body_excerpt) == (200, b"until the end")
    assert second.status == 200 and server.connections == 2


def test_a_chunked_answer_is_decoded_into_the_excerpt():
    handler = answering_once(b"HTTP/1.1 500 Oops\r\nTransfer-Encoding: chunked\r\nRetry-After: 7\r\n\r\n"
                             b"4\r\nfail\r\n5\r\ned it\r\n0\r\n\r\n", hold=1)

    (result,), _ = serving(handler, post)
    assert (result.status, result.retryable, result.retry_after) == (500, True, 7.0)
    assert result.body_excerpt == b"failed it"


def test_a_connection_the_target_closed_while_idle_is_not_reused():
    # Keep-alive by default, then the server hangs up anyway.
    handler = answering_once(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    async def later(client, base):
        await asyncio.sleep(0.1)
        return await post(client, base)

    results, server = serving(handler, post, later, later)
    assert [r.status for r in results] == [200, 200, 200]
    assert server.connections == 3


def test_a_malformed_answer_is_a_retryable_failure_after_sending():
    (result,), _ = serving(answering_once(b"SMTP ready\r\n\r\n", hold=1), post)
    assert (result.status, result.retryable, result.error_class) == (None, True, "ClientResponseError")


def test_a_body_cut_short_is_a_payload_error():
    (result,), _ = serving(answering_once(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this"), post)
    assert (result.status, result.retryable, result.error_class) == (None, True, "ClientPayloadError")


@pytest.mark.parametrize("value", ["a\r\nX-Injected: 1", "a\nb", "a\x00b"])
def test_header_values_with_line_breaks_are_refused_before_connecting(value, connects):
    (result,), server = serving(keep_alive_ok, lambda c, b: post(c, b, headers={"X-Note": value}))
    assert (result.error_class, result.retryable) == ("TargetRefused", False)
    assert server.connections == 0 and connects == []


def test_invalid_header_names_and_methods_are_refused(connects):
    (bad_name, bad_method), server = serving(
        keep_alive_ok,
        lambda c, b: post(c, b, headers={"X Bad": "1"}),
        lambda c, b: post(c, b, method="GET /x HTTP/1.1\r\n"),
    )
    assert bad_name.error_class == bad_method.error_class == "TargetRefused"
    assert server.connections == 0


def test_the_connection_limit_queues_calls_instead_of_opening_more():
    async def many(client, base):
        return await asyncio.gather(*[post(client, base) for _ in range(12)])

    (results,), server = serving(answering_ok(0.05), many, client_kwargs={"limit": 3})
    assert [r.status for r in results] == [200] * 12
    assert server.max_open <= 3


def test_concurrent_calls_each_get_their_own_answer():
    async def echo(reader, writer):
        while True:
            head, _ = await read_request(reader)
            n = [line.split(b":", 1)[1].strip() for line in head.split(b"\r\n") if line.lower().startswith(b"x-n:")][0]
            await asyncio.sleep(0.001 * (int(n) % 7))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(n), n))
            await writer.drain()

    async def many(client, base):
        return await asyncio.gather(*[post(client, base, headers={"X-N": str(i)}) for i in range(300)])

    (results,), _ = serving(echo, many, client_kwargs={"limit": 50})
    assert [r.body_excerpt for r in results] == [str(i).encode() for i in range(300)]


def test_a_cancelled_call_never_leaves_its_connection_for_reuse():
    async def handler(reader, writer):
        while True:
            head, _ = await read_request(reader)
            if b"slow" in head:
                await asyncio.sleep(0.3)  # answers late, on the connection the caller gave up
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n" + (b"slow" if b"slow" in head else b"fast"))
            await writer.drain()

    async def cancel_slow(client, base):
        task = asyncio.ensure_future(post(client, base + "/slow", headers={"X-Kind": "slow"}))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return None

    (_, fast), server = serving(handler, cancel_slow, post)
    assert fast.body_excerpt == b"fast" and server.connections == 2


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem")],
        check=True, capture_output=True,
    )
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(d / "cert.pem", d / "key.pem")
    trusting = ssl.create_default_context(cafile=str(d / "cert.pem"))
    return server, trusting


def test_https_with_a_trusted_certificate(self_signed):
    server_ctx, trusting = self_signed
    results, _ = serving(keep_alive_ok, post, post, scheme="https", ssl_context=server_ctx,
                         client_kwargs={"ssl_context": trusting})
    assert [r.status for r in results] == [200, 200]


def test_https_with_an_untrusted_certificate_fails_without_sending(self_signed):
    server_ctx, _ = self_signed
    (result,), _ = serving(keep_alive_ok, post, scheme="https", ssl_context=server_ctx)
    assert (result.status, result.retryable, result.error_class) == (None, True, "ClientConnectorCertificateError")
    assert "certificate" in result.error


def test_connections_idle_past_the_keepalive_are_closed(monkeypatch):
    from dispatch import http1

    monkeypatch.setattr(http1.Pool, "KEEPALIVE", 0.2)

    async def main():
        async with RawServer(keep_alive_ok) as a, RawServer(keep_alive_ok) as b:
            async with SafeClient(allowed_networks=LOCAL) as client:
                await post(client, f"http://127.0.0.1:{a.port}")
                await asyncio.sleep(0.3)
                # A call to another origin sweeps the first one's stale connection.
                await post(client, f"http://127.0.0.1:{b.port}")
                await asyncio.sleep(0.05)
                return a.open, b.open

    assert asyncio.run(main()) == (0, 1)


def test_headers_that_never_end_are_cut_off_at_the_head_limit():
    async def handler(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nX-Long: ")
        try:
            for _ in range(10_000):
                writer.write(b"a" * 1024)
                await writer.drain()
        except ConnectionError:
            pass

    (result,), _ = serving(handler, post)
    assert (result.status, result.error_class, result.retryable) == (None, "ResponseTooLarge", True)
    assert "headers over" in result.error


def test_a_second_unasked_answer_makes_the_connection_unusable():
    async def handler(reader, writer):
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\none"
                         b"HTTP/1.1 500 Extra\r\nContent-Length: 5\r\n\r\nextra")
            await writer.drain()

    (first, second), server = serving(handler, post, post)
    assert (first.status, first.body_excerpt) == (200, b"one")
    assert (second.status, second.body_excerpt) == (200, b"one")
    assert server.connections == 2


def test_results_say_whether_the_request_went_out():
    async def hang_up(reader, writer):
        await read_request(reader)

    (timed_out,), _ = serving(answering_ok(1.0), lambda c, b: post(c, b, timeout=0.2))
    (hung_up,), _ = serving(hang_up, post)
    assert (timed_out.error_class, timed_out.sent) == ("TimeoutError", True)
    assert (hung_up.error_class, hung_up.sent) == ("ServerDisconnectedError", True)

    async def refused():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        async with SafeClient(allowed_networks=LOCAL) as client:
            return await post(client, f"http://127.0.0.1:{port}")

    result = asyncio.run(refused())
    assert (result.error_class, result.sent) == ("ClientConnectorError", False)
