"""Byte caps, the total time limit, network errors and cancellation."""

import asyncio
import time

from aiohttp import web

from dispatch.safehttp import SafeClient

from .support import StubResolver, free_port, serve

LOCAL = ["127.0.0.0/8"]


def oversized_server(sent, chunk=b"x" * 65536, total=64 * 1024 * 1024, **response_kwargs):
    """Streams ``total`` bytes unless the client goes away; records what happened in ``sent``."""

    async def handler(request):
        response = web.StreamResponse(**response_kwargs)
        if response_kwargs.get("headers", {}).get("Content-Length") is None:
            response.enable_chunked_encoding()
        await response.prepare(request)
        sent["bytes"] = 0
        sent["finished"] = False
        try:
            while sent["bytes"] < total:
                await response.write(chunk)
                sent["bytes"] += len(chunk)
            await response.write_eof()
            sent["finished"] = True
        except (ConnectionResetError, ConnectionError, asyncio.CancelledError):
            sent["finished"] = False
            raise
        return response

    return handler


def test_an_oversized_response_is_capped_and_the_connection_dropped():
    sent = {}

    async def main():
        async with serve(oversized_server(sent)) as base:
            async with SafeClient(allowed_networks=LOCAL, max_response_bytes=100_000, excerpt_bytes=1000) as client:
                started = time.monotonic()
                result = await client.request("GET", base + "/", headers={}, body=None, timeout=10, allowed_prefixes=None)
                elapsed = time.monotonic() - started
                await asyncio.sleep(0.3)  # let the server notice the closed connection
                # The client is still usable after dropping a connection.
                again = await client.request("GET", base + "/", headers={}, body=None, timeout=10, allowed_prefixes=None)
                return result, elapsed, again

    result, elapsed, again = asyncio.run(main())
    assert (result.status, result.outcome) == (200, "succeeded")
    assert result.body_excerpt == b"x" * 1000
    assert elapsed < 5
    assert again.status == 200
    # 64 MiB were on offer; the server could not push them all through a closed connection.
    assert sent["finished"] is False
    assert sent["bytes"] < 64 * 1024 * 1024


def test_a_body_larger_than_the_cap_with_content_length_is_not_read_to_the_end():
    sent = {}
    total = 32 * 1024 * 1024

    async def main():
        handler = oversized_server(sent, total=total, headers={"Content-Length": str(total)})
        async with serve(handler) as base:
            async with SafeClient(allowed_networks=LOCAL, max_response_bytes=4096, excerpt_bytes=16) as client:
                result = await client.request("GET", base + "/", headers={}, body=None, timeout=10, allowed_prefixes=None)
                await asyncio.sleep(0.3)
                return result

    result = asyncio.run(main())
    assert result.status == 200 and result.body_excerpt == b"x" * 16
    assert sent["finished"] is False


def test_a_body_within_the_cap_is_read_and_the_excerpt_is_its_start():
    body = bytes(range(256)) * 40

    async def handler(request):
        return web.Response(body=body)

    async def main():
        async with serve(handler) as base:
            async with SafeClient(allowed_networks=LOCAL, max_response_bytes=65536, excerpt_bytes=300) as client:
                return await client.request("GET", base + "/", headers={}, body=None, timeout=2, allowed_prefixes=None)

    assert asyncio.run(main()).body_excerpt == body[:300]


def test_a_slow_answer_times_out_at_the_total_limit_and_is_retryable():
    async def handler(request):
        await asyncio.sleep(5)
        return web.Response(text="late")

    async def main():
        async with serve(handler) as base:
            async with SafeClient(allowed_networks=LOCAL) as client:
                started = time.monotonic()
                result = await client.request("POST", base + "/", headers={}, body=b"x", timeout=0.3, allowed_prefixes=None)
                return result, time.monotonic() - started

    result, elapsed = asyncio.run(main())
    assert (result.status, result.outcome, result.retryable) == (None, "failed", True)
    assert result.error_class == "TimeoutError"
    assert result.error == "timed out after 0.3s"
    assert 0.25 <= elapsed < 1.5


