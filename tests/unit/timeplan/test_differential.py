"""Differential test: our cron engine against croniter 7 for the syntax both define.

10,800 seeded random cases (same cases on every run and machine), half 5-field and half 6-field with
seconds first (croniter's `second_at_beginning=True`), each started from a random instant between 2000
and 2035 in UTC or in a zone whose UTC offset is constant from 1995 to 2100 (checked below against the
TZif data), so DST policy plays no part. Per case: the next three instants after the start and the two
before it. Fields use numbers, names (JAN, MON-FRI), `*`, `?`, ranges, steps, lists, `L` in day of month,
`NW`, `N#K` and `NL` (last weekday N; croniter spells it `LN`, so it is translated).

Where croniter and we differ by definition, the generator stays out (or translates):

* Day-of-month / day-of-week combination. croniter (default `day_or=True`) ORs the two fields whenever
  both *expand* to a restriction, so `*/2` in day of month with `MON` means "odd days or Mondays". We
  follow Vixie cron / cronie: when either field's text starts with `*` (or `?`) both must match, so it
  means "odd days that are Mondays". croniter reproduces Vixie exactly with `implement_cron_bug=True`,
  which every case passes; the generator then covers both rules freely.
* `N#K` and `NL` with a restricted day of month whose text does not start with `*`: croniter keeps the
  nth-weekday constraint on both sides of its OR (the result is the nth weekdays only); Vixie ORs. Not
  generated: with `#`/`NL` the day of month is `*`, `?` or `*`-prefixed (AND in both).
* `NW`: croniter clamps `31W` to the month's last day in short months, we (Quartz) skip the month;
  croniter also intersects `W` with a restricted day of week. Generated only as a single `NW` with N in
  1-28 and day of week `*`/`?`. `LW` and `WN` (croniter's other spelling) are not generated.
* Written equal ranges `N-N`: croniter reads them as the whole field ("Jan-Jan" is every month, `5-5`
  in minutes is every minute); we read `{N}`. Not generated.
* Reversed (wrap-around) ranges such as `FRI-MON` or `NOV-FEB`: croniter wraps; we reject them with a
  message that says how to split them. Not generated (day-of-week ranges ending at 7 = Sunday, like
  `5-7`, are not reversed in either and are generated).
* `N/S` in day of week: croniter ends it at 6 (Saturday), we at the field maximum 7 (Sunday), as Vixie's
  `N-7/S` would: `1/2` is Mon/Wed/Fri there and Mon/Wed/Fri/Sun here. Not generated (`*/S` and `A-B/S`
  are, and agree).
* `H` (Jenkins hash) and `R`: croniter hashes differently (and `R` is random). Not generated.
* `L` alone in day of week (croniter accepts it, we ask for `5L`), mixing `#` with plain weekdays in one
  list (croniter rejects it), 7-field specs with a year (we have none), `@every` (croniter has none).
* Search horizon: croniter gives up after 50 years, we after a 400-year calendar cycle. Specs that match
  nothing at all are rejected by us at parse time; for those croniter must fail to find a date too.
* DST: by construction no zone here has a transition in range; DST is covered by test_dst_tables.py.
"""

from __future__ import annotations

import io
import os
import random
import zoneinfo
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo
from zoneinfo._common import load_data

import pytest
from croniter import CroniterBadDateError, croniter

from scheduler.errors import InvalidArgument
from scheduler.timeplan import Plan, parse_spec

SEED = 20260508
N_CASES = 10_800
CHUNKS = 12
NEXT_COUNT = 3
PREV_COUNT = 2

# Zones whose offset never changes in [1995, 2100] (test_zones_have_no_transitions_in_range).
ZONES = [
    "UTC",
    "Asia/Kolkata",
    "Asia/Tokyo",
    "Africa/Nairobi",
    "America/Bogota",
    "Etc/GMT+5",
    "Etc/GMT-14",
    "Asia/Kathmandu",
    "Asia/Dubai",
    "Pacific/Marquesas",
]
START_LO = datetime(2000, 1, 1, tzinfo=UTC)
START_HI = datetime(2035, 1, 1, tzinfo=UTC)

MONTHS = "JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split()
DAYS = "SUN MON TUE WED THU FRI SAT".split()


