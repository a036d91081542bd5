"""Issue 26, finding 10: Antarctica/Troll's daylight time (+02, two hours ahead, from the last
Sunday of March to the last Sunday of October) exists only in its TZif file's footer, the POSIX TZ
string `<+00>0<+02>-2,M3.5.0/1,M10.5.0/3`: the tzdata package's slim file records no transition
the footer can compute, so the table had no change of offset at all and the zone's jump margin was
one minute instead of two hours. Fixed-time rules with a non-default dstPolicy lost the second pass
of the repeated hours, and sub-daily RRULE COUNTs ending in them lost their second passes.

Checked against the references the other time tests use: zoneinfo's own offsets and folds,
cronsim for the default policy, python-dateutil for the RRULE's wall times, and a minute walk.
"""

import importlib.resources
import io
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo, _common

import pytest
from cronsim import CronSim
from dateutil import rrule as du

from schedules.timeexpr import DstPolicy, parse, validate_time_zone
from schedules.timeexpr.zones import jump_margin

from .helpers import UTC, utc

TROLL = "Antarctica/Troll"
Z = ZoneInfo(TROLL)
POLICIES = [DstPolicy(s, r) for s in ("next_valid", "shift", "skip") for r in ("earlier", "later", "both")]
FALL_BACK = datetime(2027, 10, 31)  # 03:00 +02 -> 01:00 +00: wall times 01:00-02:59 happen twice
SPRING_FORWARD = datetime(2027, 3, 28)  # 01:00 +00 -> 03:00 +02: wall times 01:00-02:59 do not exist
SPRING_INSTANT = utc("2027-03-28T01:00Z")  # M3.5.0/1: 01:00 standard time, UTC here


def _zone_names() -> list[str]:
    return importlib.resources.files("tzdata").joinpath("zones").read_text().split()


def _table(name: str):
    data = importlib.resources.files("tzdata.zoneinfo").joinpath(*name.split("/")).read_bytes()
    return _common.load_data(io.BytesIO(data))


def _zoneinfo_says(wall: datetime, policy: DstPolicy) -> list[tuple[datetime, bool]]:
    """(instant, dropped) of a fixed wall time under `policy`, from zoneinfo's folds alone."""
    early = wall.replace(tzinfo=Z).utcoffset()
    late = wall.replace(tzinfo=Z, fold=1).utcoffset()
    naive = [(wall - early).replace(tzinfo=UTC), (wall - late).replace(tzinfo=UTC)]
    if early == late:
        return [(naive[0], False)]
    if early > late:  # repeated
        return {"earlier": [(naive[0], False)], "later": [(naive[1], False)],
                "both": [(naive[0], False), (naive[1], False)]}[policy.repeated]
    # Skipped: shift keeps the offset from before the gap; the others go to the transition.
    return {"shift": [(naive[0], False)], "next_valid": [(SPRING_INSTANT, False)],
            "skip": [(SPRING_INSTANT, True)]}[policy.skipped]


def test_finding_10_the_tzdata_file_holds_trolls_daylight_time_only_in_its_footer():
    # What the finding rests on: if a tzdata release ships Troll's transitions in the table again,
    # this says so (the engine is right either way).
    from schedules.timeexpr.zones import footer_offsets

    trans_idx, _trans, utcoff, _isdst, _abbr, footer = _table(TROLL)
    assert {utcoff[i] for i in trans_idx} == {0}
    assert footer_offsets(footer.decode()) == (0, 7200)


def test_finding_10_trolls_jump_margin_covers_its_two_hour_jump():
    assert jump_margin(validate_time_zone(TROLL)) >= timedelta(hours=2)


@pytest.mark.parametrize("hm", ["01:00", "01:30", "02:00", "02:59"])
@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: f"{p.skipped}-{p.repeated}")
def test_finding_10_fixed_time_rules_in_trolls_repeated_and_skipped_hours_match_zoneinfo(policy, hm):
    h, m = map(int, hm.split(":"))
    rule = parse(f"{m} {h} * * *", TROLL, anchor=utc("2027-01-01T00:00Z"), dst_policy=policy)
    for day in (FALL_BACK, SPRING_FORWARD):
        wall = day.replace(hour=h, minute=m)
        start = (day - timedelta(hours=12)).replace(tzinfo=UTC)
        got = [(o.at, o.dropped) for o in rule.between(start, start + timedelta(hours=30), 10)
               if o.wall == wall.isoformat()]
        assert got == _zoneinfo_says(wall, policy), (policy, wall)


