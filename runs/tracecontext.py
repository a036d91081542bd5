"""W3C Trace Context (https://www.w3.org/TR/trace-context/) for target calls: one trace per run,
one span per attempt, so a call can be found in the target's own tracing tool.

Both ids are ones the database already keeps, so nothing new is stored and every place that shows
them (the worker's header, the API's attempt, the portal's run page) derives the same value:
- the trace id is the run's id, a random 128-bit UUID, as 32 hex digits: the same on every retry;
- the span id is the attempt's id (its bigint primary key, never 0, never reused by PostgreSQL's
  sequence) as 16 hex digits: a new one per attempt.
The flags say "sampled" (01): the scheduler records every attempt.
"""

VERSION = "00"
SAMPLED = "01"
HEADER = "traceparent"
STATE_HEADER = "tracestate"


def trace_id(run_id) -> str:
    """The run's id (a UUID, or its text with hyphens) as a trace id."""
    return str(run_id).replace("-", "")


def span_id(attempt_id: int) -> str:
    return f"{attempt_id:016x}"


def traceparent(run_id, attempt_id: int) -> str:
    return f"{VERSION}-{trace_id(run_id)}-{span_id(attempt_id)}-{SAMPLED}"
