"""One hostile target cannot take CPU or memory from other calls.

Hostile targets (tests/safehttp/hostile.py: answers that never end, each in its own way) run in
a child process, so their sending costs this process nothing; a healthy target runs here. One
SafeClient, used as the worker uses it (many calls in flight on one event loop), calls both at
once for a few seconds. The healthy calls must all get their own answers, promptly, while the
hostile ones are being fought off; each hostile call must end as the failure its kind calls for,
within its deadline; and the process must not grow.
"""

import asyncio

import pytest

from .hostile import fight, hostile_targets

HOSTILE_TIMEOUT = 2.0
SECONDS = 3.0  # of calls; the slow kinds are in flight for all of it
HOSTILE_CALLERS = 3  # concurrent callers per hostile kind
HEALTHY_CALLERS = 20

TOO_LARGE = (None, "ResponseTooLarge")
TIMEOUT = (None, "TimeoutError")

# kind -> the (status, error class) pairs its calls may end with.
EXPECTED = {
    "endless_trailer": {TOO_LARGE},
    "endless_trailer_lines": {TOO_LARGE},
    "endless_chunk_extension": {TOO_LARGE},
    "endless_header": {TOO_LARGE},
    "endless_header_lines": {TOO_LARGE},
    "tiny_chunks": {TOO_LARGE},
    "informational_flood": {TOO_LARGE},
    # Its bytes reach the budget or its deadline comes first, depending on how fast the busy
    # child process gets them out.
    "byte_by_byte_trailer": {TOO_LARGE, TIMEOUT},
    "huge_content_length": {(None, "ClientResponseError")},
    "slow_header": {TIMEOUT},
    "slow_trailer": {TIMEOUT},
    # The body cap: the target answered 200; the rest of its endless body is not read.
    "endless_body": {(200, None)},
}


def run(main, loop_kind):
    if loop_kind == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(main)
    return asyncio.run(main)


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])  # the worker runs on uvloop
def test_healthy_calls_keep_their_answers_and_pace_beside_hostile_targets(loop_kind):
    with hostile_targets() as urls:
        got = run(fight(urls, kinds=EXPECTED, seconds=SECONDS, hostile_timeout=HOSTILE_TIMEOUT,
                        hostile_callers=HOSTILE_CALLERS, healthy_callers=HEALTHY_CALLERS), loop_kind)

    # Healthy: every call answered with its own answer, none slowed to anything near a timeout.
    assert len(got.healthy) >= 200, len(got.healthy)
    wrong = [(n, r.status, r.error_class, r.body_excerpt) for n, _, _, r in got.healthy
             if (r.status, r.body_excerpt) != (200, n.encode())]
    assert wrong == []
    # A busy host may take the CPU from this process for a while: no client can end a call
    # sooner than it runs again, so that stall is added to each bound. A loop held by the
    # client's own work is CPU time, and is not excused.
    stall = got.off_cpu_stall
    slowest = max(ended - started for _, started, ended, _ in got.healthy)
    assert slowest < 2.0 + stall, (slowest, stall)
    # ...and they ran while the hostile calls were being fought off, not after.
    hostile_start = min(started for _, started, _, _ in got.hostile)
    hostile_end = max(ended for _, _, ended, _ in got.hostile)
    assert all(hostile_start <= started and ended <= hostile_end for _, started, ended, _ in got.healthy)

    # Hostile: each call ended as its kind calls for, within its deadline.
    for kind, expected in EXPECTED.items():
        calls = [(ended - started, (r.status, r.error_class)) for k, started, ended, r in got.hostile if k == kind]
        assert len(calls) >= HOSTILE_CALLERS, kind
        assert {outcome for _, outcome in calls} <= expected, (kind, calls[:3])
        assert max(elapsed for elapsed, _ in calls) < HOSTILE_TIMEOUT + 0.5 + stall, (kind, stall)

    # Memory: the peak resident size while fighting stays near where it started.
    assert got.rss_growth < 50 * 2**20, got.rss_growth / 2**20
