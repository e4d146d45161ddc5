"""A compiled cron expression, evaluated on naive wall-clock seconds.

"Wall seconds" count seconds since 1970-01-01 00:00 of the *local* calendar, with no time zone: the
zone layer (zone.py, plan.py) maps them to and from real instants. Keeping the calendar search free of
zones makes it a handful of integer operations and bisects per query (the planner calls it once per
execution, so it must cost microseconds), and keeps DST decisions in one place.

Day matching follows Vixie cron: when both day fields are restricted, a day matches if EITHER does;
when either field's text starts with `*` or `?`, both must match (so `*/2` in day-of-month combined with
a day of week means "odd days that are also that weekday", exactly as cronie does).
"""

from __future__ import annotations

import calendar
import re
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from datetime import date

from scheduler.errors import InvalidArgument
from scheduler.timeplan.fields import (
    HOUR,
    MINUTE,
    MONTH,
    SECOND,
    DomSpec,
    DowSpec,
    parse_dom,
    parse_dow,
    parse_simple,
)

UNIX_ORDINAL = date(1970, 1, 1).toordinal()
# The Gregorian calendar (weekdays included) repeats every 400 years, so a spec that matches no day in
# 400 consecutive years never matches: searches stop there instead of running forever.
CYCLE_YEARS = 400
MIN_YEAR, MAX_YEAR = 1, 9999
# Above this many times of day, a flat sorted list costs more memory than the nested bisects save.
_FLAT_TOD_LIMIT = 4096

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


@dataclass(frozen=True)
class CronFields:
    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    dom: DomSpec
    months: tuple[int, ...]
    dow: DowSpec
    # cronie's "fixed-time job": neither the minute nor the hour field starts with `*` (DST defaults).
    fixed_time: bool


_YEARISH = re.compile(r"\d{4}(?:[-,]\d{4})*(?:/\d+)?")


def parse_fields(text: str, schedule_id: str = "") -> CronFields:
    parts = text.split()
    if len(parts) in (6, 7) and _YEARISH.fullmatch(parts[-1]):
        # Quartz-style `... * 2027`: a 6-field spec is read seconds first, so the year would land in
        # day_of_week and fail there with a confusing range error.
        raise InvalidArgument(
            "", f"a year field ({parts[-1]!r}) is not supported: 6 fields are read as second minute hour "
                "day-of-month month day-of-week; bound the schedule with start_at/end_at instead")
    if len(parts) == 5:
        parts.insert(0, "0")
    elif len(parts) != 6:
        raise InvalidArgument(
            "",
            f"expected 5 fields (minute hour day-of-month month day-of-week) or 6 with seconds first, "
            f"got {len(parts)}",
        )
    sec, minute, hour, dom, month, dow = parts
    return CronFields(
        seconds=parse_simple(sec, SECOND, schedule_id),
        minutes=parse_simple(minute, MINUTE, schedule_id),
        hours=parse_simple(hour, HOUR, schedule_id),
        dom=parse_dom(dom, schedule_id),
        months=parse_simple(month, MONTH, schedule_id),
        dow=parse_dow(dow, schedule_id),
        fixed_time=not minute.startswith("*") and not hour.startswith("*"),
    )


def _nearest_weekday(day: int, ndays: int, first_wd: int) -> int | None:
    """Quartz `NW`: the Monday-Friday day nearest to `day`, without leaving the month."""
    if day > ndays:
        return None
    wd = (first_wd + day - 1) % 7  # 0 = Sunday
    if wd == 6:  # Saturday -> Friday, or Monday when the 1st is a Saturday
        return day - 1 if day > 1 else day + 2
    if wd == 0:  # Sunday -> Monday, or Friday when the last day is a Sunday
        return day + 1 if day < ndays else day - 2
    return day


