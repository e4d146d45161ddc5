"""A SIGSTOPped etcd follower under a planner-like load: the client's outlier ejection leaves it out of the
rotation (scheduler/store/etcd/connection.py). Compares both configurations on one 3-member cluster, so it runs
alone (the serial phase): it holds a ratio against the machine's speed, and its load slowed the tests beside it."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from chaos.infra.etcd import EtcdCluster
from scheduler.store.etcd import EtcdClient, EtcdError
from tests.store.test_etcd_multi_endpoint import _leader_index

pytestmark = pytest.mark.etcd


async def _paused_follower_load(cluster: EtcdCluster, eject: bool, pause_s: float = 5.0) -> tuple[int, int]:
    """(calls ok, calls failed) of 8 put loops (0.4 s deadlines) while a follower is SIGSTOPped."""
    async with EtcdClient(replace(cluster.config(timeout=0.4), eject_failing=eject)) as etcd:
        leader = await _leader_index(etcd, cluster)
        follower = next(i for i in range(3) if i != leader)
        counts = [0, 0]
        paused = asyncio.Event()
        done = False

        async def loop(i: int) -> None:
            while not done:
                try:
                    await etcd.put(f"/pause/{i}", b"v", timeout=0.4)
                    counts[0] += paused.is_set()
                except EtcdError:
                    counts[1] += paused.is_set()
                # Paced: the comparison needs no more, and at full speed 8 loops took a core for 14 s.
                await asyncio.sleep(0.02)

        tasks = [asyncio.create_task(loop(i)) for i in range(8)]
        await asyncio.sleep(1.0)
        cluster.pause(follower)
        paused.set()
        try:
            await asyncio.sleep(pause_s)
        finally:
            cluster.resume(follower)
            done = True
            await asyncio.gather(*tasks)
        return counts[0], counts[1]


async def test_a_paused_follower_is_left_out_of_the_rotation(etcd_cluster3: EtcdCluster) -> None:
    """A SIGSTOPped member keeps its connections up, so round robin went on sending it a share of the calls,
    each failing at its deadline, until gRPC's keepalive gave up on it (a game day's F4 of one member stopped
    every planner for the whole pause). With outlier ejection (the default) it is left out after its first
    failures. Both measured here, one after the other on the same cluster."""
    plain_ok, plain_failed = await _paused_follower_load(etcd_cluster3, eject=False)
    await asyncio.sleep(2.0)  # the member caught up
    ejected_ok, ejected_failed = await _paused_follower_load(etcd_cluster3, eject=True)
    assert ejected_failed * 2 < plain_failed, (plain_ok, plain_failed, ejected_ok, ejected_failed)
    assert ejected_ok > 2 * plain_ok, (plain_ok, plain_failed, ejected_ok, ejected_failed)
