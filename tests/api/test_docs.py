"""docs/api.md's signature snippet is what a target copies: it must accept exactly what
dispatch.signing produces and refuse tampering, a wrong secret and replays."""

import re
import time
from pathlib import Path

from dispatch import signing

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def snippet_verify():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    (code,) = [b for b in blocks if "def verify_signature" in b]
    namespace = {}
    exec(code, namespace)
    return namespace["verify_signature"]


def test_the_documented_snippet_accepts_a_real_signature_and_refuses_forgeries():
    verify = snippet_verify()
    body = b'{"report": "daily"}'
    url = "https://jobs.example.com/hooks/report"
    headers = {"Idempotency-Key": "r-1", "X-Scheduler-Run-Id": "r-1", "X-Scheduler-Generation": "2",
               "X-Scheduler-Scheduled-Time": "2026-01-01T00:00:00Z", "X-Scheduler-Schedule-Id": "s-1",
               "X-Scheduler-Schedule-Version": "3"}
    signed = {**headers, signing.HEADER: signing.sign_call("whsec_tenant", method="POST", url=url,
                                                           headers=headers, body=body)}
    assert verify("whsec_tenant", "POST", url, signed, body)
    assert not verify("whsec_other", "POST", url, signed, body)
    assert not verify("whsec_tenant", "POST", url, signed, body + b" ")
    assert not verify("whsec_tenant", "POST", url, {**signed, signing.HEADER: "garbage"}, body)
    assert not verify("whsec_tenant", "POST", url, {**headers}, body)
    stale = {**headers, signing.HEADER: signing.sign_call("whsec_tenant", method="POST", url=url, headers=headers,
                                                          body=body, timestamp=int(time.time()) - 3600)}
    assert not verify("whsec_tenant", "POST", url, stale, body)
    # Same verdicts as the scheduler's own check.
    assert signing.verify_call("whsec_tenant", method="POST", url=url, headers=signed, body=body)
    assert not signing.verify_call("whsec_tenant", method="POST", url=url, headers=stale, body=body)


def test_the_webhook_signature_check_refuses_a_stale_or_altered_body():
    body = b'{"id": 1, "kind": "run.succeeded"}'
    header = signing.sign("whsec_tenant", body)
    stale = signing.sign("whsec_tenant", body, timestamp=int(time.time()) - 3600)
    assert signing.verify("whsec_tenant", header, body)
    assert not signing.verify("whsec_tenant", stale, body) and not signing.verify("whsec_tenant", header, body + b" ")