@pytest.mark.parametrize("expr", ["30 1 * * *", "30 2 * * *", "0 1 * * *", "45 0 * * *", "15 3 * * *"])
def test_finding_10_fixed_time_rules_in_troll_match_cronsim_under_the_default_policy(expr):
    rule = parse(expr, TROLL, anchor=utc("2027-01-01T00:00Z"))
    for start in (utc("2027-03-27T12:00Z"), utc("2027-10-30T12:00Z")):
        sim = CronSim(expr, start.astimezone(Z))
        expected = [next(sim).astimezone(UTC) for _ in range(4)]
        assert [o.at for o in rule.between(start, expected[-1] + timedelta(seconds=1), 10)] == expected


@pytest.mark.parametrize("freq, count", [("HOURLY", 2), ("HOURLY", 3), ("MINUTELY;INTERVAL=30", 3),
                                         ("MINUTELY;INTERVAL=30", 4), ("MINUTELY;INTERVAL=30", 6),
                                         ("MINUTELY;INTERVAL=20", 8)])
def test_finding_10_sub_daily_rrule_counts_ending_in_trolls_repeated_hours_match_dateutil(freq, count):
    # COUNT counts wall-clock recurrences (docs/time-semantics.md): dateutil gives the wall
    # times, and each that happens twice in Troll (zoneinfo's folds) fires at both passes.
    text = f"DTSTART:20271031T000000\nRRULE:FREQ={freq};COUNT={count}"
    walls = list(du.rrulestr(text))
    last = walls[-1]
    assert last.replace(tzinfo=Z).utcoffset() != last.replace(tzinfo=Z, fold=1).utcoffset()  # ends repeated
    expected = sorted({(w.replace(tzinfo=Z, fold=f)).astimezone(UTC) for w in walls for f in (0, 1)})
    rule = parse(text, TROLL, anchor=utc("2027-01-01T00:00Z"))
    assert [o.at for o in rule.iter_after(utc("2027-10-30T00:00Z"))] == expected


def test_finding_10_a_sub_daily_cron_in_troll_fires_at_every_minute_a_walk_finds():
    rule = parse("*/20 * * * *", TROLL, anchor=utc("2027-01-01T00:00Z"))
    for start in (utc("2027-03-27T20:00Z"), utc("2027-10-30T20:00Z")):
        end = start + timedelta(hours=8)
        walk, t = [], start
        while t < end:
            if t.astimezone(Z).minute % 20 == 0:
                walk.append(t)
            t += timedelta(minutes=1)
        assert [o.at for o in rule.between(start, end, 100)] == walk


def test_finding_10_every_zones_margin_covers_every_offset_change_zoneinfo_makes_ahead():
    # The footer governs every instant after a table's last transition: sample each zone's
    # offset through 2040 (past every table) and take the largest change; the margin must cover
    # it. No zone changes its offset twice within two days (test_tzdata_assumptions), so daily
    # samples see each change whole.
    short = []
    for name in _zone_names():
        zone = validate_time_zone(name)
        t, end = utc("2040-01-01T00:00Z"), utc("2041-01-01T00:00Z")
        prev, biggest = t.astimezone(zone).utcoffset(), timedelta(0)
        while t < end:
            t += timedelta(days=1)
            off = t.astimezone(zone).utcoffset()
            biggest, prev = max(biggest, abs(off - prev)), off
        if jump_margin(zone) <= biggest:
            short.append((name, biggest, jump_margin(zone)))
    assert short == []


def test_finding_10_the_zones_whose_footer_offsets_are_not_in_their_table_are_covered():
    # The scan the finding asked for. With tzdata 2026f: Antarctica/Troll (+02), America/Nuuk and
    # America/Godthab (-01), America/Indiana/Petersburg (EDT), America/North_Dakota/Beulah (CDT)
    # and Pacific/Norfolk (+12); only Troll's margin was short (the others' tables have a jump
    # at least as large as their footer's from earlier rules).
    from schedules.timeexpr.zones import footer_offsets

    found = {}
    for name in _zone_names():
        trans_idx, _trans, utcoff, _isdst, _abbr, footer = _table(name)
        if not footer:
            continue
        offsets = footer_offsets(footer.decode())
        assert offsets is not None, (name, footer)
        table = {utcoff[i] for i in trans_idx} or {utcoff[0]}
        if set(offsets) - table:
            found[name] = offsets
            spread = max(offsets) - min(offsets)
            assert jump_margin(validate_time_zone(name)) > timedelta(seconds=spread), name
    assert TROLL in found
