"""UTC-offset timelines of IANA zones: where the offset changes, and to what.

zoneinfo answers "what is the offset at instant u" but not "when does it next change", which the DST
policies need. We find the changes by probing zoneinfo once per zone and year (one probe every three days, then a
binary search to the exact second) and cache them, so zoneinfo stays the only source of tz data and
both the TZif transition table and its POSIX footer rule (used for years the table does not list) are
honoured. Probing three days apart cannot miss a change: the closest pair of real offset changes in the
whole tz database since 1900 is four days apart (Africa/Freetown, 1939; tests/unit/timeplan/
test_zone.py checks our transitions against the TZif tables).

An interval is `(start, end, offset, offset_before, offset_after)`: every instant in [start, end) has
`offset` seconds east of UTC; the neighbours' offsets tell a DST gap (offset grows at the boundary)
from an overlap (offset shrinks).
"""

from __future__ import annotations

import threading
from bisect import bisect_right
from datetime import UTC, datetime, timezone, tzinfo
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from scheduler.errors import InvalidArgument

NEG_INF = -(2**62)
POS_INF = 2**62
_DAY = 86400
# Safe because real offset changes are never closer than 4 days (see module docstring).
_PROBE_STEP = 3 * _DAY
_YEAR = 366 * _DAY
# Instants outside this range are clamped for offset lookups (datetime's own limits, with margin).
_MIN_INSTANT = int(datetime(2, 1, 1, tzinfo=UTC).timestamp())
_MAX_INSTANT = int(datetime(9998, 12, 1, tzinfo=UTC).timestamp())

Interval = tuple[int, int, int, int, int]


MAX_ZONE_NAME = 64
# Files in the zoneinfo directory that are not IANA zone names: `localtime` is the host's own zone (the same
# schedule would plan other instants on each host), `posixrules` and `Factory` are tzdata internals, and the
# `posix/` and `right/` trees are copies (`right/` counts leap seconds: other instants than the IANA name).
_NOT_IANA = ("localtime", "posixrules", "Factory")
_NOT_IANA_TREES = ("posix/", "right/")


def check_zone_name(name: str, field: str = "time_zone") -> None:
    """Refuse input that names a zone file that is not an IANA zone (an outside audit, session 36: `localtime`
    was stored and planned by each planner host's own /etc/localtime). Only for input: a stored schedule is
    planned as it was accepted."""
    if name in _NOT_IANA or name.startswith(_NOT_IANA_TREES):
        raise InvalidArgument(field, f"{name!r} is not an IANA time zone name (e.g. Europe/Paris, UTC)")


@lru_cache(maxsize=1024)
def get_zone(name: str) -> tzinfo:
    if name in ("UTC", "Etc/UTC", "Z"):
        return UTC
    if len(name) > MAX_ZONE_NAME:
        raise InvalidArgument("time_zone", f"is {len(name)} characters; IANA names are at most {MAX_ZONE_NAME}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as e:
        # OSError: names that reach the file system oddly (a directory such as `Europe`, a name too long).
        raise InvalidArgument("time_zone", f"{name!r} is not a known IANA time zone") from e


class ZoneTimeline:
    """Offset changes of one zone, discovered lazily a year at a time and cached (thread-safe)."""

    def __init__(self, tz: tzinfo) -> None:
        self.tz = tz
        self._lock = threading.Lock()
        self.fixed: int | None = None
        if tz is UTC or isinstance(tz, timezone):
            self.fixed = self._probe(0)
        # (lo, hi, transition instants, offset from each transition on, offset before the first).
        # Covered instants are [lo, hi). One tuple, swapped whole, so that lock-free readers never see
        # a half-extended table.
        self._data: tuple[int, int, list[int], list[int], int] | None = None

    def _probe(self, u: int) -> int:
        u = min(max(u, _MIN_INSTANT), _MAX_INSTANT)
        off = datetime.fromtimestamp(u, self.tz).utcoffset()
        assert off is not None
        return int(off.total_seconds())

    def _scan(self, a: int, b: int) -> tuple[list[int], list[int]]:
        """Offset changes in (a, b]: probe every few days, then bisect each change to the exact second."""
        trans: list[int] = []
        offs: list[int] = []
        prev = self._probe(a)
        x = a
        while x < b:
            y = min(x + _PROBE_STEP, b)
            o = self._probe(y)
            if o != prev:
                lo, hi = x, y  # offset(lo) == prev, offset(hi) == o
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if self._probe(mid) == prev:
                        lo = mid
                    else:
                        hi = mid
                trans.append(hi)
                offs.append(o)
                prev = o
            x = y
        return trans, offs

    def _covered(self, u: int) -> tuple[int, int, list[int], list[int], int]:
        """The table, extended (under the lock) so that u has half a year of margin on both sides."""
        data = self._data
        if data is not None and data[0] + _YEAR // 2 <= u < data[1] - _YEAR // 2:
            return data
        with self._lock:
            data = self._data
            if data is None:
                lo = u - _YEAR
                data = (lo, lo, [], [], self._probe(lo))
            lo, hi, trans, offs, off_lo = data
            if u + _YEAR // 2 >= hi:
                end = max(u + _YEAR, hi + _YEAR)
                t, o = self._scan(hi, end)
                trans, offs, hi = trans + t, offs + o, end
            if u - _YEAR // 2 < lo:
                start = min(u - _YEAR, lo - _YEAR)
                t, o = self._scan(start, lo)
                trans, offs, lo, off_lo = t + trans, o + offs, start, self._probe(start)
            data = (lo, hi, trans, offs, off_lo)
            self._data = data
            return data

    def offset_at(self, u: int) -> int:
        if self.fixed is not None:
            return self.fixed
        _, _, trans, offs, off_lo = self._covered(u)
        i = bisect_right(trans, u)
        return offs[i - 1] if i else off_lo

    def interval(self, u: int) -> Interval:
        """The constant-offset interval containing instant u, with its neighbours' offsets.

        Where no change is known within the covered range, the interval ends at the range's edge and
        the neighbour's offset equals its own: callers treat such an edge as "no transition".
        """
        if self.fixed is not None:
            return (NEG_INF, POS_INF, self.fixed, self.fixed, self.fixed)
        lo, hi, trans, offs, off_lo = self._covered(u)
        i = bisect_right(trans, u)
        off = offs[i - 1] if i else off_lo
        if i:
            start, before = trans[i - 1], (offs[i - 2] if i >= 2 else off_lo)
        else:
            start, before = lo, off
        if i < len(trans):
            end, after = trans[i], offs[i]
        else:
            end, after = hi, off
        return (start, end, off, before, after)


_TIMELINES: dict[str, ZoneTimeline] = {}


def timeline(name: str) -> ZoneTimeline:
    tl = _TIMELINES.get(name)
    if tl is None:
        tl = _TIMELINES.setdefault(name, ZoneTimeline(get_zone(name)))
    return tl
