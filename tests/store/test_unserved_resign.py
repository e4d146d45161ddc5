"""A planner whose link to etcd carries its lease keep-alives but not its partitions' reads and writes (a gray
failure: the game day's F10 flaky link) gives its session up, so that a peer serves the partitions. Real etcd,
two PlannerNodes in one process; the gray node's client fails every call on partition data while its
lease, claims and watches go through."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any

import pytest

from chaos.infra.etcd import EtcdCluster
from scheduler.clock import SYSTEM_CLOCK
from scheduler.config import CoordinationSettings
from scheduler.node import PlannerNode
from scheduler.planner.ownership import LostReason
from scheduler.store.etcd import EtcdClient
from scheduler.store.etcd.errors import OutcomeUnknown, Unavailable
from scheduler.store.etcd.ops import Compare, Op
from scheduler.store.keyspace import Keyspace
from tests.store.test_planner_loop import FAST, FakeDispatcher, sched

pytestmark = pytest.mark.etcd

# No rebalancing back to the gray node within the test: only a resign can move its partitions.
COORD = CoordinationSettings(node_id="gray", lease_ttl=2, renew_interval=0.5, rpc_timeout=0.5, safety_margin=0.3,
                             partitions=4, rebalance_holddown=600)


class GrayKV:
    """The real client, except that while `gray` is on every range or write touching partition data
    (schedules, executions, checkpoints, ...) fails as a timed-out call would; ownership keys pass."""

    def __init__(self, kv: EtcdClient, ks: Keyspace) -> None:
        self._kv, self.gray = kv, False
        self._control = (ks.owners, ks.members, ks.drains, ks.cluster_config, ks.regions, ks.region_policy)

    def _data(self, key: bytes) -> bool:
        return not any(key.startswith(p) for p in self._control)

    async def range(self, key: Any, **kw: Any) -> Any:
        k = key if isinstance(key, bytes) else str(key).encode()
        if self.gray and self._data(k):
            raise Unavailable("gray link: read timed out")
        return await self._kv.range(key, **kw)

    async def txn(self, compare: Sequence[Compare], success: Sequence[Op] = (), failure: Sequence[Op] = (),
                  **kw: Any) -> Any:
        if self.gray and any(self._data(op.key) for op in (*success, *failure)):
            raise OutcomeUnknown("gray link: write timed out")
        return await self._kv.txn(compare, success, failure, **kw)

    async def put(self, key: Any, value: bytes, **kw: Any) -> Any:
        k = key if isinstance(key, bytes) else str(key).encode()
        if self.gray and self._data(k):
            raise OutcomeUnknown("gray link: write timed out")
        return await self._kv.put(key, value, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kv, name)


@pytest.fixture
async def kv(etcd_server: EtcdCluster) -> AsyncIterator[EtcdClient]:
    async with EtcdClient(etcd_server.config(timeout=0.5)) as c:
        yield c


async def _until(cond: Any, timeout: float) -> bool:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        if cond():
            return True
        await asyncio.sleep(0.05)
    return bool(cond())


async def test_a_node_that_cannot_serve_its_partitions_gives_them_to_a_peer(kv: EtcdClient, key_prefix: str) -> None:
    ks = Keyspace(key_prefix.rstrip("/"))
    gray_kv = GrayKV(kv, ks)
    gray = PlannerNode(gray_kv, ks, COORD, SYSTEM_CLOCK, planner=FAST)
    gray.dispatcher = FakeDispatcher(kv, gray)
    peer = PlannerNode(kv, ks, replace(COORD, node_id="peer"), SYSTEM_CLOCK, planner=FAST)
    peer.dispatcher = FakeDispatcher(kv, peer)
    lost: list[LostReason] = []
    on_lost = gray.on_lost

    def record_lost(partition: int, reason: LostReason) -> None:
        lost.append(reason)
        on_lost(partition, reason)

    gray.on_lost = record_lost  # type: ignore[method-assign]
    t0 = SYSTEM_CLOCK.wall_ms()
    for i in range(8):
        await gray.store.create(sched(i), t0)
    tasks = [asyncio.create_task(gray.run())]
    try:
        assert await _until(lambda: len(gray.ownership.owned) == COORD.partitions, 10), "the gray node claims all"
        tasks.append(asyncio.create_task(peer.run()))
        await asyncio.sleep(1.5)  # the peer has a session (and whatever share the rebalance gives it)
        held = set(gray.ownership.owned)
        assert held, "the gray node still owns partitions when its link turns gray"
        gray_kv.gray = True
        loop = asyncio.get_running_loop()
        cut = loop.time()
        # Given up after resign_after (2 x TTL = 4 s) of failing loads; the revoke frees the partitions.
        moved = await _until(lambda: held <= set(peer.ownership.owned), 15)
        took = loop.time() - cut
        assert moved, (f"the peer owns {sorted(peer.ownership.owned)}; the gray node still holds "
                       f"{sorted(gray.ownership.owned)} of {sorted(held)} with its lease renewed")
        assert gray.ownership.resigned >= 1 and LostReason.UNSERVED in lost
        assert took < COORD.resign_after + 2 * COORD.lease_ttl + 2, f"took {took:.1f} s"
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
