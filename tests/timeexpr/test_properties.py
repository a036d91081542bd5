"""Properties over many zones and years 1990-2040.

What the sub-daily spacing test asserts, precisely: for '*/15 * * * *' two consecutive
occurrences are exactly 15 real minutes apart unless the UTC offset differs between them; when
it differs by d, they are 15 minutes - d apart, or (when the wall clock jumped over the matching
minutes) the next wall-time match after the jump, i.e. the gap is less than 15 minutes plus |d|.
"""

import zoneinfo
from datetime import date, datetime, timedelta, timezone

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from schedules.timeexpr import parse, validate_time_zone

UTC = timezone.utc
ANCHOR = datetime(1989, 1, 1, tzinfo=UTC)
# 'localtime' and friends are not IANA names; the tzdata package lacks them.
ZONES = sorted(z for z in zoneinfo.available_timezones() if "/" in z or z in ("UTC",))

zones = st.sampled_from(ZONES)
starts = st.datetimes(min_value=datetime(1990, 1, 1), max_value=datetime(2040, 12, 1)).map(
    lambda d: d.replace(tzinfo=UTC))
hours = st.integers(0, 23)
minutes = st.sampled_from([0, 15, 30, 45])

FAST = settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def _walk(rule, start, n):
    out, t = [], start
    for _ in range(n):
        occ = rule.next_after(t)
        if occ is None:
            break
        out.append(occ)
        t = occ.at
    return out


@FAST
@given(zones, starts, hours, minutes, st.sampled_from(["{m} {h} * * *", "*/15 * * * *", "{m} * * * *",
                                                        "{m} {h} * * 1,3,5", "RRULE:FREQ=HOURLY;BYMINUTE={m}"]))
# Found by hypothesis in CI: the repeated hour of Europe/Amsterdam's 1991 autumn change.
@example("Europe/Amsterdam", datetime(1991, 9, 28, 9, 0, tzinfo=timezone.utc), 0, 0, "*/15 * * * *")
def test_occurrences_strictly_increase_and_never_repeat(zone, start, h, m, template):
    rule = parse(template.format(h=h, m=m), zone, anchor=ANCHOR)
    occs = _walk(rule, start, 60)
    ats = [o.at for o in occs]
    assert len(ats) == 60
    assert ats[0] > start
    assert all(a < b for a, b in zip(ats, ats[1:]))
    for o in occs:
        assert o.at.tzinfo is UTC and o.at.microsecond == 0
        # Compare instants through UTC: PEP 495 makes a datetime inside a repeated hour compare
        # unequal to any other zone's datetime, even the same instant.
        assert o.local.astimezone(timezone.utc) == o.at and o.local.tzinfo.key == zone


@FAST
@given(zones, st.integers(1990, 2040), hours, minutes)
# Drawn in CI: in tzdata 2026f (the package the engine reads) Winnipeg stays on UTC-5 after its
# March 2026 change (no return to standard time); the system's 2025b puts winter 2027 at UTC-6. The
# expectation must use the engine's zones, as it now does.
@example("America/Winnipeg", 2027, 0, 15)
def test_daily_fixed_time_rule_fires_once_per_local_day(zone, year, h, m):
    """Default policy: one occurrence per local date, including both transition days.

    The occurrence's local date is the date it meant (its wall date) except when a gap that
    crosses midnight moved it, which the assertion allows by counting wall dates.
    """
    rule = parse(f"{m} {h} * * *", zone, anchor=ANCHOR)
    z = validate_time_zone(zone)  # the engine's tz database (the tzdata package), not the system's
    first_day = date(year, 1, 1)
    start = datetime(year, 1, 1, tzinfo=z).astimezone(UTC) - timedelta(seconds=1)
    end = datetime(year + 1, 1, 1, tzinfo=z).astimezone(UTC)
    occs = rule.between(start + timedelta(seconds=1), end + timedelta(days=2), 1000)
    walls = [date.fromisoformat(o.wall[:10]) for o in occs]
    walls = [w for w in walls if w.year == year]
    expected = [first_day + timedelta(days=i) for i in range((date(year + 1, 1, 1) - first_day).days)]
    # Zones that skipped a whole calendar day (Pacific/Apia 2011-12-30) still fire for it
    # (next_valid), but the moved occurrence coincides with the next day's midnight rule
    # only for h=m=0; otherwise every wall date appears exactly once.
    assert walls == expected or (h == 0 and m == 0 and len(walls) == len(expected) - 1 and set(walls) < set(expected))
    assert not any(o.dropped for o in occs)


@FAST
@given(zones, starts)
def test_sub_daily_spacing_is_the_interval_except_across_an_offset_change(zone, start):
    rule = parse("*/15 * * * *", zone, anchor=ANCHOR)
    occs = _walk(rule, start, 200)
    for a, b in zip(occs, occs[1:]):
        gap = b.at - a.at
        d = b.local.utcoffset() - a.local.utcoffset()
        if d == timedelta(0):
            assert gap == timedelta(minutes=15), (a, b)
        else:
            assert timedelta(0) < gap < timedelta(minutes=15) + abs(d), (a, b)
            # Both wall times are real and on the quarter hour.
            assert b.local.minute % 15 == 0 and a.local.minute % 15 == 0


@FAST
@given(st.lists(zones, min_size=2, max_size=4, unique=True), starts,
       st.sampled_from(["rate(1 minute)", "rate(15 minutes)", "rate(1 hour)", "rate(2 days)"]))
def test_rate_is_zone_independent(zs, start, expr):
    walks = [[o.at for o in _walk(parse(expr, z, anchor=ANCHOR), start, 20)] for z in zs]
    assert all(w == walks[0] for w in walks)
    assert len({b - a for a, b in zip(walks[0], walks[0][1:])}) == 1


@FAST
@given(zones, starts, hours, minutes, st.sampled_from(["next_valid", "shift", "skip"]),
       st.sampled_from(["earlier", "later", "both"]))
def test_every_policy_is_strictly_increasing(zone, start, h, m, skipped, repeated):
    from schedules.timeexpr import DstPolicy

    rule = parse(f"{m} {h} * * *", zone, anchor=ANCHOR, dst_policy=DstPolicy(skipped, repeated))
    ats = [o.at for o in _walk(rule, start, 30)]
    assert len(ats) == 30 and ats[0] > start
    assert all(a < b for a, b in zip(ats, ats[1:]))
