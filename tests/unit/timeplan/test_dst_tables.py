"""DST behaviour across real transitions: named table cases, then a brute-force sweep.

Every expected instant below was derived by hand from the zone's rules (offsets and transition instants
looked up with zoneinfo, never with the engine) and is written in UTC, with the local wall time in the
comment. Semantics under test (docs: plan.py, DESIGN.md "Time"):

* the calendar is expanded in local wall time;
* a wall time in a gap (spring forward) runs under `shift` at the first instant after the gap, i.e. the
  transition instant (several gap times collapse into that one instant, and into a real wall time that
  maps to the same instant), and under `skip` not at all;
* a wall time that happens twice (fall back) runs at its `first`, `last` or `both` occurrences;
* defaults (cronie): fixed-time specs (neither minute nor hour field starts with `*`) get shift + first,
  every other spec skip + both; a flag that is given explicitly replaces only its own default.

Transitions (UTC instant; local wall clock before -> after):
  America/New_York     2026-03-08 07:00  02:00 EST -> 03:00 EDT    gap     [02:00, 03:00)
                       2026-11-01 06:00  02:00 EDT -> 01:00 EST    overlap [01:00, 02:00)
  Europe/London        2026-03-29 01:00  01:00 GMT -> 02:00 BST    gap     [01:00, 02:00)
                       2026-10-25 01:00  02:00 BST -> 01:00 GMT    overlap [01:00, 02:00)
  Australia/Lord_Howe  2026-04-04 15:00  04-05 02:00 +11 -> 01:30 +1030   overlap [01:30, 02:00)
                       2026-10-03 15:30  10-04 02:00 +1030 -> 02:30 +11   gap     [02:00, 02:30)
  Africa/Cairo         2026-04-23 22:00  Fri 04-24 00:00 +02 -> 01:00 +03 gap     [00:00, 01:00)
                       2026-10-29 21:00  Thu 10-29 24:00 +03 -> 23:00 +02 overlap [23:00, 24:00)
  America/Santiago     2026-04-05 03:00  Sat 04-04 24:00 -03 -> 23:00 -04 overlap [23:00, 24:00)
                       2026-09-06 04:00  Sat 09-05 24:00 -04 -> Sun 01:00 -03 gap 09-06 [00:00, 01:00)
  Pacific/Apia         2011-12-30 10:00  Thu 12-29 24:00 -10 -> Sat 12-31 00:00 +14: Friday 12-30 is gone
  Asia/Kolkata         none: +05:30 all year
"""

from __future__ import annotations

import io
import os
import zoneinfo
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from itertools import islice, pairwise
from zoneinfo import ZoneInfo
from zoneinfo._common import load_data

import pytest
from _pytest.mark.structures import ParameterSet

from scheduler.timeplan import DstGap, DstOverlap, Plan, parse_spec, to_ms

MS = timedelta(milliseconds=1)


