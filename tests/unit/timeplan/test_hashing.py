"""H and jitter hashes are a compatibility contract: these literal values must never change."""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import islice

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.timeplan import jitter_ms, parse_spec, stable_u64

ANCHOR = datetime(2026, 1, 1, tzinfo=UTC)


def test_stable_u64_is_pinned() -> None:
    assert stable_u64("abc") == 13436514500253700074


def test_jitter_is_pinned() -> None:
    assert jitter_ms("billing-eu", 1767225600000, 30000) == 27141
    assert jitter_ms("billing-eu", 1767225600000, 0) == 0


def test_h_fields_are_pinned() -> None:
    assert parse_spec("H H * * *", schedule_id="billing-eu").next_after(ANCHOR) == datetime(
        2026, 1, 1, 8, 8, tzinfo=UTC
    )
    got = list(islice(parse_spec("H(0-29)/10 * * * *", schedule_id="billing-eu").iter_after(ANCHOR), 4))
    assert [t.strftime("%H:%M") for t in got] == ["00:08", "00:18", "00:28", "01:08"]
    assert parse_spec("@every 1h phase H", schedule_id="billing-eu").next_after(ANCHOR) == datetime(
        2026, 1, 1, 0, 51, 39, tzinfo=UTC
    )


def test_h_differs_between_schedules_but_not_between_calls() -> None:
    minutes = {
        parse_spec("H * * * *", schedule_id=f"job-{i}").next_after_ms(0) for i in range(200)
    }
    assert len(minutes) > 30, "H must spread schedules over the hour"
    assert parse_spec("H * * * *", schedule_id="a").next_after_ms(0) == parse_spec(
        "H * * * *", schedule_id="a"
    ).next_after_ms(0)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.text(min_size=1, max_size=20), st.integers(0, 2**41), st.integers(0, 86_400_000))
def test_jitter_in_range_and_deterministic(sid: str, planned: int, jitter: int) -> None:
    j = jitter_ms(sid, planned, jitter)
    assert 0 <= j <= jitter
    assert j == jitter_ms(sid, planned, jitter)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.text(min_size=1, max_size=20), st.integers(0, 28), st.integers(29, 59), st.integers(1, 30))
def test_hashed_values_stay_in_their_range(sid: str, lo: int, hi: int, step: int) -> None:
    plan = parse_spec(f"H({lo}-{hi})/{step} * * * *", schedule_id=sid)
    for t in islice(plan.iter_after(ANCHOR), 5):
        assert lo <= t.minute <= hi
