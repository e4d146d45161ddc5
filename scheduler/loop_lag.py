"""How long the event loop goes without a turn: the measure of "a busy planner starves its keep-alive".

A task sleeps `interval` seconds over and over; how much later than asked it wakes is the time the
loop spent on other callbacks without yielding (or the process was not scheduled at all). Every task
on the loop, the lease keep-alive included, waits at least that long for its turn, so the longest
stall is what to compare with the lease's renew interval and `TTL - safety_margin` (docs/architecture.md,
"A busy planner keeps its session"). The probe itself costs one timer per interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import Callable, Iterator

from scheduler.errors import InvalidArgument

log = logging.getLogger(__name__)


# A claim of at least this many schedules freezes the heap afterwards (LoadHeap).
FREEZE_AFTER_LOAD = 1000


class LoadHeap:
    """Keeps the cyclic garbage collector's full collections out of big claims, and off what they loaded.

    A full (generation 2) collection visits every tracked object without yielding: measured here, 160-240
    ms with 80,000 schedules loaded (tests/store/test_busy_planner.py), growing with the heap, so seconds
    at a million, and a load triggers them as it grows the heap. So: while any partition loads, the
    collector is off (`loading`); after a big load, everything alive is frozen (`gc.freeze`) so that
    later full collections skip it. What a claim loads lives as long as the partition is owned and holds
    no reference cycles (frozen dataclasses, plans, heap tuples): reference counting frees it when the
    partition is dropped, frozen or not. The cost: cyclic garbage made during a load waits until the
    load ends, and cyclic garbage alive at the moment of a freeze is never collected (once per big claim,
    so bounded by claims, not by time).
    """

    def __init__(self) -> None:
        self._loading = 0
        self._disabled = False

    @contextlib.contextmanager
    def loading(self) -> Iterator[None]:
        if self._loading == 0 and gc.isenabled():
            gc.disable()
            self._disabled = True
        self._loading += 1
        try:
            yield
        finally:
            self._loading -= 1
            if self._loading == 0 and self._disabled:
                self._disabled = False
                gc.enable()

    @staticmethod
    def loaded(schedules: int) -> None:
        if schedules >= FREEZE_AFTER_LOAD:
            gc.freeze()


LOAD_HEAP = LoadHeap()  # one per process: the collector is


def check_gc_threshold(value: int) -> None:
    """The `gc_threshold` setting (planners and `schedctl worker`): 0, or 700 (CPython's own) to 1,000,000."""
    if value and not 700 <= value <= 1_000_000:
        raise InvalidArgument("gc_threshold", f"{value} is outside 700-1000000 (0: CPython's own)")


def tune_collector(threshold0: int) -> None:
    """A planner's (or `schedctl worker`'s) collector: generation 0 collected after `threshold0` net new
    container objects, not CPython's 700 (0: left as it is).

    A planner's execution records, requests and responses live a second or two and hold no reference
    cycles, so reference counting frees them all; at 700 the collector still visited each in generation 0,
    then 1, and the whole heap in ever more frequent full collections: measured at saturation (bench_e2e
    at 5,000/s offered, 2 planners), 12.8-13.6% of each planner's CPU (about 3,800 generation-0, 350
    generation-1 and 30 full collections of 35 ms in 25 s of CPU). At 50,000: 5 generation-0 collections
    of 20 ms and one generation-1, 0.4-0.7% of its CPU, planner CPU per execution 8-13% lower. Full
    collections keep CPython's ratios (10, 10): cyclic garbage (an exception's traceback, the structures
    of a dropped partition) is still collected, later; a dropped partition asks for one (`collect_soon`)."""
    if threshold0:
        gc.set_threshold(threshold0, 10, 10)


_COLLECT_EVERY = 10.0  # seconds: at most one full collection asked for by dropped partitions
_collect_at = [0.0]


def collect_soon() -> None:
    """A partition was dropped: its planner's structures are cyclic (tasks and callbacks refer back to it) and,
    being old, wait for a full collection, rare with a raised threshold (`tune_collector`). One full collection
    a second from now, once the partition's task has ended; at most one every `_COLLECT_EVERY` seconds (a lost
    session drops every partition at once)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not on a loop (a test calling the listener directly): nothing to wait for
        return
    now = loop.time()
    if now < _collect_at[0]:
        return
    _collect_at[0] = now + _COLLECT_EVERY
    loop.call_later(1.0, gc.collect)


class LoopLagProbe:
    def __init__(self, monotonic: Callable[[], float], *, interval: float = 0.05, warn_after: float = 0.5) -> None:
        if interval <= 0 or warn_after <= 0:
            raise ValueError("interval and warn_after must be > 0")
        self._monotonic, self.interval, self.warn_after = monotonic, interval, warn_after
        self.max_stall = 0.0  # the longest stall since the probe started, seconds
        self.last_stall = 0.0
        self._window_max = 0.0  # the longest since the last take_window_max() (a metrics scrape)
        self.stalls_over_warn = 0  # how many stalls were longer than warn_after
        self.beats = 0
        self.last_beat = monotonic()  # when the loop last gave the probe a turn (monotonic)

    def observe(self, stall: float) -> None:
        self.beats += 1
        self.last_stall = stall
        if stall > self.max_stall:
            self.max_stall = stall
        if stall > self._window_max:
            self._window_max = stall
        if stall >= self.warn_after:
            self.stalls_over_warn += 1
            # A log line names the stall so an operator can match it with a lost session or late runs.
            log.warning("event loop stalled for %.3fs (longest so far %.3fs)", stall, self.max_stall,
                        extra={"event": "loop_stall", "stall_s": round(stall, 4)})

    def take_window_max(self) -> float:
        """The longest stall since the last call (or the start); starts a new window."""
        m, self._window_max = self._window_max, 0.0
        return m

    async def run(self) -> None:
        while True:
            asked = self._monotonic() + self.interval
            await asyncio.sleep(self.interval)
            now = self._monotonic()
            self.last_beat = now
            self.observe(max(0.0, now - asked))
