"""Issue 26, finding 2: a target call's signature must bind the call. Real calls go through the
worker to a local target, and docs/api.md's own verification snippet (the code a target copies)
judges them and replays of them: re-sent as another run, under another Idempotency-Key, with
another generation or to another URL, a captured signature is refused."""

import pytest
from django.test import override_settings

from dispatch import signing
from dispatch.worker import run_worker
from runs.actions import trigger_schedule
from tests.api.test_docs import snippet_verify
from tests.helpers import ACTOR, make_schedule

pytestmark = pytest.mark.django_db(transaction=True)


def _two_calls(tenant, target):
    """Two runs of one schedule (same payload, same version), called in the same second."""
    url = target.url + "/hooks/nightly"
    schedule = make_schedule(tenant, url, expression="0 3 * * *", payload={"report": "daily"})
    trigger_schedule(schedule, by=ACTOR)
    trigger_schedule(schedule, by=ACTOR)
    assert run_worker("w-sign", once=True, poll_seconds=0)["applied"] == 2
    first, second = target.deliveries
    assert first["headers"]["Idempotency-Key"] != second["headers"]["Idempotency-Key"]
    return url, first, second


def test_signature_replay_across_runs_or_keys_is_refused(tenant, target):
    verify = snippet_verify()
    secret = tenant.signing_secret
    url, first, second = _two_calls(tenant, target)

    def check(delivery, headers=None, *, to=url, method=None):
        return verify(secret, method or delivery["method"], to, headers or delivery["headers"], delivery["body"])

    # Genuine calls pass the documented check, and the scheduler's own reference check agrees.
    for d in (first, second):
        assert check(d)
        assert signing.verify_call(secret, method=d["method"], url=url, headers=d["headers"], body=d["body"])
    # One signature per call, even for the same body in the same second.
    assert first["headers"][signing.HEADER] != second["headers"][signing.HEADER]

    replays = {
        # The first call's signature on the second run (same body, same window).
        "another run": {**second["headers"], signing.HEADER: first["headers"][signing.HEADER]},
        # The first call re-sent under a fresh key (the target would take it as a new effect).
        "another key": {**first["headers"], "Idempotency-Key": "00000000-0000-0000-0000-000000000001"},
        "another run id": {**first["headers"], "X-Scheduler-Run-Id": second["headers"]["X-Scheduler-Run-Id"]},
        # Past the fencing: a higher generation would make a stale call look like the newest.
        "another generation": {**first["headers"], "X-Scheduler-Generation": "7"},
        "another scheduled time": {**first["headers"], "X-Scheduler-Scheduled-Time": "2030-01-01T03:00:00Z"},
        "v2 removed": {**first["headers"],
                       signing.HEADER: ",".join(p for p in first["headers"][signing.HEADER].split(",")
                                                if not p.startswith("v2="))},
    }
    for why, headers in replays.items():
        assert not check(first, headers), why
        assert not signing.verify_call(secret, method="POST", url=url, headers=headers, body=first["body"]), why
    # The same call to another URL of the tenant, or with another method, is refused too.
    assert not check(first, to=target.url + "/hooks/billing")
    assert not check(first, method="PUT")
    assert not verify("whsec_wrong", "POST", url, first["headers"], first["body"])
    assert not verify(secret, "POST", url, first["headers"], first["body"] + b" ")


def test_signature_v1_is_sent_beside_v2_until_turned_off(tenant, target):
    url, first, _ = _two_calls(tenant, target)
    header = first["headers"][signing.HEADER]
    assert [p.split("=")[0] for p in header.split(",")] == ["t", "v1", "v2"]
    # v1 still verifies for targets not moved over yet (and is why they should move).
    assert signing.verify(tenant.signing_secret, header, first["body"])

    target.deliveries.clear()
    with override_settings(SCHEDULER_SIGNATURE_V1=False):
        _, only_v2, _ = _two_calls(tenant, target)
    header = only_v2["headers"][signing.HEADER]
    assert [p.split("=")[0] for p in header.split(",")] == ["t", "v2"]
    assert snippet_verify()(tenant.signing_secret, "POST", url, only_v2["headers"], only_v2["body"])
