"""The zone timeline (scheduler/timeplan/zone.py) against the tz database itself.

zone.py discovers UTC-offset changes by probing zoneinfo once a day and bisecting. These tests check the
changes it finds against an independent reading of the same data:

* the transition table of the zone's TZif file, read with the stdlib's `zoneinfo._common.load_data`
  (only entries where the UTC offset really changes: TZif also lists abbreviation- or isdst-only
  changes, and `zic -b fat` pads the table with an offset-preserving entry at 2038-01-19);
* beyond the table's last entry, the file's POSIX TZ footer (`EST5EDT,M3.2.0,M11.1.0`), expanded by a
  small parser written here (RFC 8536 section 3.3 extensions included: negative and >24h rule times),
  and cross-checked against `zoneinfo`'s own `utcoffset` one second either side of every transition.

The zones cover the DST tables' zones plus historical oddities: 30- and 45-minute offsets, negative
DST (Dublin), two-hour DST (Troll), a skipped calendar day (Apia, Kiritimati), offsets that are not a
whole minute (Monrovia until 1972), Ramadan DST (Casablanca), transitions at 24:00 and at negative local
times (Santiago, Cairo, Nuuk), and zones that changed their standard offset in recent years.
"""

from __future__ import annotations

import io
import itertools
import os
import random
import re
import zoneinfo
from calendar import monthrange
from datetime import UTC, date, datetime, timedelta
from importlib.resources import files
from zoneinfo import ZoneInfo
from zoneinfo._common import load_data

import pytest

from scheduler.timeplan.zone import ZoneTimeline, get_zone, timeline

LO = int(datetime(1970, 1, 1, tzinfo=UTC).timestamp())
HI = int(datetime(2040, 1, 1, tzinfo=UTC).timestamp())
Y1900 = int(datetime(1900, 1, 1, tzinfo=UTC).timestamp())

ZONES = [
    # The DST tables' zones.
    "America/New_York",
    "Europe/London",
    "Australia/Lord_Howe",
    "Africa/Cairo",
    "America/Santiago",
    "Pacific/Apia",
    "Asia/Kolkata",
    # The differential test's fixed-offset zones.
    "Asia/Tokyo",
    "Africa/Nairobi",
    "America/Bogota",
    "Etc/GMT+5",
    "Etc/GMT-14",
    "UTC",
    # Everyday DST.
    "Europe/Berlin",
    "Europe/Lisbon",
    "Australia/Sydney",
    "Australia/Adelaide",
    "Pacific/Auckland",
    "America/Los_Angeles",
    "America/Chicago",
    "America/Adak",
    "America/Havana",
    "America/Asuncion",
    "Asia/Jerusalem",
    "Asia/Gaza",
    "Asia/Beirut",
    # Odd offsets and odd DST.
    "America/St_Johns",
    "Asia/Kathmandu",
    "Asia/Tehran",
    "Australia/Eucla",
    "Pacific/Chatham",
    "Pacific/Norfolk",
    "Pacific/Marquesas",
    "Europe/Dublin",
    "Africa/Casablanca",
    "Antarctica/Troll",
    "Africa/Monrovia",
    "America/Nuuk",
    "America/Scoresbysund",
    # Standard offsets changed, days skipped, DST abolished or adopted.
    "Pacific/Kiritimati",
    "Pacific/Kanton",
    "Pacific/Fakaofo",
    "Europe/Moscow",
    "Europe/Volgograd",
    "Europe/Kyiv",
    "Europe/Minsk",
    "Asia/Pyongyang",
    "America/Caracas",
    "Asia/Dhaka",
    "Asia/Colombo",
    "Asia/Almaty",
    "Asia/Amman",
    "Asia/Damascus",
    "America/Mexico_City",
    "America/Ciudad_Juarez",
    "America/Whitehorse",
    "America/Sao_Paulo",
    "Africa/Juba",
    "Antarctica/Casey",
    "Asia/Manila",
    "America/Metlakatla",
]


# -- independent reading of the tz data -----------------------------------------------------------------


def _tzif_bytes(name: str) -> bytes:
    for root in zoneinfo.TZPATH:
        path = os.path.join(root, name)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                return f.read()
    # The tzdata package, where the machine has no system copy.
    return files("tzdata.zoneinfo").joinpath(*name.split("/")).read_bytes()


