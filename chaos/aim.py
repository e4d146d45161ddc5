"""Aim a fault at a target that lets it exercise something, just before it is injected.

The plan picks targets from the seed, before the run: a planner fault may then land on a planner that owns
nothing at that moment (an earlier fault restarted it and rebalancing has not given it partitions back), a
worker crash on a worker with no run under way. Such a fault exercises nothing and validity makes the whole
run invalid for it (a half game day had 9 of 103). So the runner first waits a little for the planned target
to be worth faulting, and otherwise moves the fault to one that is: a planner of the same region that owns a
partition (any region's, when the cluster has no region policy: every region plans), a worker with an
effect under way. Which one is a pure function of the fault's index and what the
cluster shows, and the move is recorded with the window (`detail.aimed_from`), so the report says which
target was faulted and why. With a region policy, a planner of a standby region, which owns nothing by design, is
never moved to the primary: a fault aimed at it is meant for it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

from chaos.live import LiveCluster
from chaos.plan import FaultWindow
from scheduler.clock import SYSTEM_CLOCK

__all__ = ["AIM_WAIT_S", "aim"]

# How long the planned target gets to become worth faulting before the fault moves: rebalancing hands a
# restarted planner its partitions a few seconds after its hold-down; a worker of the game day's load has a
# run under way within a second or two.
AIM_WAIT_S = 5.0


def _pick(candidates: list[str], index: int) -> str:
    return sorted(candidates)[index % len(candidates)]


async def aim(w: FaultWindow, live: LiveCluster, say: Callable[[str], None], *,
              wait_s: float = AIM_WAIT_S) -> FaultWindow:
    """`w`, or a copy aimed at another target of the same role (see the module doc)."""
    planner, sep, rest = w.target.partition("->")
    if w.type == "F7":
        return await _aim_worker(w, live, say, wait_s)
    if w.type == "F13":
        return await _aim_fed(w, live, say, wait_s)
    if w.role == "region" and live.scenario.cluster.primary is None:
        return await _aim_region(w, live, say, wait_s)
    if planner not in live.live_planners():
        return w  # not a planner name ("cluster", an etcd member): nothing to aim
    if await live.wait_owning(planner, wait_s):
        return w
    region = live.region_of(planner)
    candidates = [p for p in await live.owning_planners() if p in live.live_planners()]
    owning = [p for p in candidates if live.region_of(p) == region]
    if not owning and live.scenario.cluster.primary is None:
        # Active-active (no region policy): every region plans, so a region that owns nothing right now is
        # only recovering (its planners back from a region loss, inside their peers' rebalance hold-down).
        owning = candidates
    if not owning:
        say(f"fault #{w.index} {w.type}: {planner} owns no partition after {wait_s:g} s and no planner of "
            f"{region} does; injected on it anyway")
        return w
    to = _pick(owning, w.index)
    say(f"fault #{w.index} {w.type}: {planner} owns no partition after {wait_s:g} s: aimed at {to} instead")
    return dataclasses.replace(w, target=to + sep + rest, aimed_from=w.target)


async def _aim_region(w: FaultWindow, live: LiveCluster, say: Callable[[str], None], wait_s: float) -> FaultWindow:
    """A region loss (active-active) of a region that owns nothing (back from an earlier loss, inside its
    peers' hold-down) moves to a region that owns partitions."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while True:
        regions = {live.region_of(p) for p in await live.owning_planners() if p in live.live_planners()}
        if w.target in regions or loop.time() >= deadline:
            break
        await asyncio.sleep(0.25)
    if w.target in regions or not regions:
        return w
    to = _pick(list(regions), w.index)
    say(f"fault #{w.index} {w.type}: region {w.target} owns no partition after {wait_s:g} s: aimed at {to} instead")
    return dataclasses.replace(w, target=to, aimed_from=w.target)


async def _aim_worker(w: FaultWindow, live: LiveCluster, say: Callable[[str], None], wait_s: float) -> FaultWindow:
    sink = live.sink
    if sink is None or w.target not in live.workers:
        return w
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while sink.running(w.target) == 0 and loop.time() < deadline:  # noqa: ASYNC110 (polls the sink)
        await asyncio.sleep(0.02)
    if sink.running(w.target) > 0:
        return w
    busy = {x: sink.running(x) for x, proc in live.workers.items() if proc.running}
    busy = {x: n for x, n in busy.items() if n > 0}
    if not busy:
        return w  # the nemesis waits on longer for its own target
    most = max(busy.values())
    to = _pick([x for x, n in busy.items() if n == most], w.index)
    say(f"fault #{w.index} F7: {w.target} has no effect under way after {wait_s:g} s: aimed at {to} instead")
    return dataclasses.replace(w, target=to, aimed_from=w.target)


async def _aim_fed(w: FaultWindow, live: LiveCluster, say: Callable[[str], None], wait_s: float) -> FaultWindow:
    """F13: a worker that planners hand work (one started an effect in the last `wait_s`), else the one that started
    one last. Each planner fills its worker streams in the order they connected, so under a light load one worker
    can run everything while another runs nothing: stranding that one exercises nothing."""
    sink = live.sink
    if sink is None or w.target not in live.workers:
        return w
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    since = SYSTEM_CLOCK.wall_ms() - int(wait_s * 1000)
    while sink.recent(w.target, since) is None and loop.time() < deadline:  # noqa: ASYNC110 (polls the sink)
        await asyncio.sleep(0.05)
    if sink.recent(w.target, since) is not None:
        return w
    fed = [(t, x) for x, (t, _) in sink.latest.items() if x in live.workers and live.workers[x].running]
    if not fed:
        return w
    to = max(fed)[1]
    say(f"fault #{w.index} F13: {w.target} started no effect in {wait_s:g} s: aimed at {to} instead")
    return dataclasses.replace(w, target=to, aimed_from=w.target)
