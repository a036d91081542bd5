"""The outbound layer holds every header of every call to the one header rule
(schedules.targets.header_problem) with the scheduler's own names allowed: a header the rule
refuses is a permanent failure before any connection, so a schedule stored before the rule
existed cannot send it either; a header it allows reaches the target byte for byte."""

import pytest

from dispatch.worker import run_worker
from runs.models import Attempt
from schedules.models import ScheduleVersion
from tests.core.test_fencing_and_leases import FAST_RETRY, one_ready_run

from .support import post, read_request, serving


def capturing(seen):
    """A keep-alive handler that records each request head and answers 200."""

    async def handler(reader, writer):
        while True:
            head, _ = await read_request(reader)
            seen.append(head)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()

    return handler


@pytest.mark.parametrize("headers, fragment", [
    ({"Transfer-Encoding": "chunked"}, "belongs to the connection"),
    ({"Keep-Alive": "timeout=5"}, "belongs to the connection"),
    ({"Upgrade": "websocket"}, "belongs to the connection"),
    ({"TE": "trailers"}, "belongs to the connection"),
    ({"Proxy-Authorization": "Basic x"}, "belongs to the connection"),
    ({"X-Note": "a\x01b"}, "U+0001"),
    ({"X-Note": "a\x7f"}, "U+007F"),
    ({"X-Note": "a\x85b"}, "U+0085"),
    ({"X-Note": "a\u2028b"}, "U+2028"),
    ({"X-Note": "\ud800"}, "U+D800"),
    ({"X-Note": "v" * 2001}, "over 2000 characters"),
    ({"X-Note": 5}, "not a string"),
    ({"X-Note": None}, "not a string"),
    ({"X-Note": "a", "x-note": "b"}, "more than once"),
    ({"Content-Type": "text/plain", "content-type": "application/json"}, "more than once"),
])
def test_a_header_the_rule_refuses_is_a_permanent_failure_without_a_connection(headers, fragment, connects):
    (result,), server = serving(capturing([]), lambda c, b: post(c, b, headers=headers))
    assert (result.error_class, result.retryable, result.sent) == ("TargetRefused", False, False)
    assert fragment in result.error, result.error
    assert server.connections == 0 and connects == []


def test_a_refused_header_is_refused_again_on_the_next_call(connects):
    # Names are remembered once allowed; a known name with a bad value must still be looked at.
    seen = []
    results, _ = serving(
        capturing(seen),
        lambda c, b: post(c, b, headers={"X-Note": "fine"}),
        lambda c, b: post(c, b, headers={"X-Note": "bad\x01"}),
        lambda c, b: post(c, b, headers={"X-Note": "fine again"}),
    )
    assert [r.error_class for r in results] == [None, "TargetRefused", None]
    assert len(seen) == 2


def test_headers_the_rule_allows_reach_the_target_as_given():
    seen = []
    headers = {"Hostname": "db-1", "X-Tab": "a\tb", "X-Text": "café", "Content-Type": "application/json",
               "Idempotency-Key": "run-1", "X-Scheduler-Run-Id": "run-1", "Authorization": "Bearer t"}
    (result,), _ = serving(capturing(seen), lambda c, b: post(c, b, headers=headers))
    assert result.status == 200
    lines = seen[0].split(b"\r\n")
    for name, value in headers.items():
        assert f"{name}: {value}".encode() in lines


@pytest.mark.django_db(transaction=True)
def test_a_schedule_stored_before_the_rule_fails_its_run_without_calling(tenant, target):
    run = one_ready_run(tenant, target, max_attempts=3, **FAST_RETRY)
    # As a row written when the API still accepted these headers.
    ScheduleVersion.objects.filter(id=run.schedule.current_id).update(
        target_headers={"Transfer-Encoding": "chunked", "X-Ok": "1"})
    run_worker("w-legacy", once=True, poll_seconds=0)
    (attempt,) = Attempt.objects.filter(run=run)
    assert (attempt.outcome, attempt.error_class) == ("failed", "TargetRefused")
    assert "'Transfer-Encoding' belongs to the connection" in attempt.error
    run.refresh_from_db()
    assert run.state == "dead"  # permanent: one attempt of three, not retried
    assert target.deliveries == []
