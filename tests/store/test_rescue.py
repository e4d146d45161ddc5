"""A partition whose planner does not claim it is taken by a peer, without claim/release ping-pong. Real etcd,
two Ownership loops in one process and a third member that registered and then never claims (the game day's
F10: a flapping planner whose session kept re-joining behind a flaky link left its share free 4.5 s while its
peers, at their own share, waited)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from chaos.infra.etcd import EtcdCluster
from scheduler.clock import SYSTEM_CLOCK
from scheduler.config import CoordinationSettings
from scheduler.planner.ownership import MemberInfo, Ownership
from scheduler.store.etcd import EtcdClient
from scheduler.store.fenced import Fence
from scheduler.store.keyspace import Keyspace
from tests.store.test_unserved_resign import _until

pytestmark = pytest.mark.etcd

COORD = CoordinationSettings(lease_ttl=2, renew_interval=0.5, rpc_timeout=0.4, safety_margin=0.3, partitions=6,
                             rebalance_holddown=0.0, orphan_grace=0.8, rescue_hold=2.0)


class Claims:
    """Every acquisition, with when it happened: the ping-pong measure."""

    def __init__(self) -> None:
        self.acquired: list[tuple[float, int]] = []

    def on_acquired(self, fence: Fence) -> None:
        self.acquired.append((asyncio.get_running_loop().time(), fence.partition))

    def on_lost(self, partition: int, reason: object) -> None:
        pass


@pytest.fixture
async def kv(etcd_server: EtcdCluster) -> AsyncIterator[EtcdClient]:
    async with EtcdClient(etcd_server.config(timeout=0.4)) as c:
        yield c


async def test_a_share_its_planner_never_claims_is_served_by_a_peer(kv: EtcdClient, key_prefix: str) -> None:
    ks = Keyspace(key_prefix.rstrip("/"))
    # The deaf member: registered under a live lease (so every peer counts it in the shares), never claims.
    lease = await kv.lease_grant(30)
    deaf = MemberInfo("c-deaf", COORD.region, "127.0.0.1:1", SYSTEM_CLOCK.wall_ms())
    await kv.put(ks.member("c-deaf"), deaf.encode(), lease=lease.id)
    claims = Claims()
    a = Ownership(kv, ks, replace(COORD, node_id="a"), SYSTEM_CLOCK, listener=claims)
    b = Ownership(kv, ks, replace(COORD, node_id="b"), SYSTEM_CLOCK, listener=claims)
    tasks = [asyncio.create_task(a.run()), asyncio.create_task(b.run())]
    loop = asyncio.get_running_loop()
    try:
        t0 = loop.time()
        # Shares are 2 each; the deaf member's 2 are free until a peer's orphan grace runs out.
        everything = await _until(lambda: len(a.owned) + len(b.owned) == COORD.partitions, 10)
        took = loop.time() - t0
        assert everything, f"a {sorted(a.owned)}, b {sorted(b.owned)}: the deaf member's share stays free"
        assert set(a.owned).isdisjoint(b.owned)
        assert a.rescues + b.rescues >= 2
        assert took < COORD.orphan_after + 3, f"took {took:.1f} s"
        # Over several rescue holds: each rescued partition goes back (released to its planner, who does
        # not claim it) and is rescued again at most once per hold plus grace, never round after round.
        start = len(claims.acquired)
        window = 4 * COORD.rescue_hold
        served = samples = 0
        end = loop.time() + window
        while loop.time() < end:
            served += len(a.owned) + len(b.owned)
            samples += 1
            await asyncio.sleep(0.05)
        later = claims.acquired[start:]
        per_cycle = COORD.rescue_hold + COORD.orphan_after
        bound = 2 * (int(window / per_cycle) + 1)  # the deaf member's two partitions
        assert len(later) <= bound, f"{len(later)} claims in {window:.0f} s (bound {bound}): ping-pong"
        # And the planners' own shares never moved: only the deaf member's partitions changed hands.
        moved = {p for _, p in later}
        assert len(moved) <= 2, f"partitions that changed hands: {sorted(moved)}"
        # Each cycle leaves a released partition free about a grace: owned the rest of the time.
        share = served / (samples * COORD.partitions)
        floor = 1 - 2 * (COORD.orphan_after + 0.5) / (COORD.partitions * per_cycle)
        assert share >= floor, f"partitions owned {share:.0%} of the time (floor {floor:.0%})"
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await kv.lease_revoke(lease.id)


async def test_without_a_deaf_member_nothing_is_rescued(kv: EtcdClient, key_prefix: str) -> None:
    """Two healthy planners: an even split and no rescue, however long they run past the grace."""
    ks = Keyspace(key_prefix.rstrip("/"))
    a = Ownership(kv, ks, replace(COORD, node_id="a"), SYSTEM_CLOCK)
    b = Ownership(kv, ks, replace(COORD, node_id="b"), SYSTEM_CLOCK)
    tasks = [asyncio.create_task(a.run()), asyncio.create_task(b.run())]
    try:
        assert await _until(lambda: len(a.owned) == 3 and len(b.owned) == 3, 10)
        await asyncio.sleep(2 * COORD.orphan_after + 0.5)
        assert (len(a.owned), len(b.owned)) == (3, 3)
        assert a.rescues == b.rescues == 0
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
