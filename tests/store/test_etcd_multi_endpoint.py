"""Several endpoints: a 3-member cluster keeps serving through the client when a member dies."""

from __future__ import annotations

import asyncio
import time

import pytest

from chaos.infra.etcd import EtcdCluster
from chaos.infra.ports import unused_port
from scheduler.store.etcd import EtcdClient, EtcdError

pytestmark = pytest.mark.etcd


async def _leader_index(etcd: EtcdClient, cluster: EtcdCluster) -> int:
    status = await etcd.status()
    names = {m.id: m.name for m in await etcd.member_list()}
    return [m.name for m in cluster.members].index(names[status.leader])


async def _first_write_after(etcd: EtcdClient, key: str, within: float) -> float:
    """Seconds until a put succeeds. Failures in between are expected while a new leader is elected;
    a put is idempotent here, so the *test* may retry it (the client never does)."""
    started = time.monotonic()
    while True:
        try:
            await etcd.put(key, b"v", timeout=1.0)
            return time.monotonic() - started
        except EtcdError:
            if time.monotonic() - started > within:
                raise
            await asyncio.sleep(0.1)


async def test_three_members_survive_losing_the_leader(etcd_cluster3: EtcdCluster) -> None:
    async with EtcdClient(etcd_cluster3.config(lb_policy="round_robin")) as etcd:
        members = await etcd.member_list()
        assert sorted(m.name for m in members) == ["m0", "m1", "m2"]
        await etcd.put("/c/before", b"1")
        leader = await _leader_index(etcd, etcd_cluster3)
        etcd_cluster3.kill(leader)

        recovery = await _first_write_after(etcd, "/c/after-kill", within=10.0)
        assert recovery < 10.0
        for i in range(20):  # steady state: every write succeeds on the two survivors
            await etcd.put(f"/c/{i}", b"x", timeout=2.0)
        assert (await etcd.range("/c/", prefix=True)).count == 22
        new_leader = await _leader_index(etcd, etcd_cluster3)
        assert new_leader != leader

        etcd_cluster3.restart(leader)  # same data dir: it rejoins and catches up
        kv = await etcd.get("/c/19", serializable=True)
        assert kv is not None


async def test_pick_first_fails_over_past_a_dead_endpoint(etcd_cluster3: EtcdCluster) -> None:
    with unused_port() as nobody:  # nothing listens here, and nothing can start to during the test
        dead = f"127.0.0.1:{nobody}"
        config = etcd_cluster3.config(endpoints=(dead, *etcd_cluster3.endpoints), lb_policy="pick_first")
        async with EtcdClient(config) as etcd:
            await etcd.put("/p/k", b"1", timeout=5.0)
            etcd_cluster3.stop(0)  # SIGTERM the member pick_first settled on (the first live one in order)
            await _first_write_after(etcd, "/p/k", within=10.0)
            kv = await etcd.get("/p/k")
            assert kv is not None

