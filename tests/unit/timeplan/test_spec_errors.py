"""Bad specs are refused at validation with the field and the reason, never by an endless search."""

from __future__ import annotations

import time

import pytest

from scheduler.errors import InvalidArgument
from scheduler.timeplan import parse_spec


@pytest.mark.parametrize(
    ("spec", "field", "reason"),
    [
        pytest.param("61 * * * *", "spec.minute", "61 is outside 0-59", id="minute-range"),
        pytest.param("* 24 * * *", "spec.hour", "24 is outside 0-23", id="hour-range"),
        pytest.param("* * 0 * *", "spec.day_of_month", "0 is outside 1-31", id="dom-range"),
        pytest.param("* * * 13 *", "spec.month", "13 is outside 1-12", id="month-range"),
        pytest.param("* * * * 8", "spec.day_of_week", "8 is outside 0-7", id="dow-range"),
        pytest.param("60 * * * * *", "spec.second", "60 is outside 0-59", id="second-range"),
        pytest.param("*/0 * * * *", "spec.minute", "step 0 must be at least 1", id="zero-step"),
        pytest.param("20-10 * * * *", "spec.minute", "range 20-10 is reversed", id="reversed-range"),
        pytest.param("* * * FOO *", "spec.month", "'FOO' is not a number or a name", id="bad-name"),
        pytest.param("* * * * 1#6", "spec.day_of_week", "#6 in '1#6' is outside 1-5", id="nth-range"),
        pytest.param("? * * * *", "spec.minute", "'?' is only allowed", id="question-in-minute"),
        pytest.param("* * * * L", "spec.day_of_week", "'L' needs a weekday", id="bare-L-in-dow"),
        pytest.param("1,,2 * * * *", "spec.minute", "empty list item", id="empty-item"),
        pytest.param("* * * *", "spec", "expected 5 fields", id="four-fields"),
        pytest.param("* * * * * * *", "spec", "expected 5 fields", id="seven-fields"),
        pytest.param("0 0 1 1 * 2027", "spec", "a year field ('2027') is not supported", id="year-field"),
        pytest.param("0 0 0 1 1 * 2027-2030", "spec", "a year field ('2027-2030') is not supported",
                     id="year-field-seven"),
        pytest.param("", "spec", "is empty", id="empty"),
        pytest.param("0 0 30 2 *", "spec", "matches no day", id="february-30"),
        pytest.param("0 0 31 4,6,9,11 *", "spec", "matches no day", id="31st-of-short-months"),
        pytest.param("@reboot", "spec", "unknown macro", id="reboot"),
        pytest.param("@every 0s", "spec.every", "outside 1s-366d", id="every-zero"),
        pytest.param("@every 500ms", "spec.every", "outside 1s-366d", id="every-sub-second"),
        pytest.param("@every soon", "spec.every", "is not a duration", id="every-garbage"),
        pytest.param("@every 1h phase 2h", "spec.phase", "must be shorter than the period", id="phase-too-long"),
        pytest.param("@every 1h after 5m", "spec.every", "expected '@every", id="every-syntax"),
        pytest.param("x" * 300, "spec", "longer than 256", id="too-long"),
    ],
)
def test_bad_spec_names_field_and_reason(spec: str, field: str, reason: str) -> None:
    t0 = time.perf_counter()
    with pytest.raises(InvalidArgument) as err:
        parse_spec(spec)
    assert err.value.field == field
    assert reason in err.value.reason
    assert str(err.value).startswith(f"{field}: ")
    assert time.perf_counter() - t0 < 5, "validation must not search endlessly"


def test_unknown_zone() -> None:
    with pytest.raises(InvalidArgument) as err:
        parse_spec("* * * * *", tz="Mars/Olympus_Mons")
    assert err.value.field == "time_zone"


def test_bounds_must_be_ordered() -> None:
    with pytest.raises(InvalidArgument) as err:
        parse_spec("* * * * *", start_ms=10, end_ms=5)
    assert err.value.field == "end_at"


@pytest.mark.parametrize("spec", ["0 0 29 2 *", "0 0 * 2 5#5", "0 0 31 * *", "0 0 L 2 *", "0 0 30 2 1"])
def test_rare_but_possible_specs_are_accepted(spec: str) -> None:
    assert parse_spec(spec).next_after_ms(0) is not None


def test_instants_outside_the_planning_window_are_refused_naming_it() -> None:
    from scheduler.timeplan.plan import MAX_MS, MIN_MS, check_in_window
    assert check_in_window(MIN_MS, "start") == MIN_MS and check_in_window(MAX_MS - 1, "start") == MAX_MS - 1
    for bad in (MIN_MS - 1, MAX_MS, -62_135_596_800_000):  # the last is 0001-01-01
        with pytest.raises(InvalidArgument) as e:
            check_in_window(bad, "start")
        assert e.value.field == "start" and "1900-01-01T00:00:00.000Z .. 9990-01-01T00:00:00.000Z" in e.value.reason
    with pytest.raises(InvalidArgument) as e:
        check_in_window(-62_135_596_800_000, "start")
    assert e.value.reason.startswith("0001-01-01T00:00:00.000Z is outside")


@pytest.mark.parametrize(("ms", "text"), [(0, "0s"), (250, "250ms"), (90_000, "1m30s"), (60_000, "1m"),
                                          (86_400_000 + 3_600_000, "1d1h"), (-1500, "-1s500ms")])
def test_durations_in_messages_are_in_human_units(ms: int, text: str) -> None:
    from scheduler.timeplan.plan import format_duration_ms, parse_duration_ms
    assert format_duration_ms(ms) == text
    if ms >= 0:
        assert parse_duration_ms(text, "d") == ms, "the same units the flags take"
