"""OpenTelemetry export (dispatch/tracing.py): configured through the SDK's environment variables,
the scheduler exports materialise, claim, call and complete spans, the call span with exactly the
ids of the traceparent the target received; unconfigured, OpenTelemetry is never imported."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from dispatch import tracing
from dispatch.worker import run_worker
from runs.models import Attempt, RunState
from tests.core.test_fencing_and_leases import FAST_RETRY, one_ready_run

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    tracing.install(exporter, simple=True)
    yield exporter
    tracing.uninstall()


@pytest.mark.django_db(transaction=True)
def test_configured_it_exports_the_four_kinds_of_span_with_the_calls_own_ids(spans, tenant, target):
    statuses = iter([503, 200])
    target.responder = lambda delivery: (next(statuses), b"{}")
    run = one_ready_run(tenant, target, max_attempts=2, **FAST_RETRY)  # the scan: a materialise span
    for _ in range(40):
        run_worker("w-otel", once=True, poll_seconds=0)
        run.refresh_from_db()
        if run.state == RunState.SUCCEEDED:
            break
        time.sleep(0.02)
    assert run.state == RunState.SUCCEEDED
    finished = spans.get_finished_spans()
    names = {s.name for s in finished}
    assert {"scheduler.materialise", "scheduler.claim", "scheduler.call", "scheduler.complete"} <= names
    calls = [s for s in finished if s.name == "scheduler.call"]
    sent = [d["headers"]["traceparent"] for d in target.deliveries]
    assert len(calls) == 2 == len(sent)
    attempts = {a.id: a for a in Attempt.objects.filter(run=run)}
    for s, parent in zip(sorted(calls, key=lambda s: s.start_time), sent):
        ctx = s.get_span_context()
        assert f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-01" == parent
        assert ctx.span_id in attempts and ctx.trace_id == run.id.int
        assert s.end_time >= s.start_time
    outcomes = sorted((s.attributes["scheduler.outcome"], s.attributes.get("http.response.status_code")) for s in calls)
    assert outcomes == [("failed", 503), ("succeeded", 200)]
    claims = [s for s in finished if s.name == "scheduler.claim" and s.attributes["scheduler.runs"]]
    assert sum(s.attributes["scheduler.runs"] for s in claims) == 2
    # Batch spans have traces of their own, never a run's.
    assert all(s.get_span_context().trace_id != run.id.int for s in finished if s.name != "scheduler.call")


def test_which_environments_configure_it():
    assert not tracing.configured({})
    assert tracing.configured({"OTEL_TRACES_EXPORTER": "console"})
    assert tracing.configured({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert tracing.configured({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"})
    assert not tracing.configured({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"})
    assert not tracing.configured({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"})


def test_unconfigured_nothing_of_opentelemetry_is_imported():
    """In a fresh process, as a worker starts: the worker module, a step's span, a call's span."""
    code = (
        "import django, sys; django.setup()\n"
        "from dispatch import tracing, worker, loops\n"
        "with tracing.span('claim', asked=1) as t: t['runs'] = 0\n"
        "tracing.call('00000000-0000-4000-8000-000000000001', 1, start_ns=0, end_ns=1, method='POST', url='x',"
        " outcome='succeeded', http_status=200, generation=1)\n"
        "assert not tracing.enabled()\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.setdefault("DJANGO_SETTINGS_MODULE", "scheduler_project.settings_test")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
