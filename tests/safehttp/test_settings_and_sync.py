"""client_from_settings and request_sync: the two entry points outside the worker loop."""

import asyncio
import ipaddress
import types

import django.conf
import pytest
from aiohttp import web

from dispatch.safehttp import SafeClient, client_from_settings, request_sync

from .support import serve


def fake_settings(monkeypatch, **values):
    # Swapping the settings object keeps these tests free of Django configuration, so they run
    # the same with or without pytest-django.
    monkeypatch.setattr(django.conf, "settings", types.SimpleNamespace(**values))


def test_client_from_settings_reads_networks_and_byte_limits(monkeypatch):
    fake_settings(
        monkeypatch,
        SCHEDULER_TARGET_ALLOWED_NETWORKS=["127.0.0.0/8", "fd00::/8"],
        SCHEDULER_MAX_RESPONSE_BYTES=5000,
        SCHEDULER_RESPONSE_EXCERPT_BYTES=100,
    )
    client = client_from_settings()
    assert client.policy.networks == (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("fd00::/8"))
    assert (client.max_response_bytes, client.excerpt_bytes) == (5000, 100)


def test_client_from_settings_takes_overrides(monkeypatch):
    fake_settings(
        monkeypatch,
        SCHEDULER_TARGET_ALLOWED_NETWORKS=[],
        SCHEDULER_MAX_RESPONSE_BYTES=5000,
        SCHEDULER_RESPONSE_EXCERPT_BYTES=100,
    )
    client = client_from_settings(excerpt_bytes=10, limit=5)
    assert client.excerpt_bytes == 10 and client.policy.networks == ()


def test_client_from_settings_refuses_a_bad_network(monkeypatch):
    fake_settings(
        monkeypatch,
        SCHEDULER_TARGET_ALLOWED_NETWORKS=["10.0.0.1/8"],
        SCHEDULER_MAX_RESPONSE_BYTES=5000,
        SCHEDULER_RESPONSE_EXCERPT_BYTES=100,
    )
    with pytest.raises(ValueError, match="did you mean 10.0.0.0/8"):
        client_from_settings()


def test_request_sync_makes_one_call_on_a_fresh_client():
    # The server runs in its own thread and loop because request_sync owns the calling thread's.
    import threading

    ready = threading.Event()
    state = {}

    async def handler(request):
        return web.Response(status=201, text="made")

    def run_server():
        async def main():
            async with serve(handler) as base:
                state["base"] = base
                state["stop"] = asyncio.Event()
                ready.set()
                await state["stop"].wait()

        state["loop"] = asyncio.new_event_loop()
        state["loop"].run_until_complete(main())

    thread = threading.Thread(target=run_server, daemon=True)
    thread.start()
    assert ready.wait(5)
    try:
        result = request_sync(
            "POST",
            state["base"] + "/x",
            headers={},
            body=b"{}",
            timeout=2,
            allowed_prefixes=[state["base"]],
            allowed_networks=["127.0.0.0/8"],
        )
        refused = request_sync("GET", state["base"] + "/x", headers={}, body=None, timeout=2, allowed_prefixes=None)
    finally:
        state["loop"].call_soon_threadsafe(state["stop"].set)
        thread.join(5)
    assert (result.status, result.outcome, result.body_excerpt) == (201, "succeeded", b"made")
    assert refused.error_class == "TargetRefused"


def test_a_client_works_without_async_with_and_closes_idempotently():
    async def handler(request):
        return web.Response(text="ok")

    async def main():
        async with serve(handler) as base:
            client = SafeClient(allowed_networks=["127.0.0.0/8"])
            result = await client.request("GET", base, headers={}, body=None, timeout=2, allowed_prefixes=None)
            await client.close()
            await client.close()
            return result

    assert asyncio.run(main()).status == 200


def test_negative_byte_limits_are_rejected():
    with pytest.raises(ValueError):
        SafeClient(max_response_bytes=-1)