def _load(name: str) -> tuple[list[int], list[int], str]:
    """(transition instants, UTC offset from each one on, POSIX footer) of the zone's TZif file."""
    trans_idx, trans_utc, utcoff, _isdst, _abbr, tz_str = load_data(io.BytesIO(_tzif_bytes(name)))
    return list(trans_utc), [utcoff[i] for i in trans_idx], tz_str.decode() if tz_str else ""


_NAME = r"(?:<[^>]*>|[A-Za-z]+)"
_OFF = r"[+-]?\d{1,3}(?::\d{2}(?::\d{2})?)?"
_RULE = r"M(\d{1,2})\.(\d)\.(\d)(?:/(" + _OFF + r"))?"


def _hms(text: str) -> int:
    sign = -1 if text.startswith("-") else 1
    parts = [int(p) for p in text.lstrip("+-").split(":")]
    parts += [0] * (3 - len(parts))
    return sign * (parts[0] * 3600 + parts[1] * 60 + parts[2])


def _rule_day(year: int, month: int, week: int, wday: int) -> date:
    """POSIX `Mm.w.d`: the w-th weekday d (0 = Sunday) of month m, w = 5 meaning the last one."""
    first = date(year, month, 1)
    day = 1 + (wday - (first.weekday() + 1) % 7) % 7 + 7 * (week - 1)
    while day > monthrange(year, month)[1]:
        day -= 7
    return date(year, month, day)


def _posix_changes(tz_str: str, after: int, until: int) -> list[tuple[int, int]]:
    """(instant, new UTC offset) for the footer's rule in (after, until), unfiltered."""
    m = re.match(rf"^{_NAME}({_OFF})(?:{_NAME}({_OFF})?,{_RULE},{_RULE})?$", tz_str)
    assert m, f"unsupported POSIX TZ string {tz_str!r}"
    std = -_hms(m[1])
    if m[3] is None:
        return []
    dst = -_hms(m[2]) if m[2] else std + 3600
    start_rule = (int(m[3]), int(m[4]), int(m[5]), _hms(m[6]) if m[6] else 7200)
    end_rule = (int(m[7]), int(m[8]), int(m[9]), _hms(m[10]) if m[10] else 7200)
    out = []
    y0 = datetime.fromtimestamp(after, UTC).year - 1
    y1 = datetime.fromtimestamp(until, UTC).year + 1
    for year in range(y0, y1 + 1):
        # DST starts at a local time given in standard time and ends at one given in DST.
        for (mon, week, wday, secs), off_before, off_after in (
            (start_rule, std, dst),
            (end_rule, dst, std),
        ):
            d = _rule_day(year, mon, week, wday)
            local = datetime(d.year, d.month, d.day, tzinfo=UTC) + timedelta(seconds=secs)
            u = int(local.timestamp()) - off_before
            if after < u < until:
                out.append((u, off_after))
    return sorted(out)


def real_changes(name: str, lo: int, hi: int) -> tuple[int, list[tuple[int, int]]]:
    """(offset at lo, [(instant, new offset)] for every real offset change in (lo, hi))."""
    trans, offs, tz_str = _load(name)
    zi = ZoneInfo(name)
    start_off = _zoneinfo_offset(zi, lo)
    listed = list(zip(trans, offs, strict=True))
    last_listed = trans[-1] if trans else lo
    if tz_str and last_listed < hi:
        projected = _posix_changes(tz_str, max(last_listed, lo), hi)
        for u, o in projected:
            # The parser is ours: make sure zoneinfo, which applies the same footer, agrees.
            assert _zoneinfo_offset(zi, u) == o, (name, u, o)
            assert _zoneinfo_offset(zi, u - 1) != o, (name, u, o)
        listed += projected
    out: list[tuple[int, int]] = []
    cur = start_off
    for u, o in listed:
        if lo < u < hi and o != cur:
            out.append((u, o))
        if u > lo:
            cur = o
    return start_off, out


def _zoneinfo_offset(zi: ZoneInfo, u: int) -> int:
    off = datetime.fromtimestamp(u, zi).utcoffset()
    assert off is not None
    return int(off.total_seconds())


def _iso(u: int) -> str:
    return datetime.fromtimestamp(u, UTC).isoformat()


