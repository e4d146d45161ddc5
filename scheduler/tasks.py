"""Stopping asyncio tasks without swallowing the caller's own cancellation; pacing long CPU-bound loops.

`task.cancel(); with suppress(CancelledError): await task` absorbs the task's CancelledError, but
also the caller's if the caller is cancelled while it waits: the caller then carries on as if nobody
had asked it to stop. A node shut down while its lease keeper was being stopped (a session lost at the
same moment) went on to open a new session, and the shutdown waited for it for ever.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from scheduler.clock import SYSTEM_CLOCK


def cancelled_by_caller() -> bool:
    """Whether the running task has a cancellation request of its own pending."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def cancel_and_wait(task: asyncio.Future[Any]) -> None:
    """Cancel `task` and wait until it has ended. Its cancellation is absorbed; the caller's is not.
    Any other exception the task ends with propagates."""
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        if cancelled_by_caller():
            raise


class Pacer:
    """Slices a long CPU-bound loop into bounded stretches between event-loop turns.

    `await pacer.pace()` once per item; it yields (`asyncio.sleep(0)`) once `budget` seconds of real
    time have passed since the last turn. A planner's claim decodes and plans tens of thousands of
    schedules: done in one go, it starved the lease keep-alive and the session was lost (issue 12).
    Time-based rather than every N items, so the bound holds whatever one item costs. The clock is
    read only every `check_every` items: a read costs more than most items do.
    """

    __slots__ = ("_budget", "_count", "_every", "_monotonic", "_since", "turns")

    def __init__(self, monotonic: Callable[[], float] | None = None, budget: float = 0.01,
                 check_every: int = 32) -> None:
        if budget <= 0 or check_every < 1:
            raise ValueError("budget must be > 0 and check_every >= 1")
        # Real time, not a test's fake clock: the bound is on how long the loop really goes without a turn.
        monotonic = monotonic or SYSTEM_CLOCK.monotonic
        self._monotonic, self._budget, self._every = monotonic, budget, check_every
        self._since = monotonic()
        self._count = 0
        self.turns = 0  # how often it yielded (tests check that a long loop did)

    async def pace(self) -> None:
        self._count += 1
        if self._count < self._every:
            return
        self._count = 0
        if self._monotonic() - self._since >= self._budget:
            await asyncio.sleep(0)
            self.turns += 1
            self._since = self._monotonic()
