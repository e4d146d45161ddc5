"""Parse the text of one cron field into sets of values.

Grammar per comma-separated item (all fields): `*`, `N`, `N-M`, any of those followed by `/STEP`
(`N/STEP` means N-max/STEP, as in Vixie cron), Jenkins `H`, `H(N-M)`, `H/STEP`, `H(N-M)/STEP`.
Day of month adds `?`, `L` (last day), `NW` (weekday nearest day N, never leaving the month), `LW`
(last weekday). Day of week adds `?`, `NL` (last weekday N of the month) and `N#K` (K-th weekday N);
0 and 7 are Sunday; names JAN-DEC and SUN-SAT work anywhere a number does.

Errors name the field and the reason: `minute: 61 is outside 0-59`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from scheduler.errors import InvalidArgument
from scheduler.timeplan.hashing import field_hash

MONTH_NAMES = {n: i + 1 for i, n in enumerate("JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split())}
DOW_NAMES = {n: i for i, n in enumerate("SUN MON TUE WED THU FRI SAT".split())}


@dataclass(frozen=True)
class FieldDef:
    name: str
    lo: int
    hi: int
    names: dict[str, int]
    # Range that `*` and `H` cover (day of week accepts 7 as Sunday but `*` means 0-6).
    star_lo: int
    star_hi: int


SECOND = FieldDef("second", 0, 59, {}, 0, 59)
MINUTE = FieldDef("minute", 0, 59, {}, 0, 59)
HOUR = FieldDef("hour", 0, 23, {}, 0, 23)
# Jenkins limits hashed days of month to 1-28 so that H fires every month.
DOM = FieldDef("day_of_month", 1, 31, {}, 1, 31)
MONTH = FieldDef("month", 1, 12, MONTH_NAMES, 1, 12)
DOW = FieldDef("day_of_week", 0, 7, DOW_NAMES, 0, 6)

_ITEM = re.compile(
    r"""^(?:
        (?P<star>[*?])
      | (?P<hash>H)(?:\((?P<hlo>\w+)-(?P<hhi>\w+)\))?
      | (?P<lo>\w+)(?:-(?P<hi>\w+))?
    )(?:/(?P<step>\d+))?$""",
    re.X,
)


@dataclass(frozen=True)
class DomSpec:
    days: frozenset[int]
    last: bool  # L
    nearest_weekday: frozenset[int]  # NW
    last_weekday: bool  # LW
    star: bool  # text starts with * or ?: Vixie's "unrestricted" flag for the OR/AND rule


@dataclass(frozen=True)
class DowSpec:
    days: frozenset[int]  # 0 = Sunday
    last_of: frozenset[int]  # NL: last weekday N of the month
    nth: frozenset[tuple[int, int]]  # N#K: (weekday, K)
    star: bool


def _value(text: str, f: FieldDef) -> int:
    up = text.upper()
    if up in f.names:
        return f.names[up]
    if not text.isdigit():
        raise InvalidArgument(f.name, f"{text!r} is not a number" + (" or a name" if f.names else ""))
    v = int(text)
    if not f.lo <= v <= f.hi:
        raise InvalidArgument(f.name, f"{v} is outside {f.lo}-{f.hi}")
    return v


def _step(text: str | None, f: FieldDef) -> int:
    if text is None:
        return 1
    step = int(text)
    if step < 1:
        raise InvalidArgument(f.name, f"step {step} must be at least 1")
    return step


def _expand_item(item: str, f: FieldDef, schedule_id: str) -> set[int]:
    m = _ITEM.match(item)
    if not m:
        raise InvalidArgument(f.name, f"cannot parse {item!r}")
    step = _step(m["step"], f)
    if m["star"]:
        if m["star"] == "?" and f not in (DOM, DOW):
            raise InvalidArgument(f.name, "'?' is only allowed in day-of-month and day-of-week")
        return set(range(f.star_lo, f.star_hi + 1, step))
    if m["hash"]:
        lo, hi = f.star_lo, (28 if f is DOM else f.star_hi)
        if m["hlo"] is not None:
            lo, hi = _value(m["hlo"], f), _value(m["hhi"], f)
            if lo > hi:
                raise InvalidArgument(f.name, f"range H({lo}-{hi}) is reversed")
        h = field_hash(schedule_id, f.name)
        if m["step"] is None:
            return {lo + h % (hi - lo + 1)}
        # Jenkins: the hash picks the phase of the step inside the range.
        return set(range(lo + h % min(step, hi - lo + 1), hi + 1, step))
    lo = _value(m["lo"], f)
    if m["hi"] is not None:
        hi = _value(m["hi"], f)
        if lo > hi:
            raise InvalidArgument(f.name, f"range {item} is reversed; split it, e.g. {lo}-{f.hi},{f.lo}-{hi}")
    elif m["step"] is not None:
        hi = f.hi  # N/STEP means N to the end of the range (Vixie)
    else:
        hi = lo
    return set(range(lo, hi + 1, step))


def _split(text: str, f: FieldDef) -> list[str]:
    if not text:
        raise InvalidArgument(f.name, "is empty")
    items = text.split(",")
    if any(not i for i in items):
        raise InvalidArgument(f.name, f"empty list item in {text!r}")
    return items


def parse_simple(text: str, f: FieldDef, schedule_id: str) -> tuple[int, ...]:
    """Seconds, minutes, hours, months: a sorted tuple of values."""
    out: set[int] = set()
    for item in _split(text, f):
        out |= _expand_item(item, f, schedule_id)
    return tuple(sorted(out))


_NW = re.compile(r"^(\d+)W$", re.I)
_NL = re.compile(r"^(\w+?)L$", re.I)
_NTH = re.compile(r"^(\w+)#(\d+)$")


def parse_dom(text: str, schedule_id: str) -> DomSpec:
    days: set[int] = set()
    nearest: set[int] = set()
    last = last_weekday = False
    for item in _split(text, DOM):
        up = item.upper()
        if up == "L":
            last = True
        elif up == "LW":
            last_weekday = True
        elif m := _NW.match(item):
            nearest.add(_value(m[1], DOM))
        else:
            days |= _expand_item(item, DOM, schedule_id)
    return DomSpec(frozenset(days), last, frozenset(nearest), last_weekday, text[0] in "*?")


def parse_dow(text: str, schedule_id: str) -> DowSpec:
    days: set[int] = set()
    last_of: set[int] = set()
    nth: set[tuple[int, int]] = set()
    for item in _split(text, DOW):
        if (m := _NTH.match(item)) is not None:
            k = int(m[2])
            if not 1 <= k <= 5:
                raise InvalidArgument(DOW.name, f"#{k} in {item!r} is outside 1-5")
            nth.add((_value(m[1], DOW) % 7, k))
        elif (m := _NL.match(item)) is not None and item.upper() != "L":
            last_of.add(_value(m[1], DOW) % 7)
        else:
            if item.upper() == "L":
                raise InvalidArgument(DOW.name, "'L' needs a weekday before it, e.g. 5L for the last Friday")
            days |= {d % 7 for d in _expand_item(item, DOW, schedule_id)}
    return DowSpec(frozenset(days), frozenset(last_of), frozenset(nth), text[0] in "*?")