class CronExpr:
    """Next/previous matching wall second for a parsed expression; caches matching days per month."""

    __slots__ = ("_flat", "_month_cache", "_month_set", "_months", "fields", "first_tod", "last_tod")

    def __init__(self, fields: CronFields) -> None:
        self.fields = fields
        self._months = fields.months
        self._month_set = frozenset(fields.months)
        self._month_cache: dict[int, tuple[tuple[int, ...], int]] = {}
        n = len(fields.hours) * len(fields.minutes) * len(fields.seconds)
        self._flat: tuple[int, ...] | None = None
        if n <= _FLAT_TOD_LIMIT:
            self._flat = tuple(
                h * 3600 + m * 60 + s for h in fields.hours for m in fields.minutes for s in fields.seconds
            )
        self.first_tod = fields.hours[0] * 3600 + fields.minutes[0] * 60 + fields.seconds[0]
        self.last_tod = fields.hours[-1] * 3600 + fields.minutes[-1] * 60 + fields.seconds[-1]
        if not self._satisfiable():
            raise InvalidArgument("", "matches no day in a full 400-year calendar cycle (e.g. 30 February, 31 April)")

    # -- days --------------------------------------------------------------------------------------
    def _compute_days(self, year: int, month: int) -> tuple[int, ...]:
        if month not in self._month_set:
            return ()
        f = self.fields
        first_wd = (date(year, month, 1).weekday() + 1) % 7
        ndays = calendar.monthrange(year, month)[1]
        dom, dow = f.dom, f.dow
        dom_days = {d for d in dom.days if d <= ndays}
        if dom.last:
            dom_days.add(ndays)
        for nw in dom.nearest_weekday:
            d = _nearest_weekday(nw, ndays, first_wd)
            if d is not None:
                dom_days.add(d)
        if dom.last_weekday:
            last_wd = (first_wd + ndays - 1) % 7
            dom_days.add(ndays - {6: 1, 0: 2}.get(last_wd, 0))
        dow_days = {d for d in range(1, ndays + 1) if (first_wd + d - 1) % 7 in dow.days}
        for wd, k in dow.nth:
            d = 1 + (wd - first_wd) % 7 + 7 * (k - 1)
            if d <= ndays:
                dow_days.add(d)
        last_wd = (first_wd + ndays - 1) % 7
        for wd in dow.last_of:
            dow_days.add(ndays - (last_wd - wd) % 7)
        days = dom_days & dow_days if dom.star or dow.star else dom_days | dow_days
        return tuple(sorted(days))

    def _month(self, year: int, month: int) -> tuple[tuple[int, ...], int]:
        """(matching days, ordinal of day 0 of the month), cached: the planner revisits few months."""
        key = year * 12 + month
        hit = self._month_cache.get(key)
        if hit is None:
            if len(self._month_cache) >= 256:
                self._month_cache.clear()
            hit = (self._compute_days(year, month), date(year, month, 1).toordinal() - 1)
            self._month_cache[key] = hit
        return hit

    def _satisfiable(self) -> bool:
        return any(self._compute_days(y, m) for y in range(2000, 2000 + CYCLE_YEARS) for m in self._months)

    # -- times of day ------------------------------------------------------------------------------
    def _tod_at_or_after(self, sod: int) -> int | None:
        flat = self._flat
        if flat is not None:
            i = bisect_left(flat, sod)
            return flat[i] if i < len(flat) else None
        f = self.fields
        h, rem = divmod(sod, 3600)
        mi, s = divmod(rem, 60)
        hours, minutes, seconds = f.hours, f.minutes, f.seconds
        i = bisect_left(hours, h)
        if i == len(hours):
            return None
        if hours[i] == h:
            j = bisect_left(minutes, mi)
            if j < len(minutes):
                if minutes[j] == mi:
                    k = bisect_left(seconds, s)
                    if k < len(seconds):
                        return h * 3600 + mi * 60 + seconds[k]
                    j += 1
                if j < len(minutes):
                    return h * 3600 + minutes[j] * 60 + seconds[0]
            i += 1
            if i == len(hours):
                return None
        return hours[i] * 3600 + minutes[0] * 60 + seconds[0]

    def _tod_at_or_before(self, sod: int) -> int | None:
        flat = self._flat
        if flat is not None:
            i = bisect_right(flat, sod)
            return flat[i - 1] if i else None
        f = self.fields
        h, rem = divmod(sod, 3600)
        mi, s = divmod(rem, 60)
        hours, minutes, seconds = f.hours, f.minutes, f.seconds
        i = bisect_right(hours, h) - 1
        if i < 0:
            return None
        if hours[i] == h:
            j = bisect_right(minutes, mi) - 1
            if j >= 0:
                if minutes[j] == mi:
                    k = bisect_right(seconds, s) - 1
                    if k >= 0:
                        return h * 3600 + mi * 60 + seconds[k]
                    j -= 1
                if j >= 0:
                    return h * 3600 + minutes[j] * 60 + seconds[-1]
            i -= 1
            if i < 0:
                return None
        return hours[i] * 3600 + minutes[-1] * 60 + seconds[-1]

    # -- queries -----------------------------------------------------------------------------------
    def next_wall_after(self, wall: int) -> int | None:
        """Smallest matching wall second strictly greater than `wall`, or None past year 9999."""
        wall += 1
        days, sod = divmod(wall, 86400)
        tod = self._tod_at_or_after(sod)
        d = date.fromordinal(UNIX_ORDINAL + days)
        year, month, day = d.year, d.month, d.day
        if tod is None:
            day += 1
            tod = self.first_tod
        months = self._months
        limit = year + CYCLE_YEARS
        while True:
            mdays, base = self._month(year, month)
            i = bisect_left(mdays, day)
            if i < len(mdays):
                if mdays[i] != day:
                    tod = self.first_tod
                return (base + mdays[i] - UNIX_ORDINAL) * 86400 + tod
            j = bisect_right(months, month)
            if j < len(months):
                month = months[j]
            else:
                year += 1
                month = months[0]
                if year > min(limit, MAX_YEAR):
                    return None
            day = 1
            tod = self.first_tod

    def prev_wall_before(self, wall: int) -> int | None:
        """Largest matching wall second strictly less than `wall`, or None before year 1."""
        wall -= 1
        days, sod = divmod(wall, 86400)
        tod = self._tod_at_or_before(sod)
        d = date.fromordinal(UNIX_ORDINAL + days)
        year, month, day = d.year, d.month, d.day
        if tod is None:
            day -= 1
            tod = self.last_tod
        months = self._months
        limit = year - CYCLE_YEARS
        while True:
            mdays, base = self._month(year, month)
            i = bisect_right(mdays, day) - 1
            if i >= 0:
                if mdays[i] != day:
                    tod = self.last_tod
                return (base + mdays[i] - UNIX_ORDINAL) * 86400 + tod
            j = bisect_left(months, month) - 1
            if j >= 0:
                month = months[j]
            else:
                year -= 1
                month = months[-1]
                if year < max(limit, MIN_YEAR):
                    return None
            day = 31
            tod = self.last_tod

    def matches_wall(self, wall: int) -> bool:
        days, sod = divmod(wall, 86400)
        d = date.fromordinal(UNIX_ORDINAL + days)
        f = self.fields
        h, rem = divmod(sod, 3600)
        mi, s = divmod(rem, 60)
        return (
            h in f.hours
            and mi in f.minutes
            and s in f.seconds
            and d.day in self._month(d.year, d.month)[0]
        )
