"""The start window: how many of this planner's hand-outs of a pool may wait for their start at once.

An attempt handed out with start confirmation must have its start recorded by its start-by (its dispatch
+ `start_timeout`), or its owner ends it unstarted and dispatches it again (planner/starts.py), and the
worker drops it unrun. Worker slots alone do not bound that wait: two workers of 10,000 slots each took
20,000 runs of a 100,000 burst at once, this machine records 4,000-6,000 starts a second, and the tail
of every hand-out passed its start-by: 150,000 attempts ended unstarted and were sent again, and 42% of
the burst had not started a minute later (bench/README.md, session 33). More slots made it slower.

So a partition loop hands out only what its pool's window has room for (`Dispatcher.capacity`): hand-outs
submitted and not yet answered (started, refused, unknown), dropped unsent, or past their start-by. Its
size follows the time a start takes to be answered, measured from the send to the worker (what the window
controls: time waiting for a worker's credit or affinity is the queue's, not the start pipeline's), against
the time each hand-out had until its start-by when submitted:
- an answer within a quarter of it, while the window is at least half used, widens the window by one
  (one more per answer: it doubles in a round trip while answers are quick, as TCP's slow start);
- an answer after half of it, or a hand-out sent that reached its start-by unanswered, halves it, at most
  once per half of it (the answers already in the pipeline are as late: one cut per round trip).
Between the two it stays: below saturation answers are quick and the window grows past any burst the
slots allow; at saturation it settles where answers take a quarter to a half of `start_timeout`, so
each is recorded in time and the pipeline is never idle.

One window per pool: the answer time includes the pool's workers (their transit, their loop's delay in
asking), so a pool whose workers answer slowly narrows its own window, not every pool's. A planner
overloaded as a whole answers every pool late and narrows them all. `start_window` (planner settings) fixes
each pool's size instead (a benchmark's A/B: a size past every slot count is "off").
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass

from scheduler.clock import Clock
from scheduler.dispatch.conn import AttemptKey

INITIAL = 2_048  # the slot count that drained 100,000 in session 21 without churn on this machine
FLOOR = 64  # never less: a slow etcd still gets work, and a cut never starves the pool


@dataclass
class _Out:
    pool: str
    expires: float  # monotonic: its start-by
    left: float  # seconds it had until its start-by when submitted
    sent: float = 0.0  # monotonic: put on a worker's stream (0: not yet)


@dataclass
class PoolWindow:
    size: float
    waiting: int = 0  # hand-outs of the pool waiting for their start
    no_cut_until: float = 0.0
    cuts: int = 0  # times it was halved
    expired: int = 0  # hand-outs that reached their start-by unanswered here


class StartWindow:
    def __init__(self, clock: Clock, *, fixed: int = 0) -> None:
        self.clock = clock
        self.fixed = fixed
        self.pools: dict[str, PoolWindow] = {}
        self._out: dict[AttemptKey, _Out] = {}
        self._expiry: list[tuple[float, AttemptKey]] = []  # (monotonic start-by, key); stale ones skipped

    def __len__(self) -> int:
        return len(self._out)

    def pool(self, pool: str) -> PoolWindow:
        w = self.pools.get(pool)
        if w is None:
            w = self.pools[pool] = PoolWindow(float(self.fixed or INITIAL))
        return w

    def add(self, key: AttemptKey, pool: str, left_s: float) -> None:
        """A hand-out of `pool` submitted with `left_s` seconds until its start-by."""
        now = self.clock.monotonic()
        old = self._out.get(key)
        if old is not None:
            self.pools[old.pool].waiting -= 1
        self._out[key] = _Out(pool, now + left_s, left_s)
        self.pool(pool).waiting += 1
        heapq.heappush(self._expiry, (now + left_s, key))

    def sent(self, key: AttemptKey) -> None:
        o = self._out.get(key)
        if o is not None:
            o.sent = self.clock.monotonic()

    def answered(self, keys: Iterable[AttemptKey]) -> bool:
        """Starts answered (any disposition). Returns whether a pool's window had no room before and has now."""
        now = self.clock.monotonic()
        freed = False
        for k in keys:
            o = self._out.pop(k, None)
            if o is None:
                continue
            w = self.pools[o.pool]
            freed |= w.waiting >= int(w.size)
            w.waiting -= 1
            if not o.sent:
                continue
            took = now - o.sent
            if took > o.left / 2:
                self._cut(w, now, o.left)
            elif not self.fixed and took < o.left / 4 and w.waiting >= w.size / 2:
                w.size += 1
        return freed

    def drop(self, keys: Iterable[AttemptKey]) -> None:
        """Hand-outs no answer will come for (taken back unsent, the stream ended): no signal either way."""
        for k in keys:
            o = self._out.pop(k, None)
            if o is not None:
                self.pools[o.pool].waiting -= 1

    def room(self, pool: str) -> int:
        self._expire(self.clock.monotonic())
        w = self.pool(pool)
        return max(0, int(w.size) - w.waiting)

    def _cut(self, w: PoolWindow, now: float, left: float) -> None:
        if self.fixed or now < w.no_cut_until:
            return
        w.size = max(float(FLOOR), w.size / 2)
        w.no_cut_until = now + left / 2
        w.cuts += 1

    def _expire(self, now: float) -> None:
        q = self._expiry
        while q and q[0][0] <= now:
            _, k = heapq.heappop(q)
            o = self._out.get(k)
            if o is not None and o.expires <= now:
                del self._out[k]
                w = self.pools[o.pool]
                w.waiting -= 1
                w.expired += 1
                if o.sent:
                    self._cut(w, now, o.left)
        if len(q) > 4 * len(self._out) + 1024:  # answered entries leave the dict, not the heap
            self._expiry = [(t, k) for t, k in q if k in self._out]
            heapq.heapify(self._expiry)
