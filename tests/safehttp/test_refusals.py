"""End-to-end refusals: each one must come back as a permanent failure without a connection."""

import asyncio

from aiohttp import web

from dispatch.safehttp import SafeClient

from .support import Listener, StubResolver, serve

LOCAL = ["127.0.0.0/8"]


async def call(client, url, *, prefixes=None, headers=None):
    return await client.request("POST", url, headers=headers or {}, body=b"{}", timeout=2, allowed_prefixes=prefixes)


async def ok(request):
    return web.Response(text="ok")


def assert_refused(result, fragment):
    assert result.outcome == "failed"
    assert result.retryable is False
    assert result.status is None
    assert result.error_class == "TargetRefused"
    assert fragment in result.error, result.error


def test_the_metadata_address_is_refused_without_connecting(connects):
    async def main():
        async with SafeClient(allowed_networks=LOCAL) as client:
            return await call(client, "http://169.254.169.254/latest/meta-data/")

    result = asyncio.run(main())
    assert_refused(result, "169.254.169.254 is a cloud metadata address")
    assert connects == []


def test_a_name_resolving_to_the_metadata_address_is_refused_without_connecting(connects):
    resolver = StubResolver({"metadata.google.internal": [["169.254.169.254"]]})

    async def main():
        async with SafeClient(allowed_networks=["169.254.0.0/16"], resolver=resolver) as client:
            return await call(client, "http://metadata.google.internal/computeMetadata/v1/")

    result = asyncio.run(main())
    assert_refused(result, "metadata.google.internal resolves only to refused addresses")
    assert resolver.lookups == ["metadata.google.internal"]
    assert connects == []


def test_a_private_address_is_refused_without_connecting(connects):
    async def main():
        async with SafeClient() as client:
            return await call(client, "http://10.0.0.1/run")

    assert_refused(asyncio.run(main()), "10.0.0.1 is a private address")
    assert connects == []


def test_an_ipv4_mapped_ipv6_literal_is_refused(connects):
    async def main():
        listener = await Listener().start()
        try:
            async with SafeClient() as client:
                return await call(client, f"http://[::ffff:127.0.0.1]:{listener.port}/"), listener.accepted
        finally:
            await listener.stop()

    result, accepted = asyncio.run(main())
    assert_refused(result, "leads to 127.0.0.1 is a loopback address")
    assert accepted == [] and connects == []


def test_numeric_spellings_of_loopback_are_refused(connects):
    async def main():
        listener = await Listener().start()
        try:
            async with SafeClient() as client:
                results = [
                    await call(client, f"http://{host}:{listener.port}/")
                    for host in ("2130706433", "0x7f000001", "127.1", "0177.0.0.1", "[::1]", "0.0.0.0")
                ]
            return results, listener.accepted
        finally:
            await listener.stop()

    results, accepted = asyncio.run(main())
    for result in results:
        assert result.error_class == "TargetRefused" and result.retryable is False, result
    assert accepted == [] and connects == []


def test_localhost_is_refused_when_loopback_is_not_allowed(connects):
    async def main():
        async with serve(ok) as base:
            port = base.rsplit(":", 1)[1]
            async with SafeClient() as client:
                return await call(client, f"http://localhost:{port}/")

    assert_refused(asyncio.run(main()), "localhost resolves only to refused addresses")
    assert connects == []


def test_localhost_connects_when_loopback_is_allowed(connects):
    async def main():
        async with serve(ok) as base:
            port = base.rsplit(":", 1)[1]
            async with SafeClient(allowed_networks=LOCAL) as client:
                return await call(client, f"http://localhost:{port}/")

    result = asyncio.run(main())
    assert result.outcome == "succeeded" and result.status == 200
    assert result.remote_address == "127.0.0.1"
    # Only the allowed IPv4 answer reaches the connector, never ::1.
    assert set(connects) == {"127.0.0.1"}


def test_an_ip_literal_never_reaches_the_resolver_so_it_is_checked_before_the_call(connects):
    # aiohttp skips the resolver for IP literals; this pins that behaviour, which is why
    # SafeClient.request checks literal hosts itself.
    resolver = StubResolver({})

    async def main():
        async with serve(ok) as base:
            async with SafeClient(allowed_networks=LOCAL, resolver=resolver) as allowed:
                first = await call(allowed, base + "/")
            async with SafeClient(resolver=resolver) as strict:
                second = await call(strict, base + "/")
            return first, second

    first, second = asyncio.run(main())
    assert first.status == 200
    assert resolver.lookups == []
    assert_refused(second, "127.0.0.1 is a loopback address")
    assert connects == ["127.0.0.1"]


def test_urls_off_the_allowlist_are_refused_before_resolution(connects):
    resolver = StubResolver({"api.example.com.evil.net": [["127.0.0.1"]]})

    async def main():
        async with SafeClient(allowed_networks=LOCAL, resolver=resolver) as client:
            return [
                await call(client, url, prefixes=["http://api.example.com"])
                for url in ("http://api.example.com.evil.net/", "http://api.example.com@evil.net/")
            ]

    for result in asyncio.run(main()):
        assert result.error_class == "TargetRefused" and result.retryable is False
    assert resolver.lookups == [] and connects == []


def test_schemes_other_than_http_and_https_are_refused(connects):
    async def main():
        async with SafeClient() as client:
            return [await call(client, url) for url in ("file:///etc/passwd", "ftp://example.com/", "gopher://x/")]

    for result in asyncio.run(main()):
        assert_refused(result, "is not allowed (only http and https)")


def test_callers_cannot_set_host_framing_or_hop_by_hop_headers(connects):
    names = ("Host", "content-length", "Transfer-Encoding", "Connection", "Keep-Alive", "TE", "Trailer", "Upgrade",
             "Expect", "Proxy-Authorization", "proxy-connection")

    async def main():
        async with serve(ok) as base:
            async with SafeClient(allowed_networks=LOCAL) as client:
                return [await call(client, base + "/", headers={name: "x"}) for name in names]

    for result in asyncio.run(main()):
        assert_refused(result, "belongs to the connection")
    assert connects == []


def test_ipv6_literals_with_a_zone_are_refused(connects):
    async def main():
        async with SafeClient() as client:
            return [await call(client, url) for url in ("http://[fe80::1%25eth0]/", "http://[fe80::1%eth0]/", "http://[::1]/")]

    for result in asyncio.run(main()):
        assert result.error_class == "TargetRefused" and result.retryable is False, result
    assert connects == []
