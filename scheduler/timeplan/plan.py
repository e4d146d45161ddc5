"""Planned instants of a schedule spec: parse once, then ask next / previous / range in UTC.

All instants are integer UTC epoch milliseconds (the unit of planned times and execution ids); the
datetime methods are thin wrappers for callers at the edges. Nothing here reads a clock: `now` and
every reference time are arguments.

DST policy (see docs/time.md): the calendar is expanded in local wall time, then mapped to instants.
A local time in a gap (spring forward) runs at the first instant after the gap under `shift`, or not
at all under `skip`; a local time that happens twice (fall back) runs on its `first`, `last` or `both`
occurrences. Defaults follow cronie: fixed-time specs (neither the minute nor the hour field starts
with `*`) get shift + first; everything else keeps its real-time cadence, i.e. skip + both.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import lru_cache

from scheduler.errors import InvalidArgument
from scheduler.timeplan.cron import CYCLE_YEARS, MACROS, CronExpr, parse_fields
from scheduler.timeplan.hashing import field_hash
from scheduler.timeplan.policy import DstGap, DstOverlap
from scheduler.timeplan.zone import ZoneTimeline, timeline

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
# Planned times live between these instants (inclusive); queries outside answer None.
MIN_MS = int((datetime(1900, 1, 1, tzinfo=UTC) - EPOCH) / _MS)
MAX_MS = int((datetime(9990, 1, 1, tzinfo=UTC) - EPOCH) / _MS)
MAX_SPEC_LEN = 256
_YEAR1_MS = int((datetime(1, 1, 1, tzinfo=UTC) - EPOCH) / _MS)
# A spec whose every wall time falls into DST gaps under `skip` (e.g. `30 2 * 3 0#2` in New York) has a
# calendar match but no instant: searches stop one calendar cycle after the query instead of at 9999.
_HORIZON_S = CYCLE_YEARS * 366 * 86400


def to_ms(dt: datetime, field: str = "time") -> int:
    if dt.tzinfo is None or dt.utcoffset() is None:
        raise InvalidArgument(field, "must carry a time zone (naive datetimes are ambiguous)")
    return (dt - EPOCH) // _MS


def from_ms(ms: int) -> datetime:
    return EPOCH + timedelta(milliseconds=ms)


class Plan:
    """Planned instants of one schedule. Subclasses implement the two *_ms primitives."""

    kind = "abstract"

    def __init__(self, start_ms: int | None = None, end_ms: int | None = None) -> None:
        self.start_ms = MIN_MS if start_ms is None else max(start_ms, MIN_MS)
        self.end_ms = MAX_MS if end_ms is None else min(end_ms, MAX_MS)

    def _next(self, t: int) -> int | None:
        raise NotImplementedError

    def _prev(self, t: int) -> int | None:
        raise NotImplementedError

    def next_after_ms(self, t: int) -> int | None:
        """The first planned instant strictly after t, or None."""
        if t < self.start_ms:
            t = self.start_ms - 1
        r = self._next(t)
        return None if r is None or r > self.end_ms else r

    def prev_before_ms(self, t: int) -> int | None:
        """The last planned instant strictly before t, or None."""
        if t > self.end_ms:
            t = self.end_ms + 1
        r = self._prev(t)
        return None if r is None or r < self.start_ms else r

    def iter_after_ms(self, t: int) -> Iterator[int]:
        nxt = self.next_after_ms(t)
        while nxt is not None:
            yield nxt
            nxt = self.next_after_ms(nxt)

    def between_ms(self, a: int, b: int) -> Iterator[int]:
        """Planned instants in (a, b]."""
        for u in self.iter_after_ms(a):
            if u > b:
                return
            yield u

    def any_between_ms(self, a: int, b: int) -> bool:
        nxt = self.next_after_ms(a)
        return nxt is not None and nxt <= b

    # datetime wrappers for the edges (CLI, API, tests)
    def next_after(self, t: datetime) -> datetime | None:
        r = self.next_after_ms(to_ms(t))
        return None if r is None else from_ms(r)

    def prev_before(self, t: datetime) -> datetime | None:
        r = self.prev_before_ms(to_ms(t))
        return None if r is None else from_ms(r)

    def iter_after(self, t: datetime) -> Iterator[datetime]:
        return (from_ms(u) for u in self.iter_after_ms(to_ms(t)))

    def between(self, a: datetime, b: datetime) -> Iterator[datetime]:
        return (from_ms(u) for u in self.between_ms(to_ms(a, "start"), to_ms(b, "end")))


class CronPlan(Plan):
    kind = "cron"

    def __init__(
        self,
        expr: CronExpr,
        tl: ZoneTimeline,
        gap: DstGap,
        overlap: DstOverlap,
        start_ms: int | None = None,
        end_ms: int | None = None,
    ) -> None:
        super().__init__(start_ms, end_ms)
        self.expr, self.tl, self.gap, self.overlap = expr, tl, gap, overlap

    def _next(self, t: int) -> int | None:
        s = self._next_s(t // 1000)  # planned times are whole seconds: > t ms  <=>  > floor(t/1000) s
        return None if s is None else s * 1000

    def _prev(self, t: int) -> int | None:
        s = self._prev_s(-(-t // 1000))  # < t ms  <=>  < ceil(t/1000) s
        return None if s is None else s * 1000

    def _next_s(self, t: int) -> int | None:
        expr, tl = self.expr, self.tl
        if tl.fixed is not None:
            w = expr.next_wall_after(t + tl.fixed)
            return None if w is None else w - tl.fixed
        first, last, shift = (
            self.overlap is DstOverlap.FIRST,
            self.overlap is DstOverlap.LAST,
            self.gap is DstGap.SHIFT,
        )
        cur = t
        start, end, off, before, after = tl.interval(cur)
        horizon = t + _HORIZON_S
        while True:
            w = expr.next_wall_after(cur + off)
            if w is None or w - off > horizon:
                return None
            if w - off < end:
                if first and before > off and w < start + before:
                    # Walls already lived before the fall-back at `start`: FIRST ran them then.
                    cur = min(start + before - off - 1, end - 1)
                    continue
                if not (last and after < off and w >= end + after):
                    return w - off
                # else: these walls come again after the fall-back at `end`; LAST runs them there.
            elif shift and after > off and w < end + after:
                # w lies in the gap [end+off, end+after) that the spring-forward at `end` skips.
                return end
            cur = end - 1
            start, end, off, before, after = tl.interval(end)

    def _prev_s(self, t: int) -> int | None:
        expr, tl = self.expr, self.tl
        if tl.fixed is not None:
            w = expr.prev_wall_before(t + tl.fixed)
            return None if w is None else w - tl.fixed
        first, last, shift = (
            self.overlap is DstOverlap.FIRST,
            self.overlap is DstOverlap.LAST,
            self.gap is DstGap.SHIFT,
        )
        cur = t
        start, end, off, before, after = tl.interval(cur - 1)
        horizon = t - _HORIZON_S
        while True:
            w = expr.prev_wall_before(cur + off)
            if w is not None and w - off < horizon:
                return None
            if w is not None and w - off >= start:
                if last and after < off and w >= end + after:
                    cur = max(end + after - off, start)  # skip walls that repeat after `end`
                    if cur > start:
                        continue
                elif not (first and before > off and w < start + before):
                    return w - off
            if w is None and start <= -(2**61):
                return None
            if shift and off > before:
                # A gap at `start`: walls [start+before, start+off) shift to the instant `start`.
                w2 = expr.prev_wall_before(start + off)
                if w2 is not None and w2 >= start + before:
                    return start
            if w is None:
                return None
            cur = start
            start, end, off, before, after = tl.interval(start - 1)


class EveryPlan(Plan):
    """`@every <duration> [phase <duration>|H]`: instants phase + k * period in absolute time."""

    kind = "every"

    def __init__(self, period_ms: int, phase_ms: int, start_ms: int | None = None, end_ms: int | None = None):
        super().__init__(start_ms, end_ms)
        self.period_ms, self.phase_ms = period_ms, phase_ms

    def _next(self, t: int) -> int | None:
        p = self.period_ms
        return self.phase_ms + ((t - self.phase_ms) // p + 1) * p

    def _prev(self, t: int) -> int | None:
        p = self.period_ms
        return self.phase_ms + (-(-(t - self.phase_ms) // p) - 1) * p


_DURATION = re.compile(r"(\d+)(ms|s|m|h|d)")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
MIN_EVERY_MS = 1000
MAX_EVERY_MS = 366 * 86_400_000


def check_in_window(ms: int, field: str) -> int:
    """Refuse an instant outside the window plans cover ([MIN_MS, MAX_MS)), naming it: a plan clamps
    to the window, so an instant before it would silently start in 1900 and one after it find nothing."""
    if not MIN_MS <= ms < MAX_MS:
        raise InvalidArgument(field, f"{format_instant(ms)} is outside the planning window "
                                     f"{format_instant(MIN_MS)} .. {format_instant(MAX_MS)}")
    return ms


def format_instant(ms: int) -> str:
    """RFC3339 UTC with milliseconds, for messages (any year from 1 to 9999)."""
    dt = datetime(1, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms - _YEAR1_MS)
    return f"{dt.year:04d}-" + dt.strftime("%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"  # %Y drops zeros on glibc


def format_duration_ms(ms: int) -> str:
    """A duration in the units people read, as parse_duration_ms writes them: `90s` -> `1m30s`, `250ms`,
    `2d3h`. Exact up to three units; longer ones keep their three largest (`2526d9h26m`, not down to the
    millisecond). Negative durations get a leading `-`."""
    if ms < 0:
        return "-" + format_duration_ms(-ms)
    if ms == 0:
        return "0s"
    parts: list[tuple[int, str]] = []
    for unit in ("d", "h", "m", "s", "ms"):
        n, ms = divmod(ms, _UNIT_MS[unit])
        if n or parts:
            parts.append((n, unit))
    return "".join(f"{n}{u}" for n, u in parts[:3] if n)


def parse_duration_ms(text: str, field: str) -> int:
    """Go-style durations: `90s`, `1h30m`, `500ms`, `2d`."""
    pos, total = 0, 0
    for m in _DURATION.finditer(text):
        if m.start() != pos:
            break
        total += int(m[1]) * _UNIT_MS[m[2]]
        pos = m.end()
    if pos != len(text) or not text:
        raise InvalidArgument(field, f"{text!r} is not a duration like 90s, 1h30m or 500ms")
    return total


def _parse_every(rest: str, schedule_id: str) -> tuple[int, int]:
    parts = rest.split()
    if len(parts) not in (1, 3) or (len(parts) == 3 and parts[1] != "phase"):
        raise InvalidArgument("every", "expected '@every <duration> [phase <duration>|H]'")
    period = parse_duration_ms(parts[0], "every")
    if not MIN_EVERY_MS <= period <= MAX_EVERY_MS:
        raise InvalidArgument("every", f"period {parts[0]} is outside 1s-366d")
    phase = 0
    if len(parts) == 3:
        if parts[2] == "H":
            # Hashed phase in whole seconds, so planned times stay on second boundaries.
            phase = field_hash(schedule_id, "every") % (period // 1000) * 1000
        else:
            phase = parse_duration_ms(parts[2], "phase")
            if phase >= period:
                raise InvalidArgument("phase", f"{parts[2]} must be shorter than the period {parts[0]}")
    return period, phase


@lru_cache(maxsize=8192)
def compile_cron(text: str, schedule_id: str = "") -> CronExpr:
    """Parsed + compiled expression, cached per (text, schedule id); the id only matters for `H`."""
    return CronExpr(parse_fields(text, schedule_id))


def parse_spec(
    spec: str,
    *,
    schedule_id: str = "",
    tz: str = "UTC",
    dst_gap: DstGap | None = None,
    dst_overlap: DstOverlap | None = None,
    start_ms: int | None = None,
    end_ms: int | None = None,
) -> Plan:
    """Validate and compile a spec. Raises InvalidArgument naming the field (`spec.minute`, ...)."""
    text = " ".join(spec.split())
    if not text:
        raise InvalidArgument("spec", "is empty")
    if len(text) > MAX_SPEC_LEN:
        raise InvalidArgument("spec", f"is longer than {MAX_SPEC_LEN} characters")
    if start_ms is not None and end_ms is not None and start_ms > end_ms:
        raise InvalidArgument("end_at", "is before start_at")
    try:
        if text.lower().startswith("@every"):
            period, phase = _parse_every(text[6:], schedule_id)
            return EveryPlan(period, phase, start_ms, end_ms)
        if text.startswith("@"):
            macro = MACROS.get(text.lower())
            if macro is None:
                known = ", ".join([*MACROS, "@every <duration>"])
                raise InvalidArgument("", f"unknown macro {text!r}; known: {known}")
            text = macro
        key_id = schedule_id if "H" in text else ""
        expr = compile_cron(text, key_id)
    except InvalidArgument as e:
        raise e.nested("spec") from None
    fixed = expr.fields.fixed_time
    gap = dst_gap or (DstGap.SHIFT if fixed else DstGap.SKIP)
    overlap = dst_overlap or (DstOverlap.FIRST if fixed else DstOverlap.BOTH)
    return CronPlan(expr, timeline(tz), gap, overlap, start_ms, end_ms)