def z(text: str) -> datetime:
    """'2026-03-08 07:00' as a UTC instant."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@dataclass(frozen=True)
class Case:
    spec: str
    tz: str
    flags: str  # "" = defaults; "skip", "last", "skip+both", ...
    start: str  # window (start, end], UTC
    end: str
    expected: tuple[str, ...]
    at: str | None  # the transition instant (UTC), probed on both sides

    def policies(self) -> tuple[DstGap | None, DstOverlap | None]:
        gap: DstGap | None = None
        overlap: DstOverlap | None = None
        for f in filter(None, self.flags.split("+")):
            if f in DstGap.__members__.values():
                gap = DstGap(f)
            else:
                overlap = DstOverlap(f)
        return gap, overlap

    def plan(self) -> Plan:
        gap, overlap = self.policies()
        return parse_spec(self.spec, schedule_id="dst-table", tz=self.tz, dst_gap=gap, dst_overlap=overlap)

    @property
    def a(self) -> datetime:
        return z(self.start)

    @property
    def b(self) -> datetime:
        return z(self.end)

    @property
    def want(self) -> list[datetime]:
        return [z(e) for e in self.expected]


def case(
    id_: str, spec: str, tz: str, flags: str, window: tuple[str, str], *expected: str, at: str | None
) -> ParameterSet:
    return pytest.param(Case(spec, tz, flags, window[0], window[1], expected, at), id=id_)


NY, LON, LHI, CAI, SCL, APIA, KOL = (
    "America/New_York",
    "Europe/London",
    "Australia/Lord_Howe",
    "Africa/Cairo",
    "America/Santiago",
    "Pacific/Apia",
    "Asia/Kolkata",
)

# The tables are laid out by hand: one case per row group, expected instants in time order.
# fmt: off

# America/New_York, spring forward 2026-03-08 07:00Z: 02:00 EST -> 03:00 EDT.
NY_SP = "2026-03-08 07:00"
NY_SP_W = ("2026-03-07 00:00", "2026-03-10 00:00")
# 02:30 EST on 03-07 = 07:30Z; on 03-08 02:30 does not exist -> 07:00Z; 02:30 EDT on 03-09 = 06:30Z.
NY_SP_0230 = ("2026-03-07 07:30", "2026-03-08 07:00", "2026-03-09 06:30")
NY_SPRING = [
    case("ny-spring-0230-defaults-shift", "30 2 * * *", NY, "", NY_SP_W, *NY_SP_0230, at=NY_SP),
    case("ny-spring-0230-shift", "30 2 * * *", NY, "shift", NY_SP_W, *NY_SP_0230, at=NY_SP),
    case(
        "ny-spring-0230-skip", "30 2 * * *", NY, "skip", NY_SP_W,
        "2026-03-07 07:30", "2026-03-09 06:30", at=NY_SP,
    ),
    case("ny-spring-0230-first", "30 2 * * *", NY, "first", NY_SP_W, *NY_SP_0230, at=NY_SP),
    case("ny-spring-0230-last", "30 2 * * *", NY, "last", NY_SP_W, *NY_SP_0230, at=NY_SP),
    case("ny-spring-0230-both", "30 2 * * *", NY, "both", NY_SP_W, *NY_SP_0230, at=NY_SP),
    case(
        "ny-spring-0230-skip+both", "30 2 * * *", NY, "skip+both", NY_SP_W,
        "2026-03-07 07:30", "2026-03-09 06:30", at=NY_SP,
    ),
    # 02:00 and 02:30 both shift to 07:00Z and collapse into one run.
    case(
        "ny-spring-0200+0230-collapse", "0,30 2 * * *", NY, "", NY_SP_W,
        "2026-03-07 07:00", "2026-03-07 07:30", "2026-03-08 07:00", "2026-03-09 06:00", "2026-03-09 06:30",
        at=NY_SP,
    ),
    # 02:00 shifts to 07:00Z, which is also 03:00 EDT: one run, not two.
    case(
        "ny-spring-0200+0300-collapse", "0 2,3 * * *", NY, "", NY_SP_W,
        "2026-03-07 07:00", "2026-03-07 08:00", "2026-03-08 07:00", "2026-03-09 06:00", "2026-03-09 07:00",
        at=NY_SP,
    ),
    case(
        "ny-spring-0159-before-gap", "59 1 * * *", NY, "", NY_SP_W,
        "2026-03-07 06:59", "2026-03-08 06:59", "2026-03-09 05:59", at=NY_SP,
    ),
    case(
        "ny-spring-0300-after-gap", "0 3 * * *", NY, "", NY_SP_W,
        "2026-03-07 08:00", "2026-03-08 07:00", "2026-03-09 07:00", at=NY_SP,
    ),
    # 00:00 01:00 EST, (02:00 missing), 03:00 04:00 05:00 EDT: every real hour once.
    case(
        "ny-spring-hourly-defaults-skip", "0 * * * *", NY, "", ("2026-03-08 04:00", "2026-03-08 09:00"),
        "2026-03-08 05:00", "2026-03-08 06:00", "2026-03-08 07:00", "2026-03-08 08:00", "2026-03-08 09:00",
        at=NY_SP,
    ),
    case(
        "ny-spring-hourly-shift", "0 * * * *", NY, "shift", ("2026-03-08 04:00", "2026-03-08 09:00"),
        "2026-03-08 05:00", "2026-03-08 06:00", "2026-03-08 07:00", "2026-03-08 08:00", "2026-03-08 09:00",
        at=NY_SP,
    ),
    # 00:30 01:30 EST, 02:30 missing, 03:30 04:30 EDT.
    case(
        "ny-spring-half-past-defaults-skip", "30 * * * *", NY, "", ("2026-03-08 05:00", "2026-03-08 09:00"),
        "2026-03-08 05:30", "2026-03-08 06:30", "2026-03-08 07:30", "2026-03-08 08:30", at=NY_SP,
    ),
    case(
        "ny-spring-half-past-shift", "30 * * * *", NY, "shift", ("2026-03-08 05:00", "2026-03-08 09:00"),
        "2026-03-08 05:30", "2026-03-08 06:30", "2026-03-08 07:00", "2026-03-08 07:30", "2026-03-08 08:30",
        at=NY_SP,
    ),
    case(
        "ny-spring-every15-defaults-skip", "*/15 * * * *", NY, "", ("2026-03-08 06:30", "2026-03-08 07:30"),
        "2026-03-08 06:45", "2026-03-08 07:00", "2026-03-08 07:15", "2026-03-08 07:30", at=NY_SP,
    ),
    case(
        "ny-spring-every15-shift", "*/15 * * * *", NY, "shift", ("2026-03-08 06:30", "2026-03-08 07:30"),
        "2026-03-08 06:45", "2026-03-08 07:00", "2026-03-08 07:15", "2026-03-08 07:30", at=NY_SP,
    ),
]

# America/New_York, fall back 2026-11-01 06:00Z: 02:00 EDT -> 01:00 EST; 01:00-01:59 happen at
# 05:00-05:59Z (EDT) and again at 06:00-06:59Z (EST).
NY_FB = "2026-11-01 06:00"
NY_FB_W = ("2026-10-31 00:00", "2026-11-03 00:00")
NY_FB_0130_FIRST = ("2026-10-31 05:30", "2026-11-01 05:30", "2026-11-02 06:30")
NY_FALL = [
    case("ny-fall-0130-defaults-first", "30 1 * * *", NY, "", NY_FB_W, *NY_FB_0130_FIRST, at=NY_FB),
    case("ny-fall-0130-first", "30 1 * * *", NY, "first", NY_FB_W, *NY_FB_0130_FIRST, at=NY_FB),
    case(
        "ny-fall-0130-last", "30 1 * * *", NY, "last", NY_FB_W,
        "2026-10-31 05:30", "2026-11-01 06:30", "2026-11-02 06:30", at=NY_FB,
    ),
    case(
        "ny-fall-0130-both", "30 1 * * *", NY, "both", NY_FB_W,
        "2026-10-31 05:30", "2026-11-01 05:30", "2026-11-01 06:30", "2026-11-02 06:30", at=NY_FB,
    ),
    case("ny-fall-0130-shift", "30 1 * * *", NY, "shift", NY_FB_W, *NY_FB_0130_FIRST, at=NY_FB),
    case("ny-fall-0130-skip", "30 1 * * *", NY, "skip", NY_FB_W, *NY_FB_0130_FIRST, at=NY_FB),
    case(
        "ny-fall-0100-both", "0 1 * * *", NY, "both", NY_FB_W,
        "2026-10-31 05:00", "2026-11-01 05:00", "2026-11-01 06:00", "2026-11-02 06:00", at=NY_FB,
    ),
    case(
        "ny-fall-0100-last", "0 1 * * *", NY, "last", NY_FB_W,
        "2026-10-31 05:00", "2026-11-01 06:00", "2026-11-02 06:00", at=NY_FB,
    ),
    case(
        "ny-fall-0200-after-overlap", "0 2 * * *", NY, "", NY_FB_W,
        "2026-10-31 06:00", "2026-11-01 07:00", "2026-11-02 07:00", at=NY_FB,
    ),
    case(
        "ny-fall-0059-before-overlap", "59 0 * * *", NY, "", NY_FB_W,
        "2026-10-31 04:59", "2026-11-01 04:59", "2026-11-02 05:59", at=NY_FB,
    ),
    # 00:00 EDT, 01:00 EDT, 01:00 EST, 02:00 EST, 03:00 EST.
    case(
        "ny-fall-hourly-defaults-both", "0 * * * *", NY, "", ("2026-11-01 03:00", "2026-11-01 08:00"),
        "2026-11-01 04:00", "2026-11-01 05:00", "2026-11-01 06:00", "2026-11-01 07:00", "2026-11-01 08:00",
        at=NY_FB,
    ),
    case(
        "ny-fall-hourly-first", "0 * * * *", NY, "first", ("2026-11-01 03:00", "2026-11-01 08:00"),
        "2026-11-01 04:00", "2026-11-01 05:00", "2026-11-01 07:00", "2026-11-01 08:00", at=NY_FB,
    ),
    case(
        "ny-fall-hourly-last", "0 * * * *", NY, "last", ("2026-11-01 03:00", "2026-11-01 08:00"),
        "2026-11-01 04:00", "2026-11-01 06:00", "2026-11-01 07:00", "2026-11-01 08:00", at=NY_FB,
    ),
    case(
        "ny-fall-every30-defaults-both", "*/30 * * * *", NY, "", ("2026-11-01 04:45", "2026-11-01 07:15"),
        "2026-11-01 05:00", "2026-11-01 05:30", "2026-11-01 06:00", "2026-11-01 06:30", "2026-11-01 07:00",
        at=NY_FB,
    ),
    case(
        "ny-fall-every30-first", "*/30 * * * *", NY, "first", ("2026-11-01 04:45", "2026-11-01 07:15"),
        "2026-11-01 05:00", "2026-11-01 05:30", "2026-11-01 07:00", at=NY_FB,
    ),
    case(
        "ny-fall-every30-last", "*/30 * * * *", NY, "last", ("2026-11-01 04:45", "2026-11-01 07:15"),
        "2026-11-01 06:00", "2026-11-01 06:30", "2026-11-01 07:00", at=NY_FB,
    ),
]

# Europe/London, spring forward 2026-03-29 01:00Z: 01:00 GMT -> 02:00 BST.
LON_SP = "2026-03-29 01:00"
LON_SP_W = ("2026-03-28 00:00", "2026-03-31 00:00")
LON_SP_0130 = ("2026-03-28 01:30", "2026-03-29 01:00", "2026-03-30 00:30")
LONDON_SPRING = [
    case("london-spring-0130-defaults-shift", "30 1 * * *", LON, "", LON_SP_W, *LON_SP_0130, at=LON_SP),
    case("london-spring-0130-shift", "30 1 * * *", LON, "shift", LON_SP_W, *LON_SP_0130, at=LON_SP),
    case(
        "london-spring-0130-skip", "30 1 * * *", LON, "skip", LON_SP_W,
        "2026-03-28 01:30", "2026-03-30 00:30", at=LON_SP,
    ),
    case("london-spring-0130-first", "30 1 * * *", LON, "first", LON_SP_W, *LON_SP_0130, at=LON_SP),
    case("london-spring-0130-last", "30 1 * * *", LON, "last", LON_SP_W, *LON_SP_0130, at=LON_SP),
    case("london-spring-0130-both", "30 1 * * *", LON, "both", LON_SP_W, *LON_SP_0130, at=LON_SP),
    case(
        "london-spring-0200-after-gap", "0 2 * * *", LON, "", LON_SP_W,
        "2026-03-28 02:00", "2026-03-29 01:00", "2026-03-30 01:00", at=LON_SP,
    ),
    # 00:59 BST on 03-30 and 03-31 is 23:59Z the day before.
    case(
        "london-spring-0059-before-gap", "59 0 * * *", LON, "", LON_SP_W,
        "2026-03-28 00:59", "2026-03-29 00:59", "2026-03-29 23:59", "2026-03-30 23:59", at=LON_SP,
    ),
    case(
        "london-spring-hourly-defaults-skip", "0 * * * *", LON, "", ("2026-03-28 23:00", "2026-03-29 03:00"),
        "2026-03-29 00:00", "2026-03-29 01:00", "2026-03-29 02:00", "2026-03-29 03:00", at=LON_SP,
    ),
    # 00:15 00:45 GMT, (01:15 01:45 missing), 02:15 02:45 BST.
    case(
        "london-spring-15-45-defaults-skip", "15,45 * * * *", LON, "",
        ("2026-03-29 00:00", "2026-03-29 02:00"),
        "2026-03-29 00:15", "2026-03-29 00:45", "2026-03-29 01:15", "2026-03-29 01:45", at=LON_SP,
    ),
    case(
        "london-spring-15-45-shift", "15,45 * * * *", LON, "shift", ("2026-03-29 00:00", "2026-03-29 02:00"),
        "2026-03-29 00:15", "2026-03-29 00:45", "2026-03-29 01:00", "2026-03-29 01:15", "2026-03-29 01:45",
        at=LON_SP,
    ),
    case(
        "london-spring-every30-shift", "*/30 * * * *", LON, "shift", ("2026-03-29 00:00", "2026-03-29 02:00"),
        "2026-03-29 00:30", "2026-03-29 01:00", "2026-03-29 01:30", "2026-03-29 02:00", at=LON_SP,
    ),
]

# Europe/London, fall back 2026-10-25 01:00Z: 02:00 BST -> 01:00 GMT; 01:00-01:59 at 00:00-00:59Z (BST)
# and 01:00-01:59Z (GMT).
LON_FB = "2026-10-25 01:00"
LON_FB_W = ("2026-10-24 00:00", "2026-10-27 00:00")
LON_FB_0130_FIRST = ("2026-10-24 00:30", "2026-10-25 00:30", "2026-10-26 01:30")
LONDON_FALL = [
    case("london-fall-0130-defaults-first", "30 1 * * *", LON, "", LON_FB_W, *LON_FB_0130_FIRST, at=LON_FB),
    case("london-fall-0130-first", "30 1 * * *", LON, "first", LON_FB_W, *LON_FB_0130_FIRST, at=LON_FB),
    case(
        "london-fall-0130-last", "30 1 * * *", LON, "last", LON_FB_W,
        "2026-10-24 00:30", "2026-10-25 01:30", "2026-10-26 01:30", at=LON_FB,
    ),
    case(
        "london-fall-0130-both", "30 1 * * *", LON, "both", LON_FB_W,
        "2026-10-24 00:30", "2026-10-25 00:30", "2026-10-25 01:30", "2026-10-26 01:30", at=LON_FB,
    ),
    case("london-fall-0130-skip", "30 1 * * *", LON, "skip", LON_FB_W, *LON_FB_0130_FIRST, at=LON_FB),
    case("london-fall-0130-shift", "30 1 * * *", LON, "shift", LON_FB_W, *LON_FB_0130_FIRST, at=LON_FB),
    case(
        "london-fall-0200-after-overlap", "0 2 * * *", LON, "", LON_FB_W,
        "2026-10-24 01:00", "2026-10-25 02:00", "2026-10-26 02:00", at=LON_FB,
    ),
    # 00:59 BST on 10-25 is 23:59Z on 10-24; 00:59 GMT on 10-26 is 00:59Z.
    case(
        "london-fall-0059-before-overlap", "59 0 * * *", LON, "", LON_FB_W,
        "2026-10-24 23:59", "2026-10-26 00:59", at=LON_FB,
    ),
    case(
        "london-fall-hourly-defaults-both", "0 * * * *", LON, "", ("2026-10-24 23:30", "2026-10-25 03:00"),
        "2026-10-25 00:00", "2026-10-25 01:00", "2026-10-25 02:00", "2026-10-25 03:00", at=LON_FB,
    ),
    case(
        "london-fall-hourly-first", "0 * * * *", LON, "first", ("2026-10-24 23:30", "2026-10-25 03:00"),
        "2026-10-25 00:00", "2026-10-25 02:00", "2026-10-25 03:00", at=LON_FB,
    ),
    case(
        "london-fall-hourly-last", "0 * * * *", LON, "last", ("2026-10-24 23:30", "2026-10-25 03:00"),
        "2026-10-25 01:00", "2026-10-25 02:00", "2026-10-25 03:00", at=LON_FB,
    ),
    case(
        "london-fall-every30-defaults-both", "*/30 * * * *", LON, "", ("2026-10-24 23:45", "2026-10-25 02:00"),
        "2026-10-25 00:00", "2026-10-25 00:30", "2026-10-25 01:00", "2026-10-25 01:30", "2026-10-25 02:00",
        at=LON_FB,
    ),
]

# Australia/Lord_Howe, fall back 2026-04-04 15:00Z: 04-05 02:00 +11 -> 01:30 +1030 (a 30-minute shift);
# 01:30-01:59 happen at 14:30-14:59Z (+11) and at 15:00-15:29Z (+1030).
LHI_FB = "2026-04-04 15:00"
LHI_FB_W = ("2026-04-03 00:00", "2026-04-06 00:00")
LHI_FB_0145_FIRST = ("2026-04-03 14:45", "2026-04-04 14:45", "2026-04-05 15:15")
LORD_HOWE_FALL = [
    case("lord-howe-fall-0145-defaults-first", "45 1 * * *", LHI, "", LHI_FB_W, *LHI_FB_0145_FIRST, at=LHI_FB),
    case("lord-howe-fall-0145-first", "45 1 * * *", LHI, "first", LHI_FB_W, *LHI_FB_0145_FIRST, at=LHI_FB),
    case(
        "lord-howe-fall-0145-last", "45 1 * * *", LHI, "last", LHI_FB_W,
        "2026-04-03 14:45", "2026-04-04 15:15", "2026-04-05 15:15", at=LHI_FB,
    ),
    case(
        "lord-howe-fall-0145-both", "45 1 * * *", LHI, "both", LHI_FB_W,
        "2026-04-03 14:45", "2026-04-04 14:45", "2026-04-04 15:15", "2026-04-05 15:15", at=LHI_FB,
    ),
    case("lord-howe-fall-0145-skip", "45 1 * * *", LHI, "skip", LHI_FB_W, *LHI_FB_0145_FIRST, at=LHI_FB),
    case("lord-howe-fall-0145-shift", "45 1 * * *", LHI, "shift", LHI_FB_W, *LHI_FB_0145_FIRST, at=LHI_FB),
    # 01:30 is the first ambiguous minute.
    case(
        "lord-howe-fall-0130-both", "30 1 * * *", LHI, "both", LHI_FB_W,
        "2026-04-03 14:30", "2026-04-04 14:30", "2026-04-04 15:00", "2026-04-05 15:00", at=LHI_FB,
    ),
    case(
        "lord-howe-fall-0200-after-overlap", "0 2 * * *", LHI, "", LHI_FB_W,
        "2026-04-03 15:00", "2026-04-04 15:30", "2026-04-05 15:30", at=LHI_FB,
    ),
    case(
        "lord-howe-fall-0129-before-overlap", "29 1 * * *", LHI, "", LHI_FB_W,
        "2026-04-03 14:29", "2026-04-04 14:29", "2026-04-05 14:59", at=LHI_FB,
    ),
    # 01:00 +11 (14:00Z) then 02:00 +1030 (15:30Z): no o'clock wall time lies in the overlap.
    case(
        "lord-howe-fall-hourly-defaults-both", "0 * * * *", LHI, "", ("2026-04-04 13:00", "2026-04-04 17:00"),
        "2026-04-04 14:00", "2026-04-04 15:30", "2026-04-04 16:30", at=LHI_FB,
    ),
    case(
        "lord-howe-fall-every30-defaults-both", "*/30 * * * *", LHI, "",
        ("2026-04-04 13:45", "2026-04-04 16:15"),
        "2026-04-04 14:00", "2026-04-04 14:30", "2026-04-04 15:00", "2026-04-04 15:30", "2026-04-04 16:00",
        at=LHI_FB,
    ),
    case(
        "lord-howe-fall-every30-first", "*/30 * * * *", LHI, "first", ("2026-04-04 13:45", "2026-04-04 16:15"),
        "2026-04-04 14:00", "2026-04-04 14:30", "2026-04-04 15:30", "2026-04-04 16:00", at=LHI_FB,
    ),
    case(
        "lord-howe-fall-every30-last", "*/30 * * * *", LHI, "last", ("2026-04-04 13:45", "2026-04-04 16:15"),
        "2026-04-04 14:00", "2026-04-04 15:00", "2026-04-04 15:30", "2026-04-04 16:00", at=LHI_FB,
    ),
    case(
        "lord-howe-fall-every15-defaults-both", "*/15 * * * *", LHI, "",
        ("2026-04-04 14:20", "2026-04-04 15:40"),
        "2026-04-04 14:30", "2026-04-04 14:45", "2026-04-04 15:00", "2026-04-04 15:15", "2026-04-04 15:30",
        at=LHI_FB,
    ),
]

# Australia/Lord_Howe, spring forward 2026-10-03 15:30Z: 10-04 02:00 +1030 -> 02:30 +11.
LHI_SP = "2026-10-03 15:30"
LHI_SP_W = ("2026-10-02 00:00", "2026-10-05 00:00")
LHI_SP_0215 = ("2026-10-02 15:45", "2026-10-03 15:30", "2026-10-04 15:15")
LORD_HOWE_SPRING = [
    case("lord-howe-spring-0215-defaults-shift", "15 2 * * *", LHI, "", LHI_SP_W, *LHI_SP_0215, at=LHI_SP),
    case("lord-howe-spring-0215-shift", "15 2 * * *", LHI, "shift", LHI_SP_W, *LHI_SP_0215, at=LHI_SP),
    case(
        "lord-howe-spring-0215-skip", "15 2 * * *", LHI, "skip", LHI_SP_W,
        "2026-10-02 15:45", "2026-10-04 15:15", at=LHI_SP,
    ),
    case("lord-howe-spring-0215-first", "15 2 * * *", LHI, "first", LHI_SP_W, *LHI_SP_0215, at=LHI_SP),
    case("lord-howe-spring-0215-last", "15 2 * * *", LHI, "last", LHI_SP_W, *LHI_SP_0215, at=LHI_SP),
    case("lord-howe-spring-0215-both", "15 2 * * *", LHI, "both", LHI_SP_W, *LHI_SP_0215, at=LHI_SP),
    case(
        "lord-howe-spring-0200+0215-collapse", "0,15 2 * * *", LHI, "", LHI_SP_W,
        "2026-10-02 15:30", "2026-10-02 15:45", "2026-10-03 15:30", "2026-10-04 15:00", "2026-10-04 15:15",
        at=LHI_SP,
    ),
    case(
        "lord-howe-spring-0230-after-gap", "30 2 * * *", LHI, "", LHI_SP_W,
        "2026-10-02 16:00", "2026-10-03 15:30", "2026-10-04 15:30", at=LHI_SP,
    ),
    case(
        "lord-howe-spring-0159-before-gap", "59 1 * * *", LHI, "", LHI_SP_W,
        "2026-10-02 15:29", "2026-10-03 15:29", "2026-10-04 14:59", at=LHI_SP,
    ),
    # 01:00 +1030 (14:30Z), 02:00 missing, 03:00 +11 (16:00Z): a 90-minute real gap.
    case(
        "lord-howe-spring-hourly-defaults-skip", "0 * * * *", LHI, "",
        ("2026-10-03 14:00", "2026-10-03 17:00"),
        "2026-10-03 14:30", "2026-10-03 16:00", "2026-10-03 17:00", at=LHI_SP,
    ),
    case(
        "lord-howe-spring-hourly-shift", "0 * * * *", LHI, "shift", ("2026-10-03 14:00", "2026-10-03 17:00"),
        "2026-10-03 14:30", "2026-10-03 15:30", "2026-10-03 16:00", "2026-10-03 17:00", at=LHI_SP,
    ),
    # 01:40 +1030, (02:00 02:20 missing), 02:40 03:00 +11.
    case(
        "lord-howe-spring-every20-defaults-skip", "*/20 * * * *", LHI, "",
        ("2026-10-03 15:00", "2026-10-03 16:00"),
        "2026-10-03 15:10", "2026-10-03 15:40", "2026-10-03 16:00", at=LHI_SP,
    ),
    case(
        "lord-howe-spring-every20-shift", "*/20 * * * *", LHI, "shift", ("2026-10-03 15:00", "2026-10-03 16:00"),
        "2026-10-03 15:10", "2026-10-03 15:30", "2026-10-03 15:40", "2026-10-03 16:00", at=LHI_SP,
    ),
    case(
        "lord-howe-spring-every30-defaults-skip", "*/30 * * * *", LHI, "",
        ("2026-10-03 14:45", "2026-10-03 16:30"),
        "2026-10-03 15:00", "2026-10-03 15:30", "2026-10-03 16:00", "2026-10-03 16:30", at=LHI_SP,
    ),
]

# Africa/Cairo, spring forward at midnight 2026-04-23 22:00Z: Friday 04-24 00:00 +02 -> 01:00 +03.
CAI_SP = "2026-04-23 22:00"
CAI_SP_W = ("2026-04-22 00:00", "2026-04-25 00:00")
CAI_SP_MIDNIGHT = ("2026-04-22 22:00", "2026-04-23 22:00", "2026-04-24 21:00")
CAIRO_SPRING = [
    case("cairo-spring-midnight-defaults-shift", "0 0 * * *", CAI, "", CAI_SP_W, *CAI_SP_MIDNIGHT, at=CAI_SP),
    case("cairo-spring-midnight-shift", "0 0 * * *", CAI, "shift", CAI_SP_W, *CAI_SP_MIDNIGHT, at=CAI_SP),
    # Under skip the midnight job does not run on 04-24 at all.
    case(
        "cairo-spring-midnight-skip", "0 0 * * *", CAI, "skip", CAI_SP_W,
        "2026-04-22 22:00", "2026-04-24 21:00", at=CAI_SP,
    ),
    case("cairo-spring-midnight-first", "0 0 * * *", CAI, "first", CAI_SP_W, *CAI_SP_MIDNIGHT, at=CAI_SP),
    case("cairo-spring-midnight-last", "0 0 * * *", CAI, "last", CAI_SP_W, *CAI_SP_MIDNIGHT, at=CAI_SP),
    case("cairo-spring-midnight-both", "0 0 * * *", CAI, "both", CAI_SP_W, *CAI_SP_MIDNIGHT, at=CAI_SP),
    case(
        "cairo-spring-0030-defaults-shift", "30 0 * * *", CAI, "", CAI_SP_W,
        "2026-04-22 22:30", "2026-04-23 22:00", "2026-04-24 21:30", at=CAI_SP,
    ),
    case(
        "cairo-spring-0030-skip", "30 0 * * *", CAI, "skip", CAI_SP_W,
        "2026-04-22 22:30", "2026-04-24 21:30", at=CAI_SP,
    ),
    case(
        "cairo-spring-0100-after-gap", "0 1 * * *", CAI, "", CAI_SP_W,
        "2026-04-22 23:00", "2026-04-23 22:00", "2026-04-24 22:00", at=CAI_SP,
    ),
    case(
        "cairo-spring-2359-before-gap", "59 23 * * *", CAI, "", CAI_SP_W,
        "2026-04-22 21:59", "2026-04-23 21:59", "2026-04-24 20:59", at=CAI_SP,
    ),
    # Friday midnight: the Friday run shifts to 22:00Z, which is still Thursday in UTC.
    case(
        "cairo-spring-friday-midnight-shift", "0 0 * * 5", CAI, "", ("2026-04-16 00:00", "2026-05-02 00:00"),
        "2026-04-16 22:00", "2026-04-23 22:00", "2026-04-30 21:00", at=CAI_SP,
    ),
    case(
        "cairo-spring-friday-midnight-skip", "0 0 * * 5", CAI, "skip", ("2026-04-16 00:00", "2026-05-02 00:00"),
        "2026-04-16 22:00", "2026-04-30 21:00", at=CAI_SP,
    ),
    # 23:00 +02, (00:00 missing), 01:00 02:00 +03.
    case(
        "cairo-spring-hourly-defaults-skip", "0 * * * *", CAI, "", ("2026-04-23 20:30", "2026-04-23 23:00"),
        "2026-04-23 21:00", "2026-04-23 22:00", "2026-04-23 23:00", at=CAI_SP,
    ),
    case(
        "cairo-spring-every30-defaults-skip", "*/30 * * * *", CAI, "", ("2026-04-23 21:00", "2026-04-23 23:00"),
        "2026-04-23 21:30", "2026-04-23 22:00", "2026-04-23 22:30", "2026-04-23 23:00", at=CAI_SP,
    ),
    case(
        "cairo-spring-every30-shift", "*/30 * * * *", CAI, "shift", ("2026-04-23 21:00", "2026-04-23 23:00"),
        "2026-04-23 21:30", "2026-04-23 22:00", "2026-04-23 22:30", "2026-04-23 23:00", at=CAI_SP,
    ),
]

# Africa/Cairo, fall back at midnight 2026-10-29 21:00Z: Thursday 10-29 24:00 +03 -> 23:00 +02;
# 23:00-23:59 on 10-29 happen at 20:00-20:59Z (+03) and 21:00-21:59Z (+02).
CAI_FB = "2026-10-29 21:00"
CAI_FB_W = ("2026-10-28 00:00", "2026-10-31 00:00")
CAI_FB_2330_FIRST = ("2026-10-28 20:30", "2026-10-29 20:30", "2026-10-30 21:30")
CAIRO_FALL = [
    case("cairo-fall-2330-defaults-first", "30 23 * * *", CAI, "", CAI_FB_W, *CAI_FB_2330_FIRST, at=CAI_FB),
    case("cairo-fall-2330-first", "30 23 * * *", CAI, "first", CAI_FB_W, *CAI_FB_2330_FIRST, at=CAI_FB),
    case(
        "cairo-fall-2330-last", "30 23 * * *", CAI, "last", CAI_FB_W,
        "2026-10-28 20:30", "2026-10-29 21:30", "2026-10-30 21:30", at=CAI_FB,
    ),
    case(
        "cairo-fall-2330-both", "30 23 * * *", CAI, "both", CAI_FB_W,
        "2026-10-28 20:30", "2026-10-29 20:30", "2026-10-29 21:30", "2026-10-30 21:30", at=CAI_FB,
    ),
    case("cairo-fall-2330-skip", "30 23 * * *", CAI, "skip", CAI_FB_W, *CAI_FB_2330_FIRST, at=CAI_FB),
    case("cairo-fall-2330-shift", "30 23 * * *", CAI, "shift", CAI_FB_W, *CAI_FB_2330_FIRST, at=CAI_FB),
    case(
        "cairo-fall-thursday-2300-both", "0 23 * * 4", CAI, "both", ("2026-10-21 00:00", "2026-11-06 00:00"),
        "2026-10-22 20:00", "2026-10-29 20:00", "2026-10-29 21:00", "2026-11-05 21:00", at=CAI_FB,
    ),
    # Midnight right after the repeated hour: 10-29 00:00 +03 and 10-30 00:00 +02 are 25 hours apart.
    case(
        "cairo-fall-midnight-after-overlap", "0 0 * * *", CAI, "", CAI_FB_W,
        "2026-10-28 21:00", "2026-10-29 22:00", "2026-10-30 22:00", at=CAI_FB,
    ),
    case(
        "cairo-fall-2259-before-overlap", "59 22 * * *", CAI, "", CAI_FB_W,
        "2026-10-28 19:59", "2026-10-29 19:59", "2026-10-30 20:59", at=CAI_FB,
    ),
    case(
        "cairo-fall-hourly-defaults-both", "0 * * * *", CAI, "", ("2026-10-29 19:30", "2026-10-29 22:00"),
        "2026-10-29 20:00", "2026-10-29 21:00", "2026-10-29 22:00", at=CAI_FB,
    ),
    case(
        "cairo-fall-hourly-first", "0 * * * *", CAI, "first", ("2026-10-29 19:30", "2026-10-29 22:00"),
        "2026-10-29 20:00", "2026-10-29 22:00", at=CAI_FB,
    ),
    case(
        "cairo-fall-hourly-last", "0 * * * *", CAI, "last", ("2026-10-29 19:30", "2026-10-29 22:00"),
        "2026-10-29 21:00", "2026-10-29 22:00", at=CAI_FB,
    ),
    case(
        "cairo-fall-every30-both", "*/30 * * * *", CAI, "both", ("2026-10-29 19:45", "2026-10-29 22:00"),
        "2026-10-29 20:00", "2026-10-29 20:30", "2026-10-29 21:00", "2026-10-29 21:30", "2026-10-29 22:00",
        at=CAI_FB,
    ),
]

# America/Santiago, fall back at midnight 2026-04-05 03:00Z: Saturday 04-04 24:00 -03 -> 23:00 -04;
# 23:00-23:59 on 04-04 happen at 02:00-02:59Z (-03) and 03:00-03:59Z (-04).
SCL_FB = "2026-04-05 03:00"
SCL_FB_W = ("2026-04-03 12:00", "2026-04-06 12:00")
SCL_FB_2330_FIRST = ("2026-04-04 02:30", "2026-04-05 02:30", "2026-04-06 03:30")
SANTIAGO_FALL = [
    case("santiago-fall-2330-defaults-first", "30 23 * * *", SCL, "", SCL_FB_W, *SCL_FB_2330_FIRST, at=SCL_FB),
    case("santiago-fall-2330-first", "30 23 * * *", SCL, "first", SCL_FB_W, *SCL_FB_2330_FIRST, at=SCL_FB),
    case(
        "santiago-fall-2330-last", "30 23 * * *", SCL, "last", SCL_FB_W,
        "2026-04-04 02:30", "2026-04-05 03:30", "2026-04-06 03:30", at=SCL_FB,
    ),
    case(
        "santiago-fall-2330-both", "30 23 * * *", SCL, "both", SCL_FB_W,
        "2026-04-04 02:30", "2026-04-05 02:30", "2026-04-05 03:30", "2026-04-06 03:30", at=SCL_FB,
    ),
    case("santiago-fall-2330-skip", "30 23 * * *", SCL, "skip", SCL_FB_W, *SCL_FB_2330_FIRST, at=SCL_FB),
    case("santiago-fall-2330-shift", "30 23 * * *", SCL, "shift", SCL_FB_W, *SCL_FB_2330_FIRST, at=SCL_FB),
    case(
        "santiago-fall-2300-defaults-first", "0 23 * * *", SCL, "", SCL_FB_W,
        "2026-04-04 02:00", "2026-04-05 02:00", "2026-04-06 03:00", at=SCL_FB,
    ),
    case(
        "santiago-fall-midnight-after-overlap", "0 0 * * *", SCL, "", SCL_FB_W,
        "2026-04-04 03:00", "2026-04-05 04:00", "2026-04-06 04:00", at=SCL_FB,
    ),
    case(
        "santiago-fall-2259-before-overlap", "59 22 * * *", SCL, "", SCL_FB_W,
        "2026-04-04 01:59", "2026-04-05 01:59", "2026-04-06 02:59", at=SCL_FB,
    ),
    case(
        "santiago-fall-hourly-defaults-both", "0 * * * *", SCL, "", ("2026-04-05 01:30", "2026-04-05 04:00"),
        "2026-04-05 02:00", "2026-04-05 03:00", "2026-04-05 04:00", at=SCL_FB,
    ),
    case(
        "santiago-fall-hourly-first", "0 * * * *", SCL, "first", ("2026-04-05 01:30", "2026-04-05 04:00"),
        "2026-04-05 02:00", "2026-04-05 04:00", at=SCL_FB,
    ),
    case(
        "santiago-fall-hourly-last", "0 * * * *", SCL, "last", ("2026-04-05 01:30", "2026-04-05 04:00"),
        "2026-04-05 03:00", "2026-04-05 04:00", at=SCL_FB,
    ),
    case(
        "santiago-fall-every30-both", "*/30 * * * *", SCL, "both", ("2026-04-05 01:45", "2026-04-05 04:00"),
        "2026-04-05 02:00", "2026-04-05 02:30", "2026-04-05 03:00", "2026-04-05 03:30", "2026-04-05 04:00",
        at=SCL_FB,
    ),
]

# America/Santiago, spring forward at midnight 2026-09-06 04:00Z: Saturday 09-05 24:00 -04 -> Sunday 09-06
# 01:00 -03; 09-06 00:00-00:59 do not exist.
SCL_SP = "2026-09-06 04:00"
SCL_SP_W = ("2026-09-04 12:00", "2026-09-07 12:00")
SCL_SP_MIDNIGHT = ("2026-09-05 04:00", "2026-09-06 04:00", "2026-09-07 03:00")
SANTIAGO_SPRING = [
    case(
        "santiago-spring-midnight-defaults-shift", "0 0 * * *", SCL, "", SCL_SP_W, *SCL_SP_MIDNIGHT, at=SCL_SP
    ),
    case("santiago-spring-midnight-shift", "0 0 * * *", SCL, "shift", SCL_SP_W, *SCL_SP_MIDNIGHT, at=SCL_SP),
    case(
        "santiago-spring-midnight-skip", "0 0 * * *", SCL, "skip", SCL_SP_W,
        "2026-09-05 04:00", "2026-09-07 03:00", at=SCL_SP,
    ),
    case("santiago-spring-midnight-first", "0 0 * * *", SCL, "first", SCL_SP_W, *SCL_SP_MIDNIGHT, at=SCL_SP),
    case("santiago-spring-midnight-last", "0 0 * * *", SCL, "last", SCL_SP_W, *SCL_SP_MIDNIGHT, at=SCL_SP),
    case("santiago-spring-midnight-both", "0 0 * * *", SCL, "both", SCL_SP_W, *SCL_SP_MIDNIGHT, at=SCL_SP),
    case("santiago-spring-@daily", "@daily", SCL, "", SCL_SP_W, *SCL_SP_MIDNIGHT, at=SCL_SP),
    case(
        "santiago-spring-0030-defaults-shift", "30 0 * * *", SCL, "", SCL_SP_W,
        "2026-09-05 04:30", "2026-09-06 04:00", "2026-09-07 03:30", at=SCL_SP,
    ),
    case(
        "santiago-spring-0100-after-gap", "0 1 * * *", SCL, "", SCL_SP_W,
        "2026-09-05 05:00", "2026-09-06 04:00", "2026-09-07 04:00", at=SCL_SP,
    ),
    case(
        "santiago-spring-2359-before-gap", "59 23 * * *", SCL, "", SCL_SP_W,
        "2026-09-05 03:59", "2026-09-06 03:59", "2026-09-07 02:59", at=SCL_SP,
    ),
    case(
        "santiago-spring-sunday-midnight-shift", "0 0 * * 0", SCL, "", ("2026-08-29 12:00", "2026-09-14 12:00"),
        "2026-08-30 04:00", "2026-09-06 04:00", "2026-09-13 03:00", at=SCL_SP,
    ),
    case(
        "santiago-spring-sunday-midnight-skip", "0 0 * * SUN", SCL, "skip",
        ("2026-08-29 12:00", "2026-09-14 12:00"),
        "2026-08-30 04:00", "2026-09-13 03:00", at=SCL_SP,
    ),
    case(
        "santiago-spring-hourly-defaults-skip", "0 * * * *", SCL, "", ("2026-09-06 02:30", "2026-09-06 06:00"),
        "2026-09-06 03:00", "2026-09-06 04:00", "2026-09-06 05:00", "2026-09-06 06:00", at=SCL_SP,
    ),
    case(
        "santiago-spring-every30-defaults-skip", "*/30 * * * *", SCL, "",
        ("2026-09-06 03:00", "2026-09-06 05:00"),
        "2026-09-06 03:30", "2026-09-06 04:00", "2026-09-06 04:30", "2026-09-06 05:00", at=SCL_SP,
    ),
]

# Pacific/Apia, 2011-12-30 10:00Z: Thursday 12-29 23:59:59 -10 was followed by Saturday 12-31 00:00 +14.
# The whole local day Friday 12-30 is a 24-hour gap; its first instant after the gap is 10:00Z.
APIA_T = "2011-12-30 10:00"
APIA_W = ("2011-12-29 00:00", "2011-12-31 12:00")
APIA_0900 = ("2011-12-29 19:00", "2011-12-30 10:00", "2011-12-30 19:00")
APIA_CASES = [
    case("apia-0900-defaults-shift", "0 9 * * *", APIA, "", APIA_W, *APIA_0900, at=APIA_T),
    case("apia-0900-shift", "0 9 * * *", APIA, "shift", APIA_W, *APIA_0900, at=APIA_T),
    case("apia-0900-skip", "0 9 * * *", APIA, "skip", APIA_W, "2011-12-29 19:00", "2011-12-30 19:00", at=APIA_T),
    case("apia-0900-both", "0 9 * * *", APIA, "both", APIA_W, *APIA_0900, at=APIA_T),
    case(
        "apia-1200-defaults-shift", "0 12 * * *", APIA, "", APIA_W,
        "2011-12-29 22:00", "2011-12-30 10:00", "2011-12-30 22:00", at=APIA_T,
    ),
    case("apia-1200-skip", "0 12 * * *", APIA, "skip", APIA_W, "2011-12-29 22:00", "2011-12-30 22:00", at=APIA_T),
    # 09:00 and 12:00 of the missing day both shift to 10:00Z: one run.
    case(
        "apia-0900+1200-collapse", "0 9,12 * * *", APIA, "", APIA_W,
        "2011-12-29 19:00", "2011-12-29 22:00", "2011-12-30 10:00", "2011-12-30 19:00", "2011-12-30 22:00",
        at=APIA_T,
    ),
    # Midnight of 12-30 shifts to 10:00Z, which is also midnight of 12-31: one run either way.
    case(
        "apia-midnight-defaults-shift", "0 0 * * *", APIA, "", APIA_W,
        "2011-12-29 10:00", "2011-12-30 10:00", "2011-12-31 10:00", at=APIA_T,
    ),
    case(
        "apia-midnight-skip", "0 0 * * *", APIA, "skip", APIA_W,
        "2011-12-29 10:00", "2011-12-30 10:00", "2011-12-31 10:00", at=APIA_T,
    ),
    case(
        "apia-2359-defaults-shift", "59 23 * * *", APIA, "", APIA_W,
        "2011-12-29 09:59", "2011-12-30 09:59", "2011-12-30 10:00", "2011-12-31 09:59", at=APIA_T,
    ),
    case(
        "apia-2359-skip", "59 23 * * *", APIA, "skip", APIA_W,
        "2011-12-29 09:59", "2011-12-30 09:59", "2011-12-31 09:59", at=APIA_T,
    ),
    case(
        "apia-friday-0900-shift", "0 9 * * FRI", APIA, "", ("2011-12-22 00:00", "2012-01-07 00:00"),
        "2011-12-23 19:00", "2011-12-30 10:00", "2012-01-05 19:00", at=APIA_T,
    ),
    case(
        "apia-friday-0900-skip", "0 9 * * 5", APIA, "skip", ("2011-12-22 00:00", "2012-01-07 00:00"),
        "2011-12-23 19:00", "2012-01-05 19:00", at=APIA_T,
    ),
    # Only on December 30th: in 2012 Apia is on +14 (DST), so 09:00 is 19:00Z the day before.
    case(
        "apia-dec30-0900-shift", "0 9 30 12 *", APIA, "", ("2010-12-01 00:00", "2013-01-01 00:00"),
        "2010-12-30 19:00", "2011-12-30 10:00", "2012-12-29 19:00", at=APIA_T,
    ),
    case(
        "apia-dec30-0900-skip", "0 9 30 DEC *", APIA, "skip", ("2010-12-01 00:00", "2013-01-01 00:00"),
        "2010-12-30 19:00", "2012-12-29 19:00", at=APIA_T,
    ),
    # 23:00 -10 on 12-29, then 00:00 01:00 02:00 +14 on 12-31: real-time cadence is unbroken.
    case(
        "apia-hourly-defaults-skip", "0 * * * *", APIA, "", ("2011-12-30 08:30", "2011-12-30 12:00"),
        "2011-12-30 09:00", "2011-12-30 10:00", "2011-12-30 11:00", "2011-12-30 12:00", at=APIA_T,
    ),
    case(
        "apia-hourly-shift", "0 * * * *", APIA, "shift", ("2011-12-30 08:30", "2011-12-30 12:00"),
        "2011-12-30 09:00", "2011-12-30 10:00", "2011-12-30 11:00", "2011-12-30 12:00", at=APIA_T,
    ),
    case(
        "apia-every30-defaults-skip", "*/30 * * * *", APIA, "", ("2011-12-30 09:00", "2011-12-30 11:00"),
        "2011-12-30 09:30", "2011-12-30 10:00", "2011-12-30 10:30", "2011-12-30 11:00", at=APIA_T,
    ),
]

# Asia/Kolkata: +05:30 all year, so flags change nothing and o'clock local times are half past in UTC.
KOL_W = ("2026-03-07 00:00", "2026-03-10 00:00")
KOLKATA = [
    case(
        "kolkata-0230-defaults", "30 2 * * *", KOL, "", KOL_W,
        "2026-03-07 21:00", "2026-03-08 21:00", "2026-03-09 21:00", at=None,
    ),
    case(
        "kolkata-0230-skip+last", "30 2 * * *", KOL, "skip+last", KOL_W,
        "2026-03-07 21:00", "2026-03-08 21:00", "2026-03-09 21:00", at=None,
    ),
    case(
        "kolkata-midnight", "0 0 * * *", KOL, "", KOL_W,
        "2026-03-07 18:30", "2026-03-08 18:30", "2026-03-09 18:30", at=None,
    ),
    case(
        "kolkata-hourly-half-past-utc", "0 * * * *", KOL, "", ("2026-03-08 00:00", "2026-03-08 03:00"),
        "2026-03-08 00:30", "2026-03-08 01:30", "2026-03-08 02:30", at=None,
    ),
    case(
        "kolkata-every15", "*/15 * * * *", KOL, "", ("2026-03-08 00:00", "2026-03-08 01:00"),
        "2026-03-08 00:15", "2026-03-08 00:30", "2026-03-08 00:45", "2026-03-08 01:00", at=None,
    ),
    # Local :00 :20 :40 are :30 :50 :10 in UTC.
    case(
        "kolkata-every20", "*/20 * * * *", KOL, "both", ("2026-03-08 00:00", "2026-03-08 01:00"),
        "2026-03-08 00:10", "2026-03-08 00:30", "2026-03-08 00:50", at=None,
    ),
    case(
        "kolkata-weekdays-0900", "0 9 * * MON-FRI", KOL, "", ("2026-03-06 00:00", "2026-03-10 00:00"),
        "2026-03-06 03:30", "2026-03-09 03:30", at=None,
    ),
]

# fmt: on

CASES = [
    *NY_SPRING,
    *NY_FALL,
    *LONDON_SPRING,
    *LONDON_FALL,
    *LORD_HOWE_FALL,
    *LORD_HOWE_SPRING,
    *CAIRO_SPRING,
    *CAIRO_FALL,
    *SANTIAGO_FALL,
    *SANTIAGO_SPRING,
    *APIA_CASES,
    *KOLKATA,
]


@pytest.mark.parametrize("c", CASES)
def test_between_is_the_expected_list(c: Case) -> None:
    assert list(c.plan().between(c.a, c.b)) == c.want


@pytest.mark.parametrize("c", CASES)
def test_between_ms_agrees(c: Case) -> None:
    got = list(c.plan().between_ms(to_ms(c.a), to_ms(c.b)))
    assert got == [to_ms(e) for e in c.want]


@pytest.mark.parametrize("c", CASES)
def test_next_after_chains_through_the_window(c: Case) -> None:
    plan = c.plan()
    got = []
    t = c.a
    for _ in c.want:
        nxt = plan.next_after(t)
        assert nxt is not None
        got.append(nxt)
        t = nxt
    assert got == c.want
    after = plan.next_after(c.want[-1])
    assert after is not None
    assert after > c.b
    assert list(islice(plan.iter_after(c.a), len(c.want))) == c.want


@pytest.mark.parametrize("c", CASES)
def test_prev_before_mirrors_next_after(c: Case) -> None:
    plan = c.plan()
    for earlier, later in pairwise(c.want):
        assert plan.prev_before(later) == earlier
    before_first = plan.prev_before(c.want[0])
    assert before_first is not None
    assert before_first <= c.a
    after_last = plan.next_after(c.want[-1])
    assert after_last is not None
    assert plan.prev_before(after_last) == c.want[-1]


def _probes(c: Case) -> set[datetime]:
    pts = {c.a, c.b}
    for e in c.want:
        pts |= {e - timedelta(seconds=1), e - MS, e, e + MS, e + timedelta(seconds=1)}
    for p, q in pairwise(c.want):
        pts.add(p + (q - p) / 2)
    if c.at is not None:
        t = z(c.at)
        pts |= {t - timedelta(minutes=30), t - MS, t, t + MS, t + timedelta(minutes=30)}
    return {p for p in pts if c.a <= p <= c.b}


@pytest.mark.parametrize("c", CASES)
def test_queries_from_any_instant_in_the_window(c: Case) -> None:
    """next/prev from instants around every expected time, between them, and at the transition."""
    plan = c.plan()
    for t in sorted(_probes(c)):
        later = [e for e in c.want if e > t]
        if later:
            assert plan.next_after(t) == later[0], f"next_after({t})"
            assert plan.next_after_ms(to_ms(t)) == to_ms(later[0])
        earlier = [e for e in c.want if e < t]
        if earlier:
            assert plan.prev_before(t) == earlier[-1], f"prev_before({t})"
            assert plan.prev_before_ms(to_ms(t)) == to_ms(earlier[-1])


def test_every_transition_zone_is_covered() -> None:
    """The table exercises a gap and an overlap in each DST zone the issue names."""
    kinds: dict[str, set[str]] = {}
    for p in CASES:
        c = p.values[0]
        assert isinstance(c, Case)
        if c.at is None:
            continue
        u = int(z(c.at).timestamp())
        zi = ZoneInfo(c.tz)
        before = datetime.fromtimestamp(u - 1, zi).utcoffset()
        after = datetime.fromtimestamp(u, zi).utcoffset()
        assert before is not None
        assert after is not None
        assert before != after, c  # a real transition
        kinds.setdefault(c.tz, set()).add("gap" if after > before else "overlap")
    for tz in (NY, LON, LHI, CAI, SCL):
        assert kinds[tz] == {"gap", "overlap"}, tz
    assert kinds[APIA] == {"gap"}


# -- brute-force sweep ----------------------------------------------------------------------------------
#
# A reference model written from the definition alone: enumerate the local wall times a simple spec
# names, classify each with zoneinfo (PEP 495 folds), and apply the policy. Then compare with the engine
# (between() and a prev_before() walk) for every offset change of 16 zones over a few years, with every
# flag combination, daily specs placed at the gap's or overlap's edges, sub-daily specs, and 6-field
# (seconds first) specs.

SWEEP = [
    (NY, 2025, 2028),
    (LON, 2025, 2028),
    (LHI, 2025, 2028),
    (CAI, 2025, 2028),
    (SCL, 2025, 2028),
    (APIA, 2010, 2013),
    ("Pacific/Chatham", 2025, 2027),  # transitions at 02:45 / 03:45 local, +1245 / +1345
    ("America/St_Johns", 2025, 2027),  # -0330
    ("America/Nuuk", 2024, 2027),  # 2023: standard offset change; rules at negative local times
    ("Europe/Dublin", 2025, 2027),  # negative DST in the TZif data
    ("Antarctica/Troll", 2025, 2027),  # two-hour DST
    ("America/Havana", 2025, 2027),  # midnight transitions
    ("Africa/Casablanca", 2025, 2027),  # Ramadan: offset falls back, then springs forward weeks later
    ("Pacific/Kiritimati", 1994, 1996),  # 1994-12-31 does not exist (-10 -> +14)
    ("Asia/Tehran", 2021, 2023),  # DST abolished in 2022
    ("America/Mexico_City", 2021, 2023),  # DST abolished in 2022
]


def _tz_changes(name: str, y0: int, y1: int) -> list[tuple[int, int, int]]:
    """(instant, offset before, offset after) of the listed TZif transitions in [y0, y1)."""
    for root in zoneinfo.TZPATH:
        path = os.path.join(root, name)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                trans_idx, trans_utc, utcoff, *_ = load_data(io.BytesIO(f.read()))
            break
    else:  # pragma: no cover - no system tz database
        pytest.skip("no TZif files on this machine")
    lo = datetime(y0, 1, 1, tzinfo=UTC).timestamp()
    hi = datetime(y1, 1, 1, tzinfo=UTC).timestamp()
    out = []
    for i, u in enumerate(trans_utc):
        before = utcoff[trans_idx[i - 1]] if i else None
        after = utcoff[trans_idx[i]]
        if lo <= u < hi and before is not None and before != after:
            out.append((u, before, after))
    return out


def _wall_instants(wall: datetime, zi: ZoneInfo) -> tuple[str, int, int]:
    """('ok', u, u) | ('twice', first, last) | ('gap', transition instant, transition instant)."""
    u0 = int(wall.replace(tzinfo=zi, fold=0).timestamp())
    u1 = int(wall.replace(tzinfo=zi, fold=1).timestamp())
    exists = datetime.fromtimestamp(u0, zi).replace(tzinfo=None) == wall
    if exists and u0 == u1:
        return "ok", u0, u0
    if exists:
        return "twice", min(u0, u1), max(u0, u1)
    # In a gap, fold=0 uses the offset before the change and lands after it, fold=1 the reverse: the
    # change lies in (u1, u0]. Find its exact second.
    lo, hi = min(u0, u1), max(u0, u1)
    off_lo = datetime.fromtimestamp(lo, zi).utcoffset()
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if datetime.fromtimestamp(mid, zi).utcoffset() == off_lo:
            lo = mid
        else:
            hi = mid
    return "gap", hi, hi


def _reference(
    classified: Iterable[tuple[str, int, int]], gap: DstGap, overlap: DstOverlap, a: int, b: int
) -> list[int]:
    out: set[int] = set()
    for kind, first, last in classified:
        if kind == "ok":
            out.add(first)
        elif kind == "gap":
            if gap is DstGap.SHIFT:
                out.add(first)
        else:
            if overlap in (DstOverlap.FIRST, DstOverlap.BOTH):
                out.add(first)
            if overlap in (DstOverlap.LAST, DstOverlap.BOTH):
                out.add(last)
    return sorted(u for u in out if a < u <= b)


SweepSpec = tuple[str, list[int], list[int], list[int], bool]  # spec, seconds, minutes, hours, fixed-time


def _sweep_specs(u: int, before: int, after: int) -> list[SweepSpec]:
    """Specs around the change at instant u, with the wall times they name."""
    lo_w, hi_w = sorted((u + before, u + after))  # wall seconds bounding the gap or overlap
    marks = {lo_w - 60, lo_w, (lo_w + hi_w) // 2 // 60 * 60, hi_w - 60, hi_w}
    specs: list[SweepSpec] = []
    for w in sorted(marks):
        h, m = w % 86400 // 3600, w % 3600 // 60
        specs.append((f"{m} {h} * * *", [0], [m], [h], True))
    h, m = lo_w % 86400 // 3600, lo_w % 3600 // 60
    every = list(range(24))
    specs += [
        # Seconds first: three runs a minute inside the gap collapse into one instant under shift.
        (f"*/20 {m} {h} * * *", [0, 20, 40], [m], [h], True),
        ("30 */30 * * * *", [30], [0, 30], every, False),
        ("0 * * * *", [0], [0], every, False),
        ("*/15 * * * *", [0], [0, 15, 30, 45], every, False),
        ("*/20 * * * *", [0], [0, 20, 40], every, False),
        ("45 * * * *", [0], [45], every, False),
    ]
    return specs


POLICIES: list[tuple[DstGap | None, DstOverlap | None]] = [
    (None, None),
    *[(g, o) for g in DstGap for o in DstOverlap],
    (DstGap.SKIP, None),
    (None, DstOverlap.LAST),
]


@pytest.mark.parametrize(("tz", "y0", "y1"), SWEEP, ids=[s[0] for s in SWEEP])
def test_sweep_every_transition_against_reference(tz: str, y0: int, y1: int) -> None:
    zi = ZoneInfo(tz)
    changes = _tz_changes(tz, y0, y1)
    assert changes, f"no transitions for {tz} in {y0}-{y1}"
    failures: list[str] = []
    checked = 0
    for u, before, after in changes:
        a, b = u - 2 * 86400, u + 2 * 86400
        first_day = datetime.fromtimestamp(a, zi).date() - timedelta(days=1)
        last_day = datetime.fromtimestamp(b, zi).date() + timedelta(days=1)
        days = [first_day + timedelta(days=i) for i in range((last_day - first_day).days + 1)]
        for spec, seconds, minutes, hours, fixed in _sweep_specs(u, before, after):
            walls = [
                datetime(d.year, d.month, d.day, h, m, sec)
                for d in days
                for h in hours
                for m in minutes
                for sec in seconds
            ]
            classified = [_wall_instants(w, zi) for w in walls]
            for gap, overlap in POLICIES:
                eff_gap = gap or (DstGap.SHIFT if fixed else DstGap.SKIP)
                eff_overlap = overlap or (DstOverlap.FIRST if fixed else DstOverlap.BOTH)
                want = _reference(classified, eff_gap, eff_overlap, a, b)
                plan = parse_spec(spec, tz=tz, dst_gap=gap, dst_overlap=overlap)
                got = [ms // 1000 for ms in plan.between_ms(a * 1000, b * 1000)]
                checked += 1
                if got != want:
                    failures.append(_describe(tz, spec, gap, overlap, u, got, want))
                    continue
                # prev_before walks the same list backwards.
                back = []
                t = b * 1000 + 1
                while (p := plan.prev_before_ms(t)) is not None and p > a * 1000:
                    back.append(p // 1000)
                    t = p
                if back[::-1] != want:
                    failures.append(_describe(tz, spec, gap, overlap, u, back[::-1], want, "prev_before"))
    assert checked > 0
    assert not failures, f"{len(failures)} of {checked} disagree:\n" + "\n".join(failures[:20])


def _describe(
    tz: str,
    spec: str,
    gap: DstGap | None,
    overlap: DstOverlap | None,
    u: int,
    got: list[int],
    want: list[int],
    how: str = "between",
) -> str:
    def fmt(xs: list[int]) -> str:
        return ", ".join(datetime.fromtimestamp(x, UTC).strftime("%m-%d %H:%M") for x in xs)

    change = datetime.fromtimestamp(u, UTC).isoformat()
    return (
        f"{tz} {spec!r} gap={gap} overlap={overlap} around {change} ({how}):\n"
        f"    got  {fmt(sorted(set(got) - set(want)))} extra / {fmt(sorted(set(want) - set(got)))} missing"
    )


def test_reference_model_matches_hand_table() -> None:
    """The sweep's reference model reproduces a few hand-derived rows (it is checked too)."""
    zi = ZoneInfo(NY)
    a, b = int(z("2026-03-07 00:00").timestamp()), int(z("2026-03-10 00:00").timestamp())
    days = [date(2026, 3, d) for d in (6, 7, 8, 9, 10)]
    walls = [datetime(d.year, d.month, d.day, 2, 30) for d in days]
    got = _reference([_wall_instants(w, zi) for w in walls], DstGap.SHIFT, DstOverlap.FIRST, a, b)
    assert got == [int(z(e).timestamp()) for e in NY_SP_0230]
    zi = ZoneInfo(APIA)
    walls = [datetime(2011, 12, d, 9) for d in (28, 29, 30, 31)]
    a, b = int(z(APIA_W[0]).timestamp()), int(z(APIA_W[1]).timestamp())
    assert _reference([_wall_instants(w, zi) for w in walls], DstGap.SHIFT, DstOverlap.FIRST, a, b) == [
        int(z(e).timestamp()) for e in APIA_0900
    ]
