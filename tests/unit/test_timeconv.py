"""scheduler.timeconv: epoch milliseconds to protobuf Timestamp / Duration, exact to the millisecond."""

from __future__ import annotations

import pytest

from scheduler.timeconv import ms_to_duration, ms_to_timestamp


@pytest.mark.parametrize("ms", [0, 1, 999, 1_000, 1_767_225_600_123, -1, -1_500])
def test_round_trips(ms: int) -> None:
    t, d = ms_to_timestamp(ms), ms_to_duration(ms)
    assert t.ToMilliseconds() == ms and d.ToMilliseconds() == ms
    assert 0 <= t.nanos < 1_000_000_000, "a Timestamp before the epoch is seconds down, nanos up"


def test_fields() -> None:
    assert (ms_to_timestamp(1_500).seconds, ms_to_timestamp(1_500).nanos) == (1, 500_000_000)
    assert (ms_to_duration(2_250).seconds, ms_to_duration(2_250).nanos) == (2, 250_000_000)
