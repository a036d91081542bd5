"""Time zones from the ``tzdata`` package, and wall-time resolution.

Zones are loaded from the ``tzdata`` package rather than ``ZoneInfo(name)``: the standard
library prefers the operating system's /usr/share/zoneinfo, whose version we cannot report.
Every occurrence records ``tzdata_version()``, so the rules used must be the rules reported.
"""

from __future__ import annotations

import importlib.resources
import io
import re
import threading
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import tzdata

from .types import DstPolicy, DstRepeated, DstSkipped, ExpressionError, Occurrence

UTC = timezone.utc
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# The instants the engine produces. A UTC offset is always less than a day, so every instant in
# this range has a local time in every zone that datetime can represent (years 1 to 9999); an
# occurrence outside it does not exist for the engine, and a rule simply ends there.
MIN_INSTANT = datetime(1, 1, 2, tzinfo=UTC)
MAX_INSTANT = datetime(9999, 12, 30, 23, 59, 59, tzinfo=UTC)
RANGE_TEXT = "0001-01-02T00:00:00Z to 9999-12-30T23:59:59Z"

_zones: dict[str, ZoneInfo] = {}
_margins: dict[str, timedelta] = {}
_lock = threading.Lock()

# Used when a zone's transition table cannot be read: covers the largest jump tzdb has
# (Pacific/Apia skipped a whole day in 2011; Alaska's 1867 change repeated one).
_DEFAULT_MARGIN = timedelta(hours=26)


def tzdata_version() -> str:
    return tzdata.IANA_VERSION


# Names are letters, digits, '_', '+' and '-' in slash-separated parts ('America/Port-au-Prince',
# 'Etc/GMT+5'); the longest in tzdata is 32 characters.
_NAME = re.compile(r"^[A-Za-z0-9_+-]+(?:/[A-Za-z0-9_+-]+)*$")
MAX_ZONE_NAME = 64
_known: frozenset | None = None


def _known_zones() -> frozenset:
    """The zone keys the tzdata package lists in its 'zones' file.

    The package directory also holds files that are not zones (zone.tab, tzdata.zi,
    leapseconds, __init__.py); only listed keys are zones.
    """
    global _known
    if _known is None:
        try:
            text = importlib.resources.files("tzdata").joinpath("zones").read_text()
            _known = frozenset(text.split())
        except OSError:  # pragma: no cover - a tzdata without its list: fall back to the files
            _known = frozenset()
    return _known


def _zone_file(name: str):
    parts = name.split("/")
    try:
        res = importlib.resources.files("tzdata.zoneinfo").joinpath(*parts)
        if not res.is_file():
            return None
        data = res.read_bytes()
    except (OSError, ValueError, ModuleNotFoundError):
        return None
    return data if data[:4] == b"TZif" else None


def _unknown(name: str, why: str = "") -> ExpressionError:
    shown = name if len(name) <= MAX_ZONE_NAME else name[:MAX_ZONE_NAME] + "..."
    return ExpressionError(
        f"unknown time zone {shown!r}{why}: use an IANA name such as 'America/New_York' or 'UTC' "
        f"(tz database {tzdata_version()})",
        "timeZone",
    )


def validate_time_zone(name: str) -> ZoneInfo:
    """Return the zone for an IANA name, or raise ExpressionError(field='timeZone')."""
    if not isinstance(name, str):
        raise ExpressionError("timeZone must be an IANA zone name such as 'Europe/Paris'", "timeZone")
    zone = _zones.get(name)
    if zone is not None:
        return zone
    if len(name) > MAX_ZONE_NAME:
        raise _unknown(name, f" (longer than {MAX_ZONE_NAME} characters)")
    if not _NAME.match(name):
        raise _unknown(name, " (zone names are letters, digits, '_', '+' and '-' in parts separated by '/')")
    known = _known_zones()
    if known and name not in known:
        raise _unknown(name)
    data = _zone_file(name)
    if data is None:
        raise _unknown(name)
    try:
        zone = ZoneInfo.from_file(io.BytesIO(data), key=name)
    except (ValueError, OSError):
        raise _unknown(name, " (its tz database file cannot be read)") from None
    with _lock:
        _zones.setdefault(name, zone)
        _margins.setdefault(name, _jump_margin(data))
    return _zones[name]


