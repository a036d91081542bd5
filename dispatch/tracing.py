"""OpenTelemetry spans of the scheduler's own work, exported when the OpenTelemetry SDK is
installed and configured through its standard environment variables; otherwise nothing.

Configured means OTEL_TRACES_EXPORTER names an exporter (`otlp`, `console`; `none` turns it off),
or an OTLP endpoint is set (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT),
and OTEL_SDK_DISABLED is not `true`. The SDK's own variables then apply as usual: the service
name and resource attributes (OTEL_SERVICE_NAME, default "durable-scheduler";
OTEL_RESOURCE_ATTRIBUTES), the OTLP endpoint, headers and protocol (OTEL_EXPORTER_OTLP_*), the
batch processor's OTEL_BSP_*. Unconfigured, or without the SDK, `enabled()` is False after one
look at the environment and this module never imports OpenTelemetry: the hot path pays one
function call per step.

Spans: `materialise` (one scanner transaction), `claim` (one worker claim batch), `complete` (one
batch of results written), each in a trace of its own; and `call`, one per attempt, whose trace
and span ids are exactly the `traceparent` the call sent (runs.tracecontext: the run's trace, the
attempt's span), so the target's spans hang below it in the same trace.
"""

import logging
import os
import threading
import time
from contextlib import contextmanager

log = logging.getLogger("scheduler.tracing")

_decided = False
_tracer = None
_lock = threading.Lock()
# The ids the next span started on this thread takes (the call span's), read by _Ids.
_pending = threading.local()


def configured(env=os.environ) -> bool:
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters == "none":
        return False
    return bool(exporters or env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def _exporter(name: str):
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if name == "otlp":
        protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                    or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf")
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        return OTLPSpanExporter()
    raise ValueError(f"OTEL_TRACES_EXPORTER {name!r} is not one this scheduler knows (otlp, console, none)")


def install(exporter=None, *, simple: bool = False):
    """Set up the tracer: with `exporter`, that one (tests), else those the environment names.
    Returns the tracer, or None when the SDK or an exporter package is missing (logged once)."""
    global _tracer, _decided
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        ids = _id_generator()
        attrs = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "durable-scheduler"}
        provider = TracerProvider(resource=Resource.create(attrs), id_generator=ids)
        exporters = [exporter] if exporter is not None else [
            _exporter(n.strip()) for n in (os.environ.get("OTEL_TRACES_EXPORTER") or "otlp").lower().split(",")
            if n.strip()]
        for e in exporters:
            provider.add_span_processor(SimpleSpanProcessor(e) if simple else BatchSpanProcessor(e))
        _tracer = provider.get_tracer("durable-scheduler")
    except (ImportError, ValueError) as exc:
        log.warning("OpenTelemetry is configured but cannot be used (%s); no spans are exported", exc)
        _tracer = None
    _decided = True
    return _tracer


def uninstall() -> None:
    global _tracer, _decided
    _tracer, _decided = None, False


def _id_generator():
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class Ids(RandomIdGenerator):
        """The call span's ids are the traceparent's; every other span's are random."""

        def generate_trace_id(self) -> int:
            given = getattr(_pending, "ids", None)
            return given[0] if given else super().generate_trace_id()

        def generate_span_id(self) -> int:
            given = getattr(_pending, "ids", None)
            return given[1] if given else super().generate_span_id()

    return Ids()


def tracer():
    """The tracer, or None (decided once, from the environment)."""
    if not _decided:
        with _lock:
            if not _decided:
                if configured():
                    install()
                else:
                    globals()["_decided"] = True
    return _tracer


def enabled() -> bool:
    return tracer() is not None


class _Null:
    def __enter__(self):
        return {}

    def __exit__(self, *exc):
        return False


_NULL = _Null()


def span(name: str, **attributes):
    """A context manager timing one batch step as a span; it yields a dict whose entries are added
    as attributes at the end (e.g. how many runs the step handled). Off: a shared no-op."""
    if tracer() is None:
        return _NULL
    return _span(name, attributes)


@contextmanager
def _span(name: str, attributes: dict):
    start = time.time_ns()
    extra: dict = {}
    failed = None
    try:
        yield extra
    except BaseException as exc:
        failed = exc
        raise
    finally:
        s = _tracer.start_span(f"scheduler.{name}", start_time=start,
                               attributes={f"scheduler.{k}": v for k, v in {**attributes, **extra}.items()})
        if failed is not None:
            s.record_exception(failed)
            _set_error(s, type(failed).__name__)
        s.end()


def _set_error(s, description: str) -> None:
    from opentelemetry.trace import Status, StatusCode

    s.set_status(Status(StatusCode.ERROR, description))


def call(run_key: str, attempt_id: int, *, start_ns: int, end_ns: int, method: str, url: str,
         outcome: str, http_status, generation: int, error_class: str = "") -> None:
    """The span of one attempt's call, with the ids its traceparent carried."""
    t = tracer()
    if t is None:
        return
    from opentelemetry.trace import SpanKind

    _pending.ids = (int(run_key.replace("-", ""), 16), attempt_id)
    try:
        s = t.start_span("scheduler.call", kind=SpanKind.CLIENT, start_time=start_ns, attributes={
            "http.request.method": method, "url.full": url, "scheduler.run_id": run_key,
            "scheduler.generation": generation, "scheduler.outcome": outcome,
            **({"http.response.status_code": http_status} if http_status is not None else {}),
            **({"error.type": error_class} if error_class else {}),
        })
    finally:
        _pending.ids = None
    if outcome != "succeeded":
        _set_error(s, error_class or outcome)
    s.end(end_time=end_ns)
