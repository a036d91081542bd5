"""How answers become HttpResults: status classes, Retry-After, redirects, what is sent."""

import asyncio
import email.utils
import time

import pytest
from aiohttp import web

from dispatch.safehttp import SafeClient, parse_retry_after

from .support import serve

LOCAL = ["127.0.0.0/8"]


def answer(status, body=b"", headers=None):
    async def handler(request):
        return web.Response(status=status, body=body, headers=headers or {})

    return handler


def call_once(handler, *, method="POST", headers=None, body=b"{}", timeout=2, **client_kwargs):
    async def main():
        async with serve(handler) as base:
            async with SafeClient(allowed_networks=LOCAL, **client_kwargs) as client:
                return await client.request(
                    method, base + "/run", headers=headers or {}, body=body, timeout=timeout, allowed_prefixes=[base]
                )

    return asyncio.run(main())


@pytest.mark.parametrize("status", [200, 201, 202, 204])
def test_2xx_succeeds(status):
    result = call_once(answer(status, b"" if status == 204 else b"done"))
    assert (result.status, result.outcome, result.retryable) == (status, "succeeded", False)
    assert result.error is None and result.error_class is None
    assert result.body_excerpt == (b"" if status == 204 else b"done")
    assert result.remote_address == "127.0.0.1"
    assert result.latency_ms >= 0


@pytest.mark.parametrize("status", [500, 502, 503, 504, 408, 429])
def test_5xx_408_and_429_are_retryable_with_retry_after_parsed(status):
    result = call_once(answer(status, b"busy", {"Retry-After": "120"}))
    assert (result.status, result.outcome, result.retryable) == (status, "failed", True)
    assert result.retry_after == 120.0
    assert result.error_class == "HTTPStatus" and result.error == f"HTTP {status}"
    assert result.body_excerpt == b"busy"


def test_retry_after_as_an_http_date_becomes_seconds():
    when = email.utils.formatdate(time.time() + 90, usegmt=True)
    result = call_once(answer(503, headers={"Retry-After": when}))
    assert 85 <= result.retry_after <= 91


def test_an_invalid_or_absent_retry_after_is_none():
    assert call_once(answer(429, headers={"Retry-After": "soon"})).retry_after is None
    assert call_once(answer(503)).retry_after is None


@pytest.mark.parametrize(
    "value, expected",
    [("0", 0.0), ("  30 ", 30.0), ("-5", None), ("1.5", None), ("", None), (None, None), ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0)],
)
def test_parse_retry_after(value, expected):
    assert parse_retry_after(value) == expected


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 410, 422])
def test_other_4xx_are_permanent(status):
    result = call_once(answer(status, b"nope"))
    assert (result.status, result.outcome, result.retryable) == (status, "failed", False)
    assert result.error == f"HTTP {status}"


def test_a_redirect_to_the_metadata_address_is_returned_not_followed(connects):
    result = call_once(answer(302, headers={"Location": "http://169.254.169.254/latest/meta-data/"}))
    assert (result.status, result.outcome, result.retryable) == (302, "failed", False)
    assert result.error == "HTTP 302"
    assert connects == ["127.0.0.1"]


@pytest.mark.parametrize("status", [301, 303, 307, 308])
def test_every_redirect_status_is_a_permanent_failure(status):
    result = call_once(answer(status, headers={"Location": "/elsewhere"}))
    assert (result.status, result.retryable) == (status, False)


def test_it_sends_the_callers_body_and_headers_with_its_user_agent():
    seen = {}

    async def handler(request):
        seen["method"] = request.method
        seen["headers"] = dict(request.headers)
        seen["body"] = await request.read()
        return web.Response(text="ok")

    result = call_once(handler, method="PUT", headers={"Idempotency-Key": "run-1", "X-Signature": "abc"}, body=b'{"a":1}')
    assert result.outcome == "succeeded"
    assert seen["method"] == "PUT"
    assert seen["body"] == b'{"a":1}'
    assert seen["headers"]["Idempotency-Key"] == "run-1"
    assert seen["headers"]["X-Signature"] == "abc"
    assert seen["headers"]["User-Agent"] == "durable-scheduler/1"
    assert seen["headers"]["Content-Length"] == "7"
    assert "Cookie" not in seen["headers"]


def test_cookies_set_by_one_target_are_never_sent_back():
    cookies = []

    async def handler(request):
        cookies.append(request.headers.get("Cookie"))
        return web.Response(text="ok", headers={"Set-Cookie": "session=tenant-a; Path=/"})

    async def main():
        async with serve(handler) as base:
            async with SafeClient(allowed_networks=LOCAL) as client:
                for _ in range(2):
                    await client.request("GET", base + "/", headers={}, body=None, timeout=2, allowed_prefixes=None)

    asyncio.run(main())
    assert cookies == [None, None]


def test_keep_alive_connections_are_reused_across_calls():
    peers = []

    async def handler(request):
        peers.append(request.transport.get_extra_info("peername"))
        return web.Response(text="ok")

    async def main():
        async with serve(handler) as base:
            async with SafeClient(allowed_networks=LOCAL) as client:
                return [
                    await client.request("POST", base + "/", headers={}, body=b"x", timeout=2, allowed_prefixes=None)
                    for _ in range(5)
                ]

    results = asyncio.run(main())
    assert all(r.status == 200 for r in results)
    assert len(peers) == 5 and len(set(peers)) == 1


def test_compressed_bodies_are_kept_as_sent():
    import gzip

    raw = gzip.compress(b"x" * 5000)
    result = call_once(answer(200, raw, {"Content-Encoding": "gzip"}), excerpt_bytes=4096, max_response_bytes=8192)
    assert result.body_excerpt == raw[:4096]