@dataclass(frozen=True)
class Field:
    lo: int
    hi: int
    names: list[str] | None = None  # names[i] is value lo + i
    allow_start_step: bool = True  # `N/S`

    def value(self, rng: random.Random, v: int) -> str:
        if self.names and v - self.lo < len(self.names) and rng.random() < 0.3:
            name = self.names[v - self.lo]
            return name if rng.random() < 0.8 else name.lower()
        return str(v)


SECOND = Field(0, 59)
MINUTE = Field(0, 59)
HOUR = Field(0, 23)
DOM = Field(1, 31)
MONTH = Field(1, 12, MONTHS)
DOW = Field(0, 7, DAYS, allow_start_step=False)


def _range(rng: random.Random, f: Field) -> tuple[int, int]:
    a = rng.randint(f.lo, f.hi - 1)
    b = rng.randint(a + 1, f.hi)  # never equal, never reversed
    return a, b


def _item(rng: random.Random, f: Field) -> str:
    k = rng.random()
    if k < 0.40:
        return f.value(rng, rng.randint(f.lo, f.hi))
    if k < 0.65:
        a, b = _range(rng, f)
        return f"{f.value(rng, a)}-{f.value(rng, b)}"
    if k < 0.85:
        a, b = _range(rng, f)
        return f"{f.value(rng, a)}-{f.value(rng, b)}/{rng.randint(1, b - a + 2)}"
    if f.allow_start_step:
        return f"{f.value(rng, rng.randint(f.lo, f.hi))}/{rng.randint(1, f.hi - f.lo)}"
    return f.value(rng, rng.randint(f.lo, f.hi))


def simple(rng: random.Random, f: Field, star: float = 0.25) -> str:
    k = rng.random()
    if k < star:
        return "*"
    if k < star + 0.15:
        return f"*/{rng.randint(1, f.hi - f.lo)}"
    if k < star + 0.35:
        return ",".join(_item(rng, f) for _ in range(rng.randint(2, 4)))
    return _item(rng, f)


def day_fields(rng: random.Random) -> tuple[str, str]:
    """(day of month, day of week) in OUR syntax."""
    k = rng.random()
    if k < 0.08:  # N#K / NL: day of month unrestricted or `*`-prefixed (AND in both engines)
        items = []
        for _ in range(rng.randint(1, 2)):
            wd = DOW.value(rng, rng.randint(0, 7)) if rng.random() < 0.5 else str(rng.randint(0, 7))
            items.append(f"{wd}#{rng.randint(1, 5)}" if rng.random() < 0.6 else f"{rng.randint(0, 7)}L")
        dom = rng.choice(["*", "?", "*", f"*/{rng.randint(2, 5)}"])
        return dom, ",".join(items)
    if k < 0.13:  # NW
        return f"{rng.randint(1, 28)}W", rng.choice(["*", "?"])
    if k < 0.20:  # L, alone or in a list
        dom = "L" if rng.random() < 0.6 else f"{rng.randint(1, 28)},L"
        return dom, rng.choice(["*", "?", simple(rng, DOW, star=0.0)])
    dom = simple(rng, DOM, star=0.4)
    if rng.random() < 0.05:
        dom = "?"
    dow = simple(rng, DOW, star=0.45)
    if rng.random() < 0.05 and dom != "?":
        dow = "?"
    return dom, dow


def gen_spec(rng: random.Random, six: bool) -> str:
    dom, dow = day_fields(rng)
    fields = [
        simple(rng, MINUTE, star=0.15),
        simple(rng, HOUR, star=0.3),
        dom,
        simple(rng, MONTH, star=0.6),
        dow,
    ]
    if six:
        fields.insert(0, simple(rng, SECOND, star=0.2))
    return " ".join(fields)


def to_croniter(spec: str) -> str:
    """Our `5L` (last Friday) is croniter's `L5`; everything else generated is spelled the same."""
    parts = spec.split()
    items = []
    for item in parts[-1].split(","):
        if item.endswith("L") and item[:-1].isdigit():
            item = "L" + item[:-1]
        items.append(item)
    parts[-1] = ",".join(items)
    return " ".join(parts)


