"""The stateful invariant scenario of tests/unit/planner/test_invariant_stateful.py in a shorter form, against
a real etcd: a few fixed seeds of random operations and faults, the same World (real planner code on a
fake clock; etcd is real, so its txn checks, revisions and watch history are etcd's own) and the same
checker (tests/invariant.py) after every step and at the end."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from chaos.infra.etcd import EtcdCluster
from scheduler.clock import FakeClock
from scheduler.execution import ExecState, Execution
from scheduler.store.etcd import EtcdClient
from scheduler.store.keyspace import Keyspace
from scheduler.timeplan import MissedRuns, Overlap
from tests.invariant import (
    POOLS,
    START_TIMEOUT_CHECK,
    T0,
    Behaviour,
    World,
    catch_up_after_a_pause_and_a_kill,
    default_policies,
    describe,
)

pytestmark = pytest.mark.etcd

STEPS = 25
BEHAVIOURS: list[Behaviour] = ["ok", "ok", "fail_transient", "fail_permanent", "slow", "crash", "lost_ack"]
if START_TIMEOUT_CHECK:
    BEHAVIOURS.append("lost")


@pytest.fixture
async def kv(etcd_server: EtcdCluster) -> AsyncIterator[EtcdClient]:
    async with EtcdClient(etcd_server.config(timeout=5.0)) as c:
        yield c


async def step(world: World, rng: random.Random) -> None:
    alive = world.alive()
    kind = rng.choice(["create", "create", "advance", "advance", "advance", "advance", "update", "pause", "resume",
                       "delete", "trigger", "backfill", "rerun", "cancel", "replay", "workers", "kill", "freeze",
                       "thaw", "handover"])
    if kind == "create" and len(alive) < 4:
        pol = default_policies(rng.choice(list(MissedRuns)), rng.randint(1, 4), rng.choice([3, 8, 30, 3600]),
                               rng.choice(list(Overlap)))
        await world.create(rng.choice([1, 2, 5]), rng.random() < 0.5, rng.choice(POOLS), pol)
    elif kind == "advance":
        await world.advance(rng.randint(100, 10_000))
    elif kind == "update" and alive:
        await world.update(rng.choice(alive), period_s=rng.choice([None, 1, 2, 5]), pool=rng.choice([None, *POOLS]),
                           overlap=rng.choice([None, *Overlap]))
    elif kind == "pause" and alive:
        await world.pause(rng.choice(alive))
    elif kind == "resume" and alive:
        await world.resume(rng.choice(alive))
    elif kind == "delete" and alive:
        await world.delete(rng.choice(alive), rng.random() < 0.5)
    elif kind in ("trigger", "backfill") and alive:
        await world.operate(kind, lambda es: None, sid=rng.choice(alive), back_s=rng.randint(1, 20))
    elif kind in ("rerun", "cancel", "replay"):
        want = {"rerun": {ExecState.SUCCEEDED, ExecState.CANCELLED, ExecState.SKIPPED, ExecState.FAILED},
                "cancel": {ExecState.SCHEDULED, ExecState.DISPATCHED, ExecState.RUNNING, ExecState.RETRY_WAIT},
                "replay": {ExecState.DEAD_LETTER}}[kind]

        def pick(es: list[Execution]) -> Execution | None:
            cands = [e for e in es if e.state in want]
            return rng.choice(cands) if cands else None

        await world.operate(kind, pick)
    elif kind == "workers":
        for _ in range(rng.randint(1, 3)):
            b = rng.choice(BEHAVIOURS)
            dur = {"slow": rng.randint(2_000, 12_000), "lost": 0}.get(b, rng.randint(100, 900))
            world.workers.plan.append((b, dur))
        world.log.ops.append(f"t={world.clock.wall_ms() - T0}: workers will {list(world.workers.plan)}")
    elif kind == "kill" and world.live is not None:
        world.log.ops.append(f"t={world.clock.wall_ms() - T0}: kill planner")
        await world.kill(rng.randint(0, 8_000))
    elif kind == "freeze" and world.live is not None and not world.frozen:
        world.log.ops.append(f"t={world.clock.wall_ms() - T0}: SIGSTOP planner")
        await world.freeze()
    elif kind == "thaw" and world.frozen:
        world.log.ops.append(f"t={world.clock.wall_ms() - T0}: SIGCONT the frozen planner")
        await world.thaw()
    elif kind == "handover" and world.live is not None:
        world.log.ops.append(f"t={world.clock.wall_ms() - T0}: graceful handover")
        await world.handover()


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_the_invariant_holds_against_real_etcd(kv: EtcdClient, key_prefix: str, seed: int) -> None:
    clock = FakeClock(wall_ms=T0)
    world = World(kv, clock, Keyspace(key_prefix.rstrip("/")))
    rng = random.Random(seed)
    await world.start()
    try:
        for _ in range(STEPS):
            await step(world, rng)
            await _holds(world)
        await world.advance(15_000)
        await _holds(world, final=True)
    finally:
        await world.close()


async def _holds(world: World, *, final: bool = False) -> None:
    bad = await world.check(final=final)
    assert not bad, "\n".join(bad[:15]) + "\noperations:\n" + describe(world.log)


# ---- the twin's findings of sessions 18 and 19, replayed on a real etcd -------------------------------------

SKIP_1S = default_policies(MissedRuns.SKIP, 1, 3, Overlap.SKIP)


async def _pause_change_resume(w: World) -> None:
    """Pause, a spec change and a resume before the owner's next round: the old spec's run must not run."""
    await w.create(1, False, "a", SKIP_1S)
    await w.advance(300)
    await w.pause("s1")
    await w.update("s1", period_s=2)
    await w.resume("s1")
    await w.advance(700)


async def _retry_beside_a_buffered_run(w: World) -> None:
    """A run on its retry holds the run buffered behind its failed attempt (buffer_all)."""
    w.workers.plan.extend([("fail_transient", 1_800), ("ok", 900), ("ok", 300)])
    await w.create(1, False, "a", default_policies(MissedRuns.SKIP, 1, 3, Overlap.BUFFER_ALL))
    await w.advance(6_000)


async def _crash_under_buffer_one(w: World) -> None:
    """Session 19: a buffer_one run's worker crashed; the schedule must not wedge behind the run's retry."""
    w.workers.plan.append(("crash", 700))
    await w.create(1, False, "a", default_policies(MissedRuns.SKIP, 1, 3, Overlap.BUFFER_ONE))
    await w.advance(20_000)


@pytest.mark.parametrize("scenario", [catch_up_after_a_pause_and_a_kill, _pause_change_resume,
                                      _retry_beside_a_buffered_run, _crash_under_buffer_one],
                         ids=lambda f: f.__name__.strip("_"))
async def test_the_twins_findings_hold_on_real_etcd(kv: EtcdClient, key_prefix: str,
                                                    scenario: Callable[[World], Awaitable[None]]) -> None:
    world = World(kv, FakeClock(wall_ms=T0), Keyspace(key_prefix.rstrip("/")))
    await world.start()
    try:
        await scenario(world)
        await _holds(world)
        await world.advance(15_000)
        await _holds(world, final=True)
    finally:
        await world.close()
