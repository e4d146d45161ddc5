"""Named table cases for the cron syntax around a fixed anchor (2026-01-01T00:00Z, a Thursday), UTC."""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import islice, pairwise

import pytest

from scheduler.timeplan import parse_spec

ANCHOR = datetime(2026, 1, 1, tzinfo=UTC)


def d(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


CASES = [
    pytest.param("*/15 * * * *", ["2026-01-01T00:15", "2026-01-01T00:30", "2026-01-01T00:45"], id="minute-step"),
    pytest.param("5-20/5 * * * *", ["2026-01-01T00:05", "2026-01-01T00:10", "2026-01-01T00:15",
                                    "2026-01-01T00:20", "2026-01-01T01:05"], id="range-step"),
    pytest.param("10/20 * * * *", ["2026-01-01T00:10", "2026-01-01T00:30", "2026-01-01T00:50"], id="start-step"),
    pytest.param("0 9 * * 1-5", ["2026-01-01T09:00", "2026-01-02T09:00", "2026-01-05T09:00"], id="weekdays"),
    pytest.param("0 9 * * MON-FRI", ["2026-01-01T09:00", "2026-01-02T09:00", "2026-01-05T09:00"], id="dow-names"),
    pytest.param("0 12 * * SAT,SUN", ["2026-01-03T12:00", "2026-01-04T12:00", "2026-01-10T12:00"], id="weekend"),
    pytest.param("0 12 * * 7", ["2026-01-04T12:00", "2026-01-11T12:00"], id="dow-7-is-sunday"),
    pytest.param("0 0 1 JAN,JUL *", ["2026-07-01T00:00", "2027-01-01T00:00"], id="month-names-strictly-after"),
    pytest.param("*/20 * * * * *", ["2026-01-01T00:00:20", "2026-01-01T00:00:40", "2026-01-01T00:01:00"],
                 id="six-fields-seconds-first"),
    pytest.param("30 15 10 * * *", ["2026-01-01T10:15:30", "2026-01-02T10:15:30"], id="six-fields-fixed"),
    pytest.param("0 0 L * *", ["2026-01-31T00:00", "2026-02-28T00:00", "2026-03-31T00:00"], id="last-day"),
    pytest.param("0 0 15W * *", ["2026-01-15T00:00", "2026-02-16T00:00", "2026-03-16T00:00"], id="nearest-weekday"),
    pytest.param("0 0 1W 8 *", ["2026-08-03T00:00"], id="1W-on-saturday-stays-in-month"),
    pytest.param("0 0 LW * *", ["2026-01-30T00:00", "2026-02-27T00:00", "2026-03-31T00:00"], id="last-weekday"),
    pytest.param("0 0 * * 5L", ["2026-01-30T00:00", "2026-02-27T00:00", "2026-03-27T00:00"], id="last-friday"),
    pytest.param("0 0 * * FRIL", ["2026-01-30T00:00", "2026-02-27T00:00"], id="last-friday-name"),
    pytest.param("0 0 * * 1#2", ["2026-01-12T00:00", "2026-02-09T00:00", "2026-03-09T00:00"], id="second-monday"),
    pytest.param("0 0 * * MON#2", ["2026-01-12T00:00", "2026-02-09T00:00"], id="second-monday-name"),
    pytest.param("0 0 13 * 5", ["2026-01-02T00:00", "2026-01-09T00:00", "2026-01-13T00:00", "2026-01-16T00:00"],
                 id="vixie-or-when-both-restricted"),
    pytest.param("0 0 */10 * 5", ["2026-05-01T00:00"], id="vixie-and-when-dom-starts-with-star"),
    pytest.param("0 0 ? * MON", ["2026-01-05T00:00", "2026-01-12T00:00"], id="question-mark"),
    pytest.param("@hourly", ["2026-01-01T01:00", "2026-01-01T02:00"], id="hourly"),
    pytest.param("@daily", ["2026-01-02T00:00"], id="daily"),
    pytest.param("@midnight", ["2026-01-02T00:00"], id="midnight"),
    pytest.param("@weekly", ["2026-01-04T00:00", "2026-01-11T00:00"], id="weekly-sunday"),
    pytest.param("@monthly", ["2026-02-01T00:00", "2026-03-01T00:00"], id="monthly"),
    pytest.param("@yearly", ["2027-01-01T00:00"], id="yearly"),
    pytest.param("@annually", ["2027-01-01T00:00"], id="annually"),
    pytest.param("@every 90s", ["2026-01-01T00:01:30", "2026-01-01T00:03:00"], id="every-epoch-aligned"),
    pytest.param("@every 1h30m phase 15m", ["2026-01-01T00:15", "2026-01-01T01:45"], id="every-phase"),
    pytest.param("0 0 29 2 *", ["2028-02-29T00:00", "2032-02-29T00:00"], id="leap-day"),
    pytest.param("0 0 * * 5#5", ["2026-01-30T00:00", "2026-05-29T00:00"], id="fifth-friday-only-when-it-exists"),
]


@pytest.mark.parametrize(("spec", "expected"), CASES)
def test_next_times(spec: str, expected: list[str]) -> None:
    got = list(islice(parse_spec(spec).iter_after(ANCHOR), len(expected)))
    assert got == [d(e) for e in expected]


@pytest.mark.parametrize(("spec", "expected"), CASES)
def test_prev_walks_back_the_same_times(spec: str, expected: list[str]) -> None:
    plan = parse_spec(spec)
    times = [d(e) for e in expected]
    for earlier, later in pairwise(times):
        assert plan.prev_before(later) == earlier


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param("0 9 * * 1-5", "2025-12-31T09:00", id="weekday-before-anchor"),
        pytest.param("0 0 1 1 *", "2025-01-01T00:00", id="strictly-before-an-exact-match"),
        pytest.param("0 0 L 2 *", "2025-02-28T00:00", id="last-of-february"),
        pytest.param("@every 90s", "2025-12-31T23:58:30", id="every"),
    ],
)
def test_previous_time(spec: str, expected: str) -> None:
    assert parse_spec(spec).prev_before(ANCHOR) == d(expected)


def test_between_is_half_open() -> None:
    plan = parse_spec("0 * * * *")
    got = list(plan.between(ANCHOR, d("2026-01-01T03:00")))
    assert got == [d("2026-01-01T01:00"), d("2026-01-01T02:00"), d("2026-01-01T03:00")]


def test_bounds_are_inclusive() -> None:
    start, end = int(d("2026-01-01T02:00").timestamp() * 1000), int(d("2026-01-01T04:00").timestamp() * 1000)
    plan = parse_spec("0 * * * *", start_ms=start, end_ms=end)
    assert list(plan.iter_after(ANCHOR)) == [d("2026-01-01T02:00"), d("2026-01-01T03:00"), d("2026-01-01T04:00")]
    assert plan.prev_before(d("2026-01-02T00:00")) == d("2026-01-01T04:00")
    assert plan.prev_before(d("2026-01-01T02:00")) is None


def test_ms_queries_respect_whole_second_planned_times() -> None:
    plan = parse_spec("* * * * * *")
    assert plan.next_after_ms(1500) == 2000
    assert plan.next_after_ms(2000) == 3000
    assert plan.prev_before_ms(1500) == 1000
    assert plan.prev_before_ms(1000) == 0


def test_naive_datetime_is_refused() -> None:
    with pytest.raises(ValueError, match="time zone"):
        parse_spec("* * * * *").next_after(datetime(2026, 1, 1))