@dataclass(frozen=True)
class DiffCase:
    index: int
    spec: str
    six: bool
    tz: str
    start: datetime


def _zone(name: str) -> tzinfo:
    return UTC if name == "UTC" else ZoneInfo(name)


def gen_cases() -> list[DiffCase]:
    rng = random.Random(SEED)
    span_ms = int((START_HI - START_LO) / timedelta(milliseconds=1))
    cases = []
    for i in range(N_CASES):
        six = i % 2 == 1
        spec = gen_spec(rng, six)
        tz = rng.choice(ZONES)
        offset = timedelta(milliseconds=rng.randrange(span_ms))
        if rng.random() < 0.5:  # whole minutes and seconds are where off-by-one errors live
            offset -= timedelta(microseconds=offset.microseconds)
            if rng.random() < 0.5:
                offset -= timedelta(seconds=offset.seconds % 60)
        start = (START_LO + offset).astimezone(_zone(tz))
        cases.append(DiffCase(i, spec, six, tz, start))
    return cases


CASES = gen_cases()


def _as_utc(dt: datetime) -> datetime:
    return dt.astimezone(UTC)


def _run_case(c: DiffCase) -> str | None:
    """None when both engines agree, else a description of the disagreement."""
    cspec = to_croniter(c.spec)
    try:
        plan: Plan | None = parse_spec(c.spec, schedule_id="diff", tz=c.tz)
    except InvalidArgument as e:
        plan, ours_error = None, str(e)
    if plan is None:
        # We reject only specs that match no day at all: croniter must find nothing either.
        try:
            croniter(cspec, c.start, ret_type=datetime, implement_cron_bug=True, second_at_beginning=c.six).get_next()
        except CroniterBadDateError:
            return None
        return f"we reject ({ours_error}) but croniter finds a date"
    it = croniter(cspec, c.start, ret_type=datetime, implement_cron_bug=True, second_at_beginning=c.six)
    try:
        theirs = [_as_utc(it.get_next()) for _ in range(NEXT_COUNT)]
    except CroniterBadDateError:
        theirs = None
    if theirs is not None:
        ours = []
        t = c.start
        for _ in range(NEXT_COUNT):
            nxt = plan.next_after(t)
            assert nxt is not None
            ours.append(nxt)
            t = nxt
        if ours != theirs:
            return f"next: ours {_fmt(ours)} croniter {_fmt(theirs)}"
    try:
        theirs = [_as_utc(it.get_prev(start_time=c.start))]
        theirs += [_as_utc(it.get_prev()) for _ in range(PREV_COUNT - 1)]
    except CroniterBadDateError:
        return None
    ours = []
    t = c.start
    for _ in range(PREV_COUNT):
        prv = plan.prev_before(t)
        assert prv is not None
        ours.append(prv)
        t = prv
    if ours != theirs:
        return f"prev: ours {_fmt(ours)} croniter {_fmt(theirs)}"
    return None


def _fmt(xs: list[datetime]) -> str:
    return "[" + ", ".join(x.strftime("%Y-%m-%d %H:%M:%S") for x in xs) + "]"


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_agrees_with_croniter(chunk: int) -> None:
    failures = []
    for c in CASES[chunk::CHUNKS]:
        why = _run_case(c)
        if why is not None:
            failures.append(f"#{c.index} {c.spec!r} tz={c.tz} start={c.start.isoformat()}: {why}")
    assert not failures, f"{len(failures)} disagreements:\n" + "\n".join(failures[:25])


def test_generator_covers_the_syntax() -> None:
    """The seeded cases really exercise every construct the docstring lists, in enough numbers."""
    specs = [c.spec for c in CASES]
    assert len(specs) >= 10_000
    assert len(set(specs)) > 0.95 * len(specs)

    def count(pred: object) -> int:
        assert callable(pred)
        return sum(1 for s in specs if pred(s.split()))

    assert count(lambda p: len(p) == 6) >= 5000
    assert count(lambda p: "#" in p[-1]) > 300
    assert count(lambda p: any(i.endswith("L") for i in p[-1].split(","))) > 200
    assert count(lambda p: p[-3] == "L" or p[-3].endswith(",L")) > 300
    assert count(lambda p: p[-3].endswith("W")) > 300
    assert count(lambda p: any(n in p[-2].upper() for n in MONTHS)) > 300
    assert count(lambda p: any(n in p[-1].upper() for n in DAYS)) > 300
    assert count(lambda p: "?" in (p[-3], p[-1])) > 300
    # Both day-combination rules: OR (both restricted, neither starts with * or ?) and AND.
    assert count(lambda p: p[-3][0] not in "*?" and p[-1][0] not in "*?") > 1000
    assert count(lambda p: p[-3].startswith("*/") and p[-1][0] not in "*?") > 300
    assert count(lambda p: "/" in p[-5]) > 2000
    assert {c.tz for c in CASES} == set(ZONES)