def test_a_body_that_trickles_is_cut_off_by_the_same_total_limit():
    async def handler(request):
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        for _ in range(50):
            await response.write(b"x")
            await asyncio.sleep(0.1)
        return response

    async def main():
        async with serve(handler) as base:
            async with SafeClient(allowed_networks=LOCAL) as client:
                started = time.monotonic()
                result = await client.request("GET", base + "/", headers={}, body=None, timeout=0.4, allowed_prefixes=None)
                return result, time.monotonic() - started

    result, elapsed = asyncio.run(main())
    assert result.error_class == "TimeoutError" and result.retryable is True
    assert elapsed < 1.5


def test_connection_refused_is_retryable():
    port = free_port()

    async def main():
        async with SafeClient(allowed_networks=LOCAL) as client:
            return await client.request(
                "POST", f"http://127.0.0.1:{port}/", headers={}, body=b"x", timeout=2, allowed_prefixes=None
            )

    result = asyncio.run(main())
    assert (result.status, result.outcome, result.retryable) == (None, "failed", True)
    assert result.error_class == "ClientConnectorError"
    assert f"cannot connect to 127.0.0.1:{port}" in result.error
    assert "refused" in result.error.lower()


def test_a_name_that_does_not_resolve_is_retryable():
    async def main():
        async with SafeClient(resolver=StubResolver({})) as client:
            return await client.request(
                "GET", "http://nowhere.test/", headers={}, body=None, timeout=2, allowed_prefixes=None
            )

    result = asyncio.run(main())
    assert result.retryable is True and result.error_class == "ClientConnectorDNSError"
    assert result.error.startswith("cannot resolve nowhere.test")


def test_a_target_that_hangs_up_mid_answer_is_retryable():
    async def handler(request):
        request.transport.close()
        await asyncio.sleep(1)
        return web.Response(text="never")

    async def main():
        async with serve(handler) as base:
            async with SafeClient(allowed_networks=LOCAL) as client:
                return await client.request("POST", base + "/", headers={}, body=b"x", timeout=2, allowed_prefixes=None)

    result = asyncio.run(main())
    assert result.status is None and result.retryable is True
    assert result.error_class == "ServerDisconnectedError"


def test_cancelling_a_call_raises_cancelled_error():
    async def handler(request):
        await asyncio.sleep(5)
        return web.Response(text="late")

    async def main():
        async with serve(handler) as base:
            async with SafeClient(allowed_networks=LOCAL) as client:
                task = asyncio.ensure_future(
                    client.request("GET", base + "/", headers={}, body=None, timeout=10, allowed_prefixes=None)
                )
                await asyncio.sleep(0.1)
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    return "cancelled"
                return "returned"

    assert asyncio.run(main()) == "cancelled"


def test_no_time_left_is_a_retryable_timeout_without_a_call(connects):
    async def main():
        async with SafeClient(allowed_networks=LOCAL) as client:
            return [
                await client.request("GET", "http://127.0.0.1:9/", headers={}, body=None, timeout=t, allowed_prefixes=None)
                for t in (0, -1.5)
            ]

    for result in asyncio.run(main()):
        assert result.error_class == "TimeoutError" and result.retryable is True
    assert connects == []


def test_environment_proxies_are_ignored(monkeypatch):
    from .support import Listener

    async def handler(request):
        return web.Response(text="direct")

    async def main():
        proxy = await Listener().start()
        try:
            for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "ALL_PROXY"):
                monkeypatch.setenv(name, f"http://127.0.0.1:{proxy.port}")
            monkeypatch.delenv("NO_PROXY", raising=False)
            monkeypatch.delenv("no_proxy", raising=False)
            async with serve(handler) as base:
                async with SafeClient(allowed_networks=LOCAL) as client:
                    result = await client.request("GET", base, headers={}, body=None, timeout=2, allowed_prefixes=None)
            return result, proxy.accepted
        finally:
            await proxy.stop()

    result, accepted = asyncio.run(main())
    assert result.body_excerpt == b"direct"
    assert accepted == []
