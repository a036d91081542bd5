"""The ``connects`` fixture records every address the transport tries to connect to and fails
any attempt outside loopback, so a broken check can never send a test's traffic off the machine."""

from __future__ import annotations

import ipaddress

import pytest

from dispatch import http1

LOOPBACK = ipaddress.ip_network("127.0.0.0/8")


@pytest.fixture(autouse=True)
def connects(monkeypatch):
    """Every address the transport attempts to connect to, in order."""
    attempted: list[str] = []
    real = http1.open_connection

    async def recording(loop, factory, ip, port, **kwargs):
        attempted.append(ip)
        addr = ipaddress.ip_address(ip.split("%")[0])
        v4 = addr.ipv4_mapped if addr.version == 6 else addr
        if not ((v4 or addr) in LOOPBACK or addr == ipaddress.ip_address("::1")):
            raise OSError(f"test safety net: refused to connect off the machine to {ip}")
        return await real(loop, factory, ip, port, **kwargs)

    monkeypatch.setattr(http1, "open_connection", recording)
    return attempted