def _jump_margin(data: bytes) -> timedelta:
    """The largest single change of UTC offset the zone ever makes, plus a minute.

    Wall-time scans start this far before the wall time of ``after``: an occurrence later than
    ``after`` can have an earlier wall time only by that much (after a fall-back), and a
    moved occurrence can land at most that far from the wall time it meant.

    The transition table alone is not the zone: the footer's POSIX TZ string governs every
    instant after the table's last transition, and a slim TZif file (as the tzdata package
    ships) records no transition the footer can compute. Antarctica/Troll's two-hour DST exists
    only there: its table holds one change of abbreviation and no change of offset, so the
    margin was a minute and occurrences in its repeated and skipped hours were lost. So the
    footer's offsets count as well as the table's (``footer_offsets``).
    """
    try:
        # Private but stable since 3.9; the fallback is only slower, never wrong.
        from zoneinfo import _common

        trans_idx, _trans, utcoff, _isdst, _abbr, tz_str = _common.load_data(io.BytesIO(data))
    except Exception:
        return _DEFAULT_MARGIN
    offs = [utcoff[i] for i in trans_idx]
    biggest = max((abs(b - a) for a, b in zip(offs, offs[1:])), default=0)
    if tz_str:
        footer = footer_offsets(tz_str.decode("ascii", "replace"))
        if footer is None:
            return _DEFAULT_MARGIN
        # From the table's last offset (or the zone's only one) to the footer's, and between
        # the footer's standard and daylight offsets; every offset the zone has ever had is
        # among these, so their whole spread bounds any single jump.
        known = set(utcoff) | set(footer)
        biggest = max(biggest, max(known) - min(known))
    return timedelta(seconds=biggest + 60)


_POSIX_NAME = r"(?:<[A-Za-z0-9+-]+>|[A-Za-z]{3,})"


def _posix_offset(tag: str) -> str:
    return rf"(?P<{tag}_sign>[+-]?)(?P<{tag}_h>\d{{1,3}})(?::(?P<{tag}_m>\d{{1,2}}))?(?::(?P<{tag}_s>\d{{1,2}}))?"


_POSIX_TZ = re.compile(
    rf"^{_POSIX_NAME}{_posix_offset('std')}(?:(?P<dst>{_POSIX_NAME})(?:{_posix_offset('dst')})?(?:,.*)?)?$"
)


def footer_offsets(tz_str: str) -> tuple[int, ...] | None:
    """The UTC offsets, in seconds east of UTC, a TZif footer (a POSIX TZ string such as
    ``<+00>0<+02>-2,M3.5.0/1,M10.5.0/3``) gives: the standard one, and the daylight one when it
    has daylight time (one hour ahead of standard unless given). None when it does not parse.
    POSIX offsets count west of UTC, hence the sign."""
    m = _POSIX_TZ.match(tz_str.strip())
    if m is None:
        return None

    def seconds(tag: str) -> int:
        value = int(m[f"{tag}_h"]) * 3600 + int(m[f"{tag}_m"] or 0) * 60 + int(m[f"{tag}_s"] or 0)
        return value if m[f"{tag}_sign"] == "-" else -value

    std = seconds("std")
    if m["dst"] is None:
        return (std,)
    return (std, seconds("dst") if m["dst_h"] is not None else std + 3600)


def jump_margin(zone: ZoneInfo) -> timedelta:
    return _margins.get(zone.key, _DEFAULT_MARGIN)


def offset_at(zone: ZoneInfo, instant: datetime) -> timedelta:
    return instant.astimezone(zone).utcoffset()


