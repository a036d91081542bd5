"""How the portal shows times, ages, counts and changes: one place, used by the templates through
the `portal` template library (scheduler_project/web/templatetags/portal.py).

Times: every time is shown with its zone, in the zone the person chose (`TimePrefs`): UTC, the
schedule's own zone (for times that belong to a schedule or a run; others stay in UTC), or the
browser's zone, which a small script (static/portal/portal.js) puts in a cookie; until it has, or
without JavaScript, the browser choice falls back to UTC and says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from zoneinfo import ZoneInfo

from runs.stats import percentile
from schedules import timeexpr

MODE_COOKIE = "portal_tz"
BROWSER_COOKIE = "portal_browser_tz"
MODES = {
    "utc": "UTC",
    "schedule": "The schedule's zone",
    "browser": "Your browser's zone",
}
DEFAULT_MODE = "utc"
UTC = timezone.utc
FORMATS = {
    "full": "%Y-%m-%d %H:%M:%S",
    "short": "%Y-%m-%d %H:%M",
    "date": "%Y-%m-%d",
    "time": "%H:%M:%S",
    "ms": "%Y-%m-%d %H:%M:%S.%f",
}


@lru_cache(maxsize=1024)
def zone(name: str | None) -> ZoneInfo | timezone | None:
    """A zone by IANA name, or None when the name is empty or unknown (never an error: names
    come from cookies and stored versions). The time engine's own lookup: the tz database the
    runs were computed with, and only names it lists (ZoneInfo("Europe"), a folder, raised
    IsADirectoryError, and a browser-zone cookie holding it made every page a 500)."""
    if not name:
        return None
    if name == "UTC":
        return UTC
    try:
        return timeexpr.validate_time_zone(name)
    except timeexpr.ExpressionError:
        return None


@dataclass(frozen=True)
class TimePrefs:
    mode: str
    browser_zone: str | None  # the browser's IANA zone, when its script has told us

    @classmethod
    def of(cls, request) -> "TimePrefs":
        if request is None:
            return cls(DEFAULT_MODE, None)
        cached = getattr(request, "_portal_time_prefs", None)
        if cached is None:
            mode = request.COOKIES.get(MODE_COOKIE, DEFAULT_MODE)
            browser = request.COOKIES.get(BROWSER_COOKIE) or None
            cached = cls(mode if mode in MODES else DEFAULT_MODE, browser if zone(browser) else None)
            request._portal_time_prefs = cached
        return cached

    def zone_for(self, schedule_zone: str | None = None):
        """The zone a time is shown in: the chosen one, or UTC where the choice does not apply."""
        if self.mode == "schedule" and zone(schedule_zone):
            return zone(schedule_zone)
        if self.mode == "browser" and self.browser_zone:
            return zone(self.browser_zone)
        return UTC

    @property
    def fallback_note(self) -> str:
        """Said next to the choice when it cannot be honoured for every time on the page."""
        if self.mode == "browser" and not self.browser_zone:
            return "your browser has not told us its zone yet (it needs JavaScript): times are in UTC"
        if self.mode == "schedule":
            return "times that belong to no schedule are in UTC"
        return ""


def zone_abbr(dt: datetime) -> str:
    name = dt.tzname() or ""
    return "UTC" if name in ("UTC", "Z", "+00") else name


def format_in(dt: datetime, tz, fmt: str = "full") -> str:
    """`dt` as wall time in `tz`, with the zone's abbreviation (CEST, EST, +03, UTC)."""
    local = dt.astimezone(tz)
    text = local.strftime(FORMATS.get(fmt, FORMATS["full"]))
    if fmt == "ms":
        text = text[:-3]
    if fmt == "date":
        return text
    return f"{text} {zone_abbr(local)}"


