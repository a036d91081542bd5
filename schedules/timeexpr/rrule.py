"""RRULE (RFC 5545) rules: dateutil generates naive wall times; we resolve them ourselves."""

from __future__ import annotations

def parse_rrule(text, zone, policy, anchor):
    from .types import ExpressionError

    raise ExpressionError("RRULE support is not available yet")
