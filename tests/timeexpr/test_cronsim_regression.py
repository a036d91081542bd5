"""cronsim can answer with an instant before its start inside a repeated hour; we must not."""

from datetime import datetime, timedelta

from cronsim import CronSim

from schedules.timeexpr import parse, validate_time_zone

from .helpers import UTC, utc

NY = validate_time_zone("America/New_York")


def test_cronsim_itself_goes_backwards_in_the_second_pass():
    # From 01:45 EST (the second pass, 06:45Z) on 2026-11-01 cronsim answers 01:50 EDT = 05:50Z,
    # which is before its start. If a cronsim release fixes this, this test says so.
    start = datetime(2026, 11, 1, 1, 45, tzinfo=NY, fold=1)
    got = next(CronSim("50 1 * * *", start))
    assert got.astimezone(UTC) == utc("2026-11-01T05:50Z")
    assert got.astimezone(UTC) < start.astimezone(UTC)


def test_we_answer_strictly_later_where_cronsim_goes_backwards():
    rule = parse("50 1 * * *", "America/New_York", anchor=utc("2026-01-01T00:00Z"))
    assert rule.next_after(utc("2026-11-01T06:45Z")).at == utc("2026-11-02T06:50Z")
    sub = parse("50 * * * *", "America/New_York", anchor=utc("2026-01-01T00:00Z"))
    assert sub.next_after(utc("2026-11-01T06:45Z")).at == utc("2026-11-01T06:50Z")


def test_fixed_time_rule_in_the_second_pass_moves_forward():
    rule = parse("30 1 * * *", "America/New_York", anchor=utc("2026-01-01T00:00Z"))
    after = utc("2026-11-01T06:45Z")  # 01:45 EST, second pass
    occ = rule.next_after(after)
    assert occ.at == utc("2026-11-02T06:30Z")


def test_every_answer_is_strictly_later_across_the_repeated_hour():
    for expr in ["30 1 * * *", "0 2 * * *", "*/15 * * * *", "0,30 0-3 * * *"]:
        rule = parse(expr, "America/New_York", anchor=utc("2026-01-01T00:00Z"))
        t = utc("2026-11-01T04:00Z")
        while t < utc("2026-11-01T09:00Z"):
            occ = rule.next_after(t)
            assert occ.at > t, (expr, t)
            t += timedelta(minutes=5)
