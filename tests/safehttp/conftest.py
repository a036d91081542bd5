"""The ``connects`` fixture records every address aiohttp tries to connect to and fails any
attempt outside loopback, so a broken check can never send a test's traffic off the machine."""

from __future__ import annotations

import ipaddress

import aiohappyeyeballs
import pytest

LOOPBACK = ipaddress.ip_network("127.0.0.0/8")


@pytest.fixture(autouse=True)
def connects(monkeypatch):
    """Every address aiohttp attempts to connect to, in order."""
    attempted: list[str] = []
    real = aiohappyeyeballs.start_connection

    async def recording(addr_infos, *args, **kwargs):
        for info in addr_infos:
            host = info[4][0]
            attempted.append(host)
            ip = ipaddress.ip_address(host.split("%")[0])
            v4 = ip.ipv4_mapped if ip.version == 6 else ip
            if not ((v4 or ip) in LOOPBACK or ip == ipaddress.ip_address("::1")):
                raise OSError(f"test safety net: refused to connect off the machine to {host}")
        return await real(addr_infos, *args, **kwargs)

    monkeypatch.setattr(aiohappyeyeballs, "start_connection", recording)
    return attempted