def first_change(zone: ZoneInfo, lo: datetime, hi: datetime, off_lo: timedelta) -> datetime:
    """The first whole second in (lo, hi] whose UTC offset differs from ``off_lo``.

    The caller knows the offset at ``hi`` differs. tz transitions fall on whole seconds, and
    no zone has two transitions within two days of each other (a test checks this against the
    installed tzdata), so bisection finds the only one in a short interval.
    """
    lo_s = int((lo - _EPOCH).total_seconds() // 1)
    hi_s = int(-((_EPOCH - hi).total_seconds() // 1))  # ceil
    while hi_s - lo_s > 1:
        mid = (lo_s + hi_s) // 2
        if offset_at(zone, _EPOCH + timedelta(seconds=mid)) == off_lo:
            lo_s = mid
        else:
            hi_s = mid
    return _EPOCH + timedelta(seconds=hi_s)


def fmt_wall(w: datetime) -> str:
    # isoformat, not strftime: strftime does not pad years below 1000 on every platform.
    return w.replace(microsecond=0).isoformat()


def _hm(w: datetime) -> str:
    return w.strftime("%H:%M:%S") if w.second else w.strftime("%H:%M")


def _occ(zone, at_naive_utc: datetime, wall: str, note=None, dropped=False) -> Occurrence:
    at = at_naive_utc.replace(tzinfo=UTC)
    return Occurrence(at=at, local=at.astimezone(zone), wall=wall, note=note, dropped=dropped)


def in_range(at: datetime) -> bool:
    return MIN_INSTANT <= at <= MAX_INSTANT


def resolve_fixed(zone: ZoneInfo, w: datetime, policy: DstPolicy) -> list[Occurrence]:
    """Turn the naive wall time a fixed-time rule meant into its occurrence(s) under ``policy``.

    zoneinfo's fold semantics tell the cases apart without a transition table: for a wall time
    that happens once both folds give the same offset; for a skipped one fold=0 gives the offset
    before the gap (smaller); for a repeated one fold=0 gives the first pass's (larger) offset.
    Occurrences outside [MIN_INSTANT, MAX_INSTANT] are left out: at the ends of the calendar a
    wall time can have no representable instant.
    """
    try:
        occs = _resolve_fixed(zone, w, policy)
    except OverflowError:
        return []
    return [o for o in occs if in_range(o.at)]


def _resolve_fixed(zone: ZoneInfo, w: datetime, policy: DstPolicy) -> list[Occurrence]:
    oa = w.replace(tzinfo=zone).utcoffset()
    ob = w.replace(tzinfo=zone, fold=1).utcoffset()
    wall = fmt_wall(w)
    if oa == ob:
        return [_occ(zone, w - oa, wall)]
    if oa < ob:
        # Skipped: w - ob is before the gap, w - oa after it; the transition lies between.
        if policy.skipped == "shift":
            at = w - oa
            local = at.replace(tzinfo=UTC).astimezone(zone)
            return [
                _occ(zone, at, wall,
                     f"shifted: {_hm(w)} does not exist on {w.date()}; fired at {_hm(local)}, "
                     "keeping the offset from before the gap")
            ]
        trans = first_change(zone, (w - ob).replace(tzinfo=UTC), (w - oa).replace(tzinfo=UTC), oa)
        local = trans.astimezone(zone)
        if policy.skipped == DstSkipped.SKIP:
            return [
                _occ(zone, trans.replace(tzinfo=None), wall,
                     f"dropped: {_hm(w)} does not exist on {w.date()} (dstPolicy skipped=skip)",
                     dropped=True)
            ]
        return [
            _occ(zone, trans.replace(tzinfo=None), wall,
                 f"moved: {_hm(w)} does not exist on {w.date()}; fired at {_hm(local)}, "
                 "the first valid time after the gap")
        ]
    first, second = w - oa, w - ob
    if policy.repeated == DstRepeated.EARLIER:
        return [_occ(zone, first, wall, f"repeated: {_hm(w)} occurs twice on {w.date()}; fired at the earlier")]
    if policy.repeated == DstRepeated.LATER:
        return [_occ(zone, second, wall, f"repeated: {_hm(w)} occurs twice on {w.date()}; fired at the later")]
    return [
        _occ(zone, first, wall, f"repeated: {_hm(w)} occurs twice on {w.date()}; fired at both, this is the earlier"),
        _occ(zone, second, wall, f"repeated: {_hm(w)} occurs twice on {w.date()}; fired at both, this is the later"),
    ]


def repeated_note(zone: ZoneInfo, w: datetime) -> str | None:
    """The note a sub-daily occurrence carries when its wall time happens twice that day."""
    oa = w.replace(tzinfo=zone).utcoffset()
    ob = w.replace(tzinfo=zone, fold=1).utcoffset()
    if oa > ob:
        return f"repeated: {_hm(w)} occurs twice on {w.date()}; sub-daily rules fire at both"
    return None
