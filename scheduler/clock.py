"""The only module that reads the system clocks (STYLE habit 3).

Production code receives a `Clock`; tests pass a `FakeClock` they move by hand. Wall time is for
planning (UTC epoch milliseconds, the unit of planned times and execution ids); monotonic time is for
leases and deadlines, which must not jump when NTP steps the wall clock.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def wall_ms(self) -> int:
        """UTC wall time, epoch milliseconds."""
        ...

    def monotonic(self) -> float:
        """Monotonic seconds; only differences mean anything."""
        ...


class SystemClock:
    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock tests move by hand; wall and monotonic time advance together unless told otherwise."""

    def __init__(self, wall_ms: int = 0, monotonic: float = 1000.0) -> None:
        self._wall_ms = wall_ms
        self._mono = monotonic

    def wall_ms(self) -> int:
        return self._wall_ms

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        self._wall_ms += round(seconds * 1000)
        self._mono += seconds

    def step_wall(self, ms: int) -> None:
        """Jump the wall clock only (an NTP step or a skewed host)."""
        self._wall_ms += ms


SYSTEM_CLOCK = SystemClock()
