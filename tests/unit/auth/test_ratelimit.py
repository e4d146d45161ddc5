"""The per-principal token bucket: a burst, then one call per 1/rate seconds; each principal its own."""

from __future__ import annotations

import pytest

from scheduler.auth.ratelimit import RateLimiter
from scheduler.clock import FakeClock


def test_burst_then_rate_per_principal() -> None:
    clock = FakeClock()
    lim = RateLimiter(rate=10, burst=3, monotonic=clock.monotonic)
    assert [lim.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert lim.take("a") == pytest.approx(0.1)  # the hint: one token comes in 1/rate s
    assert lim.take("b") == 0.0  # another principal is not affected
    clock.advance(0.1)
    assert lim.take("a") == 0.0
    assert lim.take("a") > 0
    clock.advance(60)
    assert [lim.take("a") for _ in range(4)][:3] == [0.0, 0.0, 0.0]  # refilled up to the burst, no more
    assert lim.refused == 3


def test_bad_limits() -> None:
    with pytest.raises(ValueError, match="rate"):
        RateLimiter(0, 1, FakeClock().monotonic)
