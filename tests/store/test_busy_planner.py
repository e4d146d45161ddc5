"""A planner busy loading a large partition keeps its session (issue 12).

Before the claim was sliced into bounded stretches, loading tens of thousands of schedules ran on the
event loop without a turn for seconds: the lease keep-alive starved, the local deadline passed, the
session was lost, every partition dropped and the load started again. Real etcd, a short TTL, one
partition holding every schedule.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from chaos.infra.etcd import EtcdCluster
from scheduler.clock import SYSTEM_CLOCK
from scheduler.config import CoordinationSettings
from scheduler.model import Schedule
from scheduler.node import PlannerNode
from scheduler.planner.settings import PlannerSettings
from scheduler.store.codec import ScheduleMeta, encode_schedule
from scheduler.store.etcd import EtcdClient
from scheduler.store.etcd.ops import put
from scheduler.store.keyspace import Keyspace

pytestmark = pytest.mark.etcd

N = 80_000  # about 3 s of claim-time work in one stretch before the fix: the 2 s TTL is lost over and over
# The shortest TTL etcd allows; the local deadline is 1.7 s after the last acknowledged keepalive was sent.
COORD = CoordinationSettings(node_id="busy1", lease_ttl=2, renew_interval=0.5, rpc_timeout=0.5, safety_margin=0.3,
                             partitions=1)


@pytest.fixture
async def kv(etcd_server: EtcdCluster) -> AsyncIterator[EtcdClient]:
    async with EtcdClient(etcd_server.config(timeout=5.0)) as c:
        yield c


async def write_schedules(kv: EtcdClient, ks: Keyspace, n: int) -> None:
    """Straight into the keyspace in batched txns (the API would take minutes): yearly schedules, so the
    planner's work is the claim itself and not materialization."""
    now = SYSTEM_CLOCK.wall_ms()
    meta = ScheduleMeta(now, now)

    async def batch(lo: int, hi: int) -> None:
        ops = [put(ks.schedule(0, f"busy-{i}"),
                   encode_schedule(Schedule(id=f"busy-{i}", tenant="t", spec="0 0 1 1 *", worker_pool="p",
                                            task_type="x"), activated_ms=now, meta=meta))
               for i in range(lo, hi)]
        await kv.txn([], ops)

    step = 120
    sem = asyncio.Semaphore(8)

    async def one(lo: int) -> None:
        async with sem:
            await batch(lo, min(lo + step, n))

    await asyncio.gather(*(one(lo) for lo in range(0, n, step)))


async def test_loading_a_large_partition_keeps_the_session(kv: EtcdClient, key_prefix: str) -> None:
    ks = Keyspace(key_prefix.rstrip("/"))
    await write_schedules(kv, ks, N)
    node = PlannerNode(kv, ks, COORD, SYSTEM_CLOCK, planner=PlannerSettings(loop_interval=0.05))
    task = asyncio.create_task(node.run())
    try:
        loop = asyncio.get_running_loop()
        give_up = loop.time() + 90
        while True:
            p = node.planners.get(0)
            if p is not None and len(p.schedules) == N and p.ck is not None and p.stats.rounds > 0:
                break
            assert loop.time() < give_up, "the partition never finished loading"
            await asyncio.sleep(0.1)
        await asyncio.sleep(COORD.lease_ttl)  # and it keeps the session afterwards
        assert node.ownership.sessions == 1, "the session was lost while the planner was busy"
        assert node.ownership.owned_partitions().keys() == {0}
        print(f"loaded {N} schedules with {p.load_turns} loop turns; longest stall "
              f"{node.loop_lag.max_stall:.3f}s (TTL {COORD.lease_ttl}s, renew {COORD.renew}s)")
        assert p.load_turns > 0  # the load was sliced
        # Relative to the lease, not absolute: the keep-alive waited at most this long for a turn.
        budget = (COORD.lease_ttl - COORD.safety_margin) / 4
        assert node.loop_lag.max_stall < budget, f"the event loop stalled {node.loop_lag.max_stall:.3f}s"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
