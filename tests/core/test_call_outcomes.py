"""How the worker records a call that got no answer: unknown when the request went out (the
target may have acted), failed when it never reached the target."""

import socket

import pytest

from dispatch.worker import run_worker
from runs.models import Attempt
from schedules.tenants import create_tenant
from tests.core.test_fencing_and_leases import FAST_RETRY, one_ready_run

pytestmark = pytest.mark.django_db(transaction=True)


def test_no_answer_within_the_time_limit_after_sending_is_unknown(tenant, target):
    target.delay = 1.6
    run = one_ready_run(tenant, target, target_timeout_seconds=1, max_attempts=1, **FAST_RETRY)
    run_worker("w-slow", once=True, poll_seconds=0)
    (attempt,) = Attempt.objects.filter(run=run)
    assert (attempt.outcome, attempt.error_class, attempt.http_status) == ("unknown", "TimeoutError", None)
    assert len(target.deliveries) == 1  # it did reach the target


def test_a_refused_connection_is_failed_not_unknown(db, target):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    url = f"http://127.0.0.1:{closed_port}"
    tenant = create_tenant("closed", allow_targets=[url + "/"])

    class Nowhere:  # one_ready_run only needs the target's URL
        pass

    nowhere = Nowhere()
    nowhere.url = url
    run = one_ready_run(tenant, nowhere, max_attempts=1, **FAST_RETRY)
    run_worker("w-refused", once=True, poll_seconds=0)
    (attempt,) = Attempt.objects.filter(run=run)
    assert (attempt.outcome, attempt.error_class) == ("failed", "ClientConnectorError")