def test_translation_to_croniter_syntax() -> None:
    assert to_croniter("0 12 * * 5L") == "0 12 * * L5"
    assert to_croniter("0 12 * * 1#2,5L") == "0 12 * * 1#2,L5"
    assert to_croniter("0 0 12 L * *") == "0 0 12 L * *"


@pytest.mark.parametrize("name", [z for z in ZONES if z != "UTC"])
def test_zones_have_no_transitions_in_range(name: str) -> None:
    """The zones above keep one UTC offset from 1995 to 2100, so DST cannot enter the comparison."""
    for root in zoneinfo.TZPATH:
        path = os.path.join(root, name)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                trans_idx, trans_utc, utcoff, _, _, tz_str = load_data(io.BytesIO(f.read()))
            break
    else:  # pragma: no cover - no system tz database
        pytest.skip("no TZif files on this machine")
    lo = datetime(1995, 1, 1, tzinfo=UTC).timestamp()
    offsets = {utcoff[i] for i, u in zip(trans_idx, trans_utc, strict=True) if u >= lo}
    zi = ZoneInfo(name)
    now_off = datetime(1995, 1, 1, tzinfo=UTC).astimezone(zi).utcoffset()
    assert now_off is not None
    assert offsets <= {int(now_off.total_seconds())}
    assert b"," not in (tz_str or b"")  # the footer has no DST rule
    assert datetime(2100, 1, 1, tzinfo=UTC).astimezone(zi).utcoffset() == now_off


@pytest.mark.parametrize(
    ("spec", "start", "ours", "theirs"),
    [
        # The documented day-rule difference, pinned: `*/2` + MON is AND for us (Vixie), OR in croniter's
        # default mode. 2026-05-01 is a Friday; the odd-day Mondays of May 2026 are the 11th and 25th.
        ("0 0 */2 * MON", "2026-05-01 12:00", "2026-05-11 00:00", "2026-05-03 00:00"),
        # `N-N`: us minute 5, croniter every minute.
        ("5-5 * * * *", "2026-05-01 12:00", "2026-05-01 12:05", "2026-05-01 12:01"),
        # `1/2` in day of week: us Mon/Wed/Fri/Sun, croniter Mon/Wed/Fri. 2026-05-02 is a Saturday.
        ("0 0 * * 1/2", "2026-05-02 12:00", "2026-05-03 00:00", "2026-05-04 00:00"),
    ],
)
def test_documented_differences(spec: str, start: str, ours: str, theirs: str) -> None:
    t = datetime.fromisoformat(start).replace(tzinfo=UTC)
    plan = parse_spec(spec)
    assert plan.next_after(t) == datetime.fromisoformat(ours).replace(tzinfo=UTC)
    got = croniter(spec, t, ret_type=datetime).get_next()
    assert got == datetime.fromisoformat(theirs).replace(tzinfo=UTC)


@pytest.mark.parametrize(
    ("spec", "six"),
    [("0 0 30 2 *", False), ("0 0 31 4,6,9,11 *", False), ("0 0 0 30,31 FEB *", True), ("0 0 31 APR-JUN/2 *", False)],
)
def test_specs_that_never_match(spec: str, six: bool) -> None:
    """We reject at parse time what croniter searches for in vain."""
    with pytest.raises(InvalidArgument, match="matches no day"):
        parse_spec(spec)
    it = croniter(spec, datetime(2026, 1, 1, tzinfo=UTC), second_at_beginning=six)
    with pytest.raises(CroniterBadDateError):
        it.get_next()
