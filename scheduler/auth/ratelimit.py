"""Requests per second per principal: a token bucket per principal name, on each planner node.

Each node limits what it serves on its own (no coordination on the request path), so a principal that
spreads its calls over N planners gets up to N times the rate: size `rate_limit_rps` per node. Planners'
own peer calls (`system:planner`) and worker streams (one call per stream) are not limited. Pure apart
from the injected monotonic clock; the bucket table is bounded (least recently used principals dropped).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

MAX_PRINCIPALS = 10_000


class RateLimiter:
    def __init__(self, rate: float, burst: int, monotonic: Callable[[], float]) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be positive and burst at least 1")
        self.rate, self.burst, self.now = rate, float(burst), monotonic
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # name -> (tokens, at)
        self.refused = 0

    def take(self, name: str) -> float:
        """0.0 when the call may go ahead (a token was taken), else the seconds until one is available."""
        now = self.now()
        tokens, at = self._buckets.pop(name, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        if tokens >= 1.0:
            self._buckets[name] = (tokens - 1.0, now)
            wait = 0.0
        else:
            self._buckets[name] = (tokens, now)
            wait = (1.0 - tokens) / self.rate
            self.refused += 1
        while len(self._buckets) > MAX_PRINCIPALS:
            self._buckets.popitem(last=False)
        return wait
