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
    header = signing.sign("whsec_tenant", body)
    assert verify("whsec_tenant", header, body)
    assert not verify("whsec_other", header, body)
    assert not verify("whsec_tenant", header, body + b" ")
    assert not verify("whsec_tenant", "garbage", body)
    stale = signing.sign("whsec_tenant", body, timestamp=int(time.time()) - 3600)
    assert not verify("whsec_tenant", stale, body)
    # Same verdicts as the scheduler's own check.
    assert signing.verify("whsec_tenant", header, body) and not signing.verify("whsec_tenant", stale, body)