# -- the engine's view ----------------------------------------------------------------------------------


def engine_changes_forward(tl: ZoneTimeline, lo: int, hi: int) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    u = lo
    prev_off: int | None = None
    while True:
        start, end, off, before, after = tl.interval(u)
        assert start <= u < end
        if prev_off is not None:
            # A real change starts a new interval at u; a mere edge of the discovered range does not.
            assert (before if start == u else off) == prev_off, ("neighbour offsets disagree", _iso(u))
        prev_off = off
        if end >= hi:
            return out
        if after != off:
            out.append((end, after))
        u = end


def engine_changes_backward(tl: ZoneTimeline, lo: int, hi: int) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    u = hi - 1
    while True:
        start, _end, off, before, _after = tl.interval(u)
        if start <= lo:
            return out[::-1]
        if before != off:
            out.append((start, off))
        u = start - 1


@pytest.mark.parametrize("name", ZONES)
def test_transitions_1970_2040_match_tzif(name: str) -> None:
    start_off, expected = real_changes(name, LO, HI)
    tl = ZoneTimeline(get_zone(name))  # fresh: discovery starts at 1970 and extends forward
    assert tl.offset_at(LO) == start_off
    got = engine_changes_forward(tl, LO, HI)
    assert [(_iso(u), o) for u, o in got] == [(_iso(u), o) for u, o in expected]


@pytest.mark.parametrize("name", ZONES)
def test_transitions_found_walking_backwards(name: str) -> None:
    """Discovery that starts at 2040 and extends into the past finds the same changes."""
    _, expected = real_changes(name, LO, HI)
    tl = ZoneTimeline(get_zone(name))
    got = engine_changes_backward(tl, LO, HI)
    assert [(_iso(u), o) for u, o in got] == [(_iso(u), o) for u, o in expected]


@pytest.mark.parametrize("name", ZONES)
def test_offset_at_matches_zoneinfo(name: str) -> None:
    zi = ZoneInfo(name)
    rng = random.Random(f"offset_at:{name}")
    tl = ZoneTimeline(get_zone(name))
    lo, hi = int(datetime(1950, 1, 1, tzinfo=UTC).timestamp()), int(datetime(2060, 1, 1, tzinfo=UTC).timestamp())
    probes = [rng.randrange(lo, hi) for _ in range(300)]
    # Every real change one second either side, where mistakes would show.
    for u, _ in real_changes(name, LO, HI)[1]:
        probes += [u - 1, u, u + 1]
    for u in probes:
        assert tl.offset_at(u) == _zoneinfo_offset(zi, u), (name, _iso(u))


@pytest.mark.parametrize("name", ["America/New_York", "Pacific/Apia", "Australia/Lord_Howe"])
def test_interval_describes_the_neighbouring_offsets(name: str) -> None:
    """interval(u): u inside [start, end); `before`/`after` are the offsets just outside it."""
    zi = ZoneInfo(name)
    tl = timeline(name)
    for u, off in real_changes(name, LO, HI)[1]:
        start, end, o, before, after = tl.interval(u)
        assert (start, o) == (u, off)
        assert before == _zoneinfo_offset(zi, u - 1)
        assert after == _zoneinfo_offset(zi, end)
        assert _zoneinfo_offset(zi, end - 1) == off


def test_fixed_offset_timeline_has_no_transitions() -> None:
    tl = timeline("UTC")
    assert tl.fixed == 0
    start, end, off, before, after = tl.interval(0)
    assert (off, before, after) == (0, 0, 0)
    assert start < Y1900
    assert end > HI


def test_daily_probing_cannot_miss_a_change() -> None:
    """zone.py's premise: since 1900 no zone changes its offset twice within one day (probe step).

    Checked over the whole tz database on this machine: TZif tables plus footer rules up to 2040.
    """
    worst = (10**12, "")
    for name in sorted(zoneinfo.available_timezones()):
        try:
            _, changes = real_changes(name, Y1900, HI)
        except (OSError, ValueError):  # pragma: no cover - a broken or non-TZif file in the tree
            continue
        for (u1, _), (u2, _) in itertools.pairwise(changes):
            if u2 - u1 < worst[0]:
                worst = (u2 - u1, f"{name} {_iso(u1)} .. {_iso(u2)}")
    assert worst[0] > 86400, worst
