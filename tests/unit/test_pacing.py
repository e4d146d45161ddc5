"""Pacer (bounded stretches of CPU work between event-loop turns) and the loop-lag probe."""

from __future__ import annotations

import asyncio

import pytest

from scheduler.loop_lag import LoopLagProbe
from scheduler.tasks import Pacer


class Ticks:
    """A monotonic clock that moves `step` seconds at every read."""

    def __init__(self, step: float) -> None:
        self.t, self.step = 0.0, step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


async def test_a_pacer_yields_once_its_budget_is_used() -> None:
    ran: list[int] = []

    async def other() -> None:
        ran.append(len(ran))

    pacer = Pacer(Ticks(0.004), budget=0.01, check_every=1)
    task = asyncio.create_task(other())
    for _ in range(2):  # 2 reads of 4 ms each: under the budget
        await pacer.pace()
    assert not ran and pacer.turns == 0  # the loop had no turn yet: the other task has not run
    await pacer.pace()
    assert pacer.turns == 1 and ran == [0]  # the third read passed 10 ms: a turn, and the other task ran
    await task


async def test_a_pacer_reads_the_clock_only_every_check_every_items() -> None:
    clock = Ticks(1.0)
    pacer = Pacer(clock, budget=0.5, check_every=10)
    reads = clock.t
    for _ in range(9):
        await pacer.pace()
    assert clock.t == reads and pacer.turns == 0
    await pacer.pace()
    assert pacer.turns == 1


def test_a_pacer_refuses_a_useless_budget() -> None:
    with pytest.raises(ValueError, match="budget"):
        Pacer(budget=0)


async def test_the_probe_measures_a_blocked_loop() -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    probe = LoopLagProbe(loop.time, interval=0.01, warn_after=0.05)
    task = asyncio.create_task(probe.run())
    await asyncio.sleep(0.05)
    assert probe.beats > 0
    blocked = 0.2
    until = loop.time() + blocked
    while loop.time() < until:  # a stretch of work that never yields
        pass
    await asyncio.sleep(0.05)
    task.cancel()
    # Most of the blocked stretch (less the probe's own interval), and never more than the test ran.
    assert blocked - probe.interval <= probe.max_stall <= loop.time() - start
    assert probe.stalls_over_warn >= 1
    assert probe.take_window_max() == probe.max_stall
    assert probe.take_window_max() == 0.0
