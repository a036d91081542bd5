"""DNS rebinding: what the resolver answered and was checked is what gets connected to.

127.0.0.2 stands in for a public address (the operator network allows exactly it) and
127.0.0.1, where a recording listener waits, for the private address a rebinding name would
switch to."""

import asyncio

from aiohttp import web

from dispatch.safehttp import SafeClient

from .support import Listener, StubResolver, serve

ALLOWED = ["127.0.0.2/32"]


async def closing_ok(request):
    # Connection: close forces a fresh connection, hence a fresh resolution, per call.
    return web.Response(text="ok", headers={"Connection": "close"})


def test_a_name_that_rebinds_to_a_refused_address_is_not_followed(connects):
    async def main():
        async with serve(closing_ok, host="127.0.0.2") as base:
            port = int(base.rsplit(":", 1)[1])
            listener = await Listener().start("127.0.0.1", port)
            resolver = StubResolver({"rebind.test": [["127.0.0.2"], ["127.0.0.1"]]})
            try:
                async with SafeClient(allowed_networks=ALLOWED, resolver=resolver, dns_ttl=0.01) as client:
                    first = await client.request(
                        "GET", f"http://rebind.test:{port}/", headers={}, body=None, timeout=2, allowed_prefixes=None
                    )
                    await asyncio.sleep(0.05)  # past the DNS cache TTL
                    second = await client.request(
                        "GET", f"http://rebind.test:{port}/", headers={}, body=None, timeout=2, allowed_prefixes=None
                    )
                return first, second, resolver.lookups, listener.accepted
            finally:
                await listener.stop()

    first, second, lookups, accepted = asyncio.run(main())
    assert first.status == 200 and first.remote_address == "127.0.0.2"
    assert lookups == ["rebind.test", "rebind.test"]
    assert second.error_class == "TargetRefused" and second.retryable is False
    assert "127.0.0.1 is a loopback address" in second.error
    assert accepted == []
    assert connects == ["127.0.0.2"]


def test_refused_answers_are_dropped_and_only_checked_ones_are_connected_to(connects):
    async def main():
        async with serve(closing_ok, host="127.0.0.2") as base:
            port = int(base.rsplit(":", 1)[1])
            listener = await Listener().start("127.0.0.1", port)
            # The refused address comes first, where happy eyeballs would try it first.
            resolver = StubResolver({"mixed.test": [["127.0.0.1", "127.0.0.2"]]})
            try:
                async with SafeClient(allowed_networks=ALLOWED, resolver=resolver) as client:
                    results = [
                        await client.request(
                            "GET", f"http://mixed.test:{port}/", headers={}, body=None, timeout=2, allowed_prefixes=None
                        )
                        for _ in range(3)
                    ]
                return results, resolver.lookups, listener.accepted
            finally:
                await listener.stop()

    results, lookups, accepted = asyncio.run(main())
    assert [r.status for r in results] == [200, 200, 200]
    assert {r.remote_address for r in results} == {"127.0.0.2"}
    # Cached answers are the filtered ones: one lookup serves all three calls.
    assert lookups == ["mixed.test"]
    assert accepted == []
    assert connects == ["127.0.0.2"] * 3
