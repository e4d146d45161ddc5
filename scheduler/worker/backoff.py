"""Exponential backoff with full jitter, for re-dialling planners and re-sending results."""

from __future__ import annotations

import random


class Backoff:
    """`next()` returns a random delay in [0, min(cap, base * 2**n)) and increments n; `reset()` after
    a success. Full jitter keeps a fleet of workers from reconnecting in lock-step after a planner
    restart."""

    def __init__(self, base: float, cap: float, rng: random.Random | None = None) -> None:
        self.base = base
        self.cap = cap
        self._n = 0
        self._rng = rng or random.Random()

    def next(self) -> float:
        ceiling = min(self.cap, self.base * (2 ** min(self._n, 32)))
        self._n += 1
        # Never quite zero: a planner that refuses at once must not be hammered in a tight loop.
        return max(self.base / 10, self._rng.uniform(0, ceiling))

    def reset(self) -> None:
        self._n = 0
