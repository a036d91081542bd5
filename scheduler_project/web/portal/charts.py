"""The dashboard's charts and the schedules' sparklines: read from the pre-aggregated activity
rows (dispatch.models, filled by dispatch.activity) and drawn as inline SVG on the server, so they
need no script, no CDN and no request of their own, and a page costs the same on a long history.

Cost of the reads: `activity_minute_unique` (tenant_id, minute), one range per tenant in view
(operators read the all-tenants rows): at most 60 rows per tenant for the hour, 1,440 for the day.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from django.utils.html import format_html
from django.utils.safestring import mark_safe

from dispatch.models import ALL_TENANTS, LAG_BOUNDS, ActivityMinute
from scheduler_project.web.portal.display import duration, format_in

RANGES = {
    # name: (window, bucket)
    "hour": (timedelta(hours=1), timedelta(minutes=1)),
    "day": (timedelta(days=1), timedelta(minutes=10)),
}
DEFAULT_RANGE = "hour"


@dataclass
class Point:
    start: datetime
    succeeded: int = 0
    failed: int = 0
    unknown: int = 0
    lag: list = field(default_factory=lambda: [0] * (len(LAG_BOUNDS) + 1))

    @property
    def total(self) -> int:
        return self.succeeded + self.failed + self.unknown

    @property
    def p50(self):
        return lag_percentile(self.lag, 0.5)

    @property
    def p99(self):
        return lag_percentile(self.lag, 0.99)


@dataclass
class Series:
    name: str
    window: timedelta
    bucket: timedelta
    points: list
    now: datetime

    @property
    def succeeded(self) -> int:
        return sum(p.succeeded for p in self.points)

    @property
    def failed(self) -> int:
        return sum(p.failed for p in self.points)

    @property
    def unknown(self) -> int:
        return sum(p.unknown for p in self.points)

    def _lag(self):
        total = [0] * (len(LAG_BOUNDS) + 1)
        for p in self.points:
            total = [a + b for a, b in zip(total, p.lag)]
        return total

    @property
    def starts(self) -> int:
        return sum(self._lag())

    @property
    def p50(self):
        return lag_percentile(self._lag(), 0.5)

    @property
    def p99(self):
        return lag_percentile(self._lag(), 0.99)

    @property
    def bucket_label(self) -> str:
        minutes = int(self.bucket.total_seconds() // 60)
        return "per minute" if minutes == 1 else f"per {minutes} minutes"


def lag_percentile(counts: list, q: float):
    """The upper bound of the histogram bucket holding the q-th start (nearest rank): the lag is
    at most this. Above the last bound: the last bound (shown as "over")."""
    n = sum(counts)
    if not n:
        return None
    rank = max(1, math.ceil(q * n))
    seen = 0
    for i, c in enumerate(counts):
        seen += c
        if seen >= rank:
            return LAG_BOUNDS[min(i, len(LAG_BOUNDS) - 1)]
    return LAG_BOUNDS[-1]


def series(tenant_ids, now: datetime, name: str = DEFAULT_RANGE) -> Series:
    """The range's points, oldest first, for the tenants in view (None: every tenant)."""
    window, bucket = RANGES.get(name, RANGES[DEFAULT_RANGE])
    step = int(bucket.total_seconds())
    end = now.astimezone(timezone.utc).replace(second=0, microsecond=0) + timedelta(minutes=1)
    end = datetime.fromtimestamp(math.ceil(end.timestamp() / step) * step, timezone.utc)
    start = end - window
    points = [Point(start + i * bucket) for i in range(int(window / bucket))]
    ids = [ALL_TENANTS] if tenant_ids is None else list(tenant_ids)
    rows = ActivityMinute.objects.filter(tenant_id__in=ids, minute__gte=start, minute__lt=end).values_list(
        "minute", "succeeded", "failed", "unknown", "lag_counts")
    for minute, ok, failed, unknown, lag in rows:
        i = int((minute - start).total_seconds() // step)
        if not 0 <= i < len(points):
            continue
        p = points[i]
        p.succeeded += ok
        p.failed += failed
        p.unknown += unknown
        if lag:
            p.lag = [a + b for a, b in zip(p.lag, lag)]
    return Series(name, window, bucket, points, now)


# --- drawing ---------------------------------------------------------------------------------

W, H = 480, 190
LEFT, RIGHT, TOP, BOTTOM = 46, 6, 10, 24


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1
    exp = 10 ** math.floor(math.log10(value))
    for m in (1, 2, 2.5, 5, 10):
        if value <= m * exp:
            return m * exp
    return 10 * exp


# Each label's text at most, so neighbours a quarter of the chart apart never overlap (a 12-unit
# font in the 480-unit viewBox is about 7 units a character; a quarter of the plot is 107).
MAX_LABEL_CHARS = 11


def _label_texts(s: Series, tz, indexes: list) -> list:
    """Wall times; the day's first label carries its date too (a date on a middle label would
    reach the first one), and the last names the zone."""
    out = []
    for k, i in enumerate(indexes):
        full = format_in(s.points[i].start, tz, "short")  # "2026-03-08 14:30 CET"
        out.append(f"{full[5:10]} {full[11:16]}" if k == 0 and s.name != "hour" else full[11:16])
    zone = format_in(s.points[indexes[-1]].start, tz, "short")[17:]
    if zone and len(out[-1]) + 1 + len(zone) <= MAX_LABEL_CHARS:
        out[-1] = f"{out[-1]} {zone}"
    return out


def _x_labels(s: Series, tz, plot_w: float) -> str:
    """Five time labels under the bars (whole quarters of the range, then the last); the first
    and last kept inside the chart."""
    out = []
    n = len(s.points)
    ticks = 4
    indexes = [min(n - 1, k * n // ticks) for k in range(ticks + 1)]
    for k, (i, text) in enumerate(zip(indexes, _label_texts(s, tz, indexes))):
        x = LEFT + (i + 0.5) * plot_w / n
        anchor = "start" if k == 0 else ("end" if k == ticks else "middle")
        if k == 0:
            x = LEFT
        elif k == ticks:
            x = W - RIGHT
        out.append(format_html('<text class="axis" x="{}" y="{}" text-anchor="{}">{}</text>',
                               f"{x:.1f}", H - 6, anchor, text))
    return "".join(out)


def outcome_chart(s: Series, tz) -> str:
    """Stacked bars: succeeded, failed and unknown attempts per bucket."""
    plot_w, plot_h = W - LEFT - RIGHT, H - TOP - BOTTOM
    top = _nice_max(max((p.total for p in s.points), default=0))
    n = len(s.points)
    bw = plot_w / n
    parts = [format_html(
        '<svg class="chart" viewBox="0 0 {} {}" role="img" aria-labelledby="{}-t {}-d">'
        '<title id="{}-t">Attempts {}, last {}</title><desc id="{}-d">{} succeeded, {} failed, {} unknown</desc>',
        W, H, f"oc-{s.name}", f"oc-{s.name}", f"oc-{s.name}", s.bucket_label, s.name, f"oc-{s.name}",
        s.succeeded, s.failed, s.unknown)]
    for frac in (0, 0.5, 1):
        y = TOP + plot_h * (1 - frac)
        parts.append(format_html('<line class="grid" x1="{}" x2="{}" y1="{}" y2="{}"/>'
                                 '<text class="axis" x="{}" y="{}" text-anchor="end">{}</text>',
                                 LEFT, W - RIGHT, f"{y:.1f}", f"{y:.1f}", LEFT - 4, f"{y + 4:.1f}",
                                 _count(top * frac)))
    for i, p in enumerate(s.points):
        if not p.total:
            continue
        x = LEFT + i * bw + bw * 0.1
        y = TOP + plot_h
        for cls, value in (("ok", p.succeeded), ("bad", p.failed), ("unk", p.unknown)):
            if not value:
                continue
            h = plot_h * value / top
            y -= h
            parts.append(format_html(
                '<rect class="{}" x="{}" y="{}" width="{}" height="{}"><title>{}: {} {}</title></rect>',
                cls, f"{x:.1f}", f"{y:.1f}", f"{max(bw * 0.8, 0.8):.1f}", f"{max(h, 0.5):.1f}",
                format_in(p.start, tz, "short"), value, {"ok": "succeeded", "bad": "failed", "unk": "unknown"}[cls]))
    parts.append(_x_labels(s, tz, plot_w))
    parts.append("</svg>")
    return mark_safe("".join(parts))


def _count(v: float) -> str:
    return f"{v:,.0f}" if v >= 10 or v == int(v) else f"{v:.1f}"


LAG_TICKS = ((0.1, "100ms"), (1, "1s"), (10, "10s"), (60, "1min"), (600, "10min"), (3600, "1h"))


def lag_chart(s: Series, tz) -> str:
    """p50 and p99 start lag per bucket, on a log scale from 50 ms to an hour."""
    plot_w, plot_h = W - LEFT - RIGHT, H - TOP - BOTTOM
    lo, hi = math.log10(LAG_BOUNDS[0]), math.log10(LAG_BOUNDS[-1])
    n = len(s.points)

    def y_of(v):
        v = min(max(v, LAG_BOUNDS[0]), LAG_BOUNDS[-1])
        return TOP + plot_h * (1 - (math.log10(v) - lo) / (hi - lo))

    parts = [format_html(
        '<svg class="chart" viewBox="0 0 {} {}" role="img" aria-labelledby="{}-t {}-d">'
        '<title id="{}-t">Start lag p50 and p99, {}, last {}</title><desc id="{}-d">over {} starts: p50 at most {}, '
        'p99 at most {}</desc>',
        W, H, f"lag-{s.name}", f"lag-{s.name}", f"lag-{s.name}", s.bucket_label, s.name, f"lag-{s.name}",
        s.starts, duration(s.p50), duration(s.p99))]
    for t, label in LAG_TICKS:
        y = y_of(t)
        parts.append(format_html('<line class="grid" x1="{}" x2="{}" y1="{}" y2="{}"/>'
                                 '<text class="axis" x="{}" y="{}" text-anchor="end">{}</text>',
                                 LEFT, W - RIGHT, f"{y:.1f}", f"{y:.1f}", LEFT - 4, f"{y + 4:.1f}", label))
    for cls, attr in (("p99", "p99"), ("p50", "p50")):
        segments, current = [], []
        for i, p in enumerate(s.points):
            v = getattr(p, attr)
            if v is None:
                if current:
                    segments.append(current)
                current = []
                continue
            current.append((LEFT + (i + 0.5) * plot_w / n, y_of(v)))
        if current:
            segments.append(current)
        for seg in segments:
            if len(seg) == 1:
                x, y = seg[0]
                parts.append(format_html('<circle class="{}" cx="{}" cy="{}" r="2.5"/>', cls, f"{x:.1f}", f"{y:.1f}"))
            else:
                pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in seg)
                parts.append(format_html('<polyline class="{}" points="{}"/>', cls, pts))
    parts.append(_x_labels(s, tz, plot_w))
    parts.append("</svg>")
    return mark_safe("".join(parts))


SPARK_W, SPARK_H = 150, 20
OUTCOME_WORDS = {"s": "succeeded", "f": "failed", "u": "unknown", "a": "abandoned"}


def sparkline(outcomes: list, tz, *, slots: int = 50) -> str:
    """One bar per attempt, newest on the right: green succeeded, red failed, amber unknown; the
    bar's height is its latency relative to the slowest shown (a failure without an answer is
    drawn full height)."""
    if not outcomes:
        return ""
    shown = outcomes[-slots:]
    slowest = max((o[2] for o in shown if o[2]), default=0) or 1
    bw = SPARK_W / slots
    summary = ", ".join(f"{sum(1 for o in shown if o[1] == c)} {w}" for c, w in OUTCOME_WORDS.items()
                        if any(o[1] == c for o in shown))
    parts = [format_html('<svg class="spark" viewBox="0 0 {} {}" role="img" aria-label="{}">', SPARK_W, SPARK_H,
                         f"last {len(shown)} attempts: {summary}")]
    offset = slots - len(shown)
    parts.append(format_html('<rect class="track" x="0" y="{}" width="{}" height="1"/>', SPARK_H - 1, SPARK_W))
    for i, (at, code, latency) in enumerate(shown):
        h = SPARK_H * (0.35 + 0.65 * (latency / slowest)) if latency and code == "s" else SPARK_H
        x = (offset + i) * bw
        parts.append(format_html('<rect class="{}" x="{}" y="{}" width="{}" height="{}"><title>{}: {}{}</title></rect>',
                                 {"s": "ok", "f": "bad", "u": "unk"}.get(code, "other"), f"{x:.1f}",
                                 f"{SPARK_H - h:.1f}", f"{max(bw - 1, 1):.1f}", f"{h:.1f}", format_in(at, tz),
                                 OUTCOME_WORDS.get(code, code), f", {latency} ms" if latency is not None else ""))
    parts.append("</svg>")
    return mark_safe("".join(parts))

