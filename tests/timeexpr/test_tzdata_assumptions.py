"""The engine samples UTC offsets every 6 hours; that is exact only if no zone changes its
offset twice within that time. Check it against the tzdata actually installed."""

import importlib.resources
import io
import zoneinfo
from zoneinfo import _common

import tzdata

from schedules.timeexpr import tzdata_version


def test_no_zone_changes_offset_twice_within_two_days_since_1970():
    closest = None
    for name in zoneinfo.available_timezones():
        res = importlib.resources.files("tzdata.zoneinfo").joinpath(*name.split("/"))
        if not res.is_file():
            continue
        trans_idx, trans, utcoff, *_ = _common.load_data(io.BytesIO(res.read_bytes()))
        real = [(t, utcoff[i]) for t, i in zip(trans, trans_idx)]
        # Only transitions that change the offset matter (some only change the abbreviation).
        changes, last = [], None
        for t, off in real:
            if off != last:
                changes.append(t)
                last = off
        for a, b in zip(changes, changes[1:]):
            if a > 0 and (closest is None or b - a < closest[0]):
                closest = (b - a, name, a)
    assert closest is not None and closest[0] > 2 * 86400, closest


def test_reported_version_is_the_tzdata_package():
    assert tzdata_version() == tzdata.IANA_VERSION
    assert len(tzdata_version()) == 5 and tzdata_version()[:4].isdigit()