def iso_utc(dt: datetime) -> str:
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ago(then: datetime | None, now: datetime | None = None) -> str:
    """How long ago, in words a person reads at a glance: "just now", "45 s", "3 min", "2 h 5 min",
    "3 days". Never "0 minutes"."""
    if then is None:
        return "—"
    now = now or datetime.now(UTC)
    seconds = (now - then).total_seconds()
    if seconds < 0:
        return "in " + duration(-seconds)
    if seconds < 5:
        return "just now"
    return duration(seconds) + " ago"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    seconds = max(0.0, float(seconds))
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{hours // 24} days"


def plural(n: int, word: str, many: str | None = None) -> str:
    """"1 run", "5 runs", "0 runs"."""
    return f"{n:,} {word if n == 1 else (many or word + 's')}"


def future_note(note: str | None) -> str:
    """A DST note, worded for an instant still to come. The time engine words its notes for what
    happened (they are stored with each occurrence): "fired at 03:00" becomes "will fire at 03:00"."""
    if not note:
        return ""
    return note.replace("fired at both", "will fire at both").replace("; fired at", "; will fire at")


# --- the audit log's changes ----------------------------------------------------------------------

LONG_VALUE = 80


@dataclass
class ChangeLine:
    field: str
    before: str | None  # None: the field was not there
    after: str | None
    long: bool  # shown folded: JSON or text longer than a line


def value_text(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, str):
        return value if value else "(empty)"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        return f"{value}"
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def masked_change(value, reveal_headers: bool):
    """An audit entry's before or after with its target header values masked as on the schedule
    pages (headers_shown) unless `reveal_headers`: a schedule's create and edit entries hold them."""
    if reveal_headers or not isinstance(value, dict) or not isinstance(value.get("target_headers"), dict):
        return value
    return {**value, "target_headers": {name: shown for name, shown, _ in headers_shown(value["target_headers"], False)}}


def change_lines(before, after, *, reveal_headers: bool = False) -> list[ChangeLine]:
    """An audit entry's before/after as one line per field: "field: old → new". Values that are
    not a dict become a single "value" line; long values are folded, never cut mid-word. Header
    values that look like credentials are masked unless `reveal_headers`."""
    before, after = masked_change(before, reveal_headers), masked_change(after, reveal_headers)
    if not isinstance(before, dict) and not isinstance(after, dict):
        if before is None and after is None:
            return []
        before, after = ({"value": before} if before is not None else {}), ({"value": after} if after is not None else {})
    before = before if isinstance(before, dict) else ({} if before is None else {"value": before})
    after = after if isinstance(after, dict) else ({} if after is None else {"value": after})
    lines = []
    for key in list(dict.fromkeys([*before, *after])):
        b = value_text(before[key]) if key in before else None
        a = value_text(after[key]) if key in after else None
        if b is not None and a is not None and b == a:
            continue
        long = any(v is not None and (len(v) > LONG_VALUE or "\n" in v) for v in (b, a))
        lines.append(ChangeLine(key.replace("_", " "), b, a, long))
    return lines


# --- per-schedule figures from ScheduleActivity.recent -------------------------------------------


@dataclass
class ScheduleFigures:
    attempts: int
    success_rate: float | None  # 0..1 over `attempts`
    p95_ms: int | None
    outcomes: list  # [(finished_at datetime, outcome code, latency ms)] oldest first
    last_outcome: str
    last_http_status: int | None
    last_finished_at: datetime | None
    last_success_at: datetime | None
    last_error: str
    last_run_id: object


def schedule_figures(row) -> ScheduleFigures | None:
    """The schedule pages' figures from its summary row (dispatch.models.ScheduleActivity)."""
    if row is None:
        return None
    recent = [(datetime.fromtimestamp(r[0], UTC), r[1], r[2]) for r in (row.recent or [])]
    counted = [r for r in recent if r[1] in ("s", "f", "u")]
    ok = sum(1 for r in counted if r[1] == "s")
    latencies = sorted(r[2] for r in counted if r[2] is not None)
    return ScheduleFigures(
        attempts=len(counted),
        success_rate=(ok / len(counted)) if counted else None,
        p95_ms=percentile(latencies, 0.95),
        outcomes=recent,
        last_outcome=row.last_outcome,
        last_http_status=row.last_http_status,
        last_finished_at=row.last_finished_at,
        last_success_at=row.last_success_at,
        last_error=row.last_error,
        last_run_id=row.last_run_id,
    )


# Header values shown masked to whoever may not edit the schedule: they are usually credentials.
SECRET_HEADER_WORDS = ("authorization", "token", "secret", "key", "cookie", "password", "signature")


def headers_shown(headers: dict, reveal: bool) -> list:
    """The target headers as (name, value, masked) rows; credentials masked unless `reveal`."""
    rows = []
    for name, value in sorted((headers or {}).items()):
        secret = any(w in name.lower() for w in SECRET_HEADER_WORDS)
        rows.append((name, value if reveal or not secret else "•••• (hidden: only people who may edit see it)",
                     secret and not reveal))
    return rows
