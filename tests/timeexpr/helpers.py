from datetime import datetime, timezone

from schedules.timeexpr import DstPolicy, parse

UTC = timezone.utc
ANCHOR = datetime(2020, 1, 1, tzinfo=UTC)


def utc(s: str) -> datetime:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).astimezone(UTC)


def run(expr, zone, start, end, policy=None, anchor=ANCHOR, limit=50):
    """[(at 'Z', local iso, dropped, note kind)] for start <= at < end."""
    rule = parse(expr, zone, anchor=anchor, dst_policy=DstPolicy.from_dict(policy) if policy else None)
    out = []
    for o in rule.between(utc(start), utc(end), limit):
        kind = o.note.split(":")[0] if o.note else None
        out.append((o.at.strftime("%Y-%m-%dT%H:%MZ"), o.local.strftime("%Y-%m-%dT%H:%M%z"), kind))
    return out


def ats(expr, zone, start, end, **kw):
    return [a for a, _, _ in run(expr, zone, start, end, **kw)]
