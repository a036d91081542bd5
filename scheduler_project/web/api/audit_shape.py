"""Audit entries in the API's own shape. The log stores what each service wrote: a schedule's
fields by their model names (`target_url`, `max_attempts`), other changes with snake_case keys
(`max_concurrency`), times as `+00:00`. The API answers with what its other objects use: camelCase
keys, a schedule's fields grouped as a schedule reads (`target.url`, `retryPolicy.maxAttempts`),
times in UTC with `Z`. Converted when read, so entries written before keep their meaning.

Only the top-level keys are renamed: a payload's keys and a target's header names are the
client's own and are given back as they were sent."""

import re

# A schedule's versioned fields (schedules.services.VERSIONED_DEFAULTS) -> (group or None, API name).
SCHEDULE_FIELDS = {
    "target_url": ("target", "url"),
    "target_method": ("target", "method"),
    "target_headers": ("target", "headers"),
    "target_timeout_seconds": ("target", "timeoutSeconds"),
    "max_attempts": ("retryPolicy", "maxAttempts"),
    "backoff_base_seconds": ("retryPolicy", "backoffBaseSeconds"),
    "backoff_max_seconds": ("retryPolicy", "backoffMaxSeconds"),
    "dst_skipped": ("dstPolicy", "skipped"),
    "dst_repeated": ("dstPolicy", "repeated"),
}
# Values under these (API) names are instants, written by isoformat().
TIME_KEYS = frozenset({"startAt", "endAt", "from", "to", "nextRunAt", "until"})
_UTC_SUFFIX = re.compile(r"\+00:00$")


def camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _time(value):
    return _UTC_SUFFIX.sub("Z", value) if isinstance(value, str) else value


def audit_value(value):
    """A stored `before` or `after` as the API shows it."""
    if not isinstance(value, dict):
        return value
    out: dict = {}
    for key, item in value.items():
        if key in SCHEDULE_FIELDS:
            group, name = SCHEDULE_FIELDS[key]
            out.setdefault(group, {})[name] = item
            continue
        name = camel(key)
        out[name] = _time(item) if name in TIME_KEYS else item
    return out
