"""A watch stream on a SIGSTOPped etcd member: the watcher notices the silence and re-opens the stream elsewhere
(scheduler/store/etcd/watch.py, the stall guard). Without it a planner's schedules, notices and owners watches
waited for gRPC's keepalive (10 + 5 s) while every change meanwhile stayed unseen. Serial phase: it pauses a
member of a cluster and holds a bound against the keepalive's 15 s."""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.request
from dataclasses import replace

import pytest

from chaos.infra.etcd import EtcdCluster
from scheduler.store.etcd import EtcdClient, EtcdError
from scheduler.store.etcd.watch import Watcher
from tests.store.test_etcd_multi_endpoint import _leader_index

pytestmark = pytest.mark.etcd

_KEEPALIVE_S = 15.0  # what the stream waited before: keepalive_time 10 s + keepalive_timeout 5 s


def _watch_streams(cluster: EtcdCluster, i: int) -> int:
    """The member's count of open watch streams, from its metrics (which member a stream went to is gRPC's pick)."""
    url = f"http://{cluster.members[i].endpoint}/metrics"
    with urllib.request.urlopen(url, timeout=2.0) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("etcd_debugging_mvcc_watch_stream_total "):
                return int(float(line.split()[1]))
    raise AssertionError("etcd_debugging_mvcc_watch_stream_total is not among the member's metrics")


async def _open_on_a_follower(etcd: EtcdClient, cluster: EtcdCluster, leader: int) -> tuple[Watcher, int]:
    """A watch whose stream went to a follower (pausing the leader would stop the writes as well)."""
    for n in range(12):
        rev = (await etcd.put(f"/stall/{n}/first", b"v")).revision
        watcher = etcd.watch(f"/stall/{n}/", prefix=True, start_revision=rev)
        batch = await asyncio.wait_for(watcher.__anext__(), 5.0)
        assert batch.events, "the first batch of a fresh watch is the put"
        hosts = [i for i in range(3) if await asyncio.to_thread(_watch_streams, cluster, i) > 0]
        assert len(hosts) == 1, hosts
        if hosts[0] != leader:
            return watcher, hosts[0]
        await watcher.close()
    raise AssertionError("twelve watches in a row went to the leader")


async def _delivery_while_paused(cluster: EtcdCluster, stall_timeout: float) -> tuple[float | None, int]:
    """Seconds from a put to its event on a watch whose member is SIGSTOPped (None: not within the keepalive's
    15 s), and how many streams the watcher dropped for silence."""
    config = replace(cluster.config(timeout=0.4), watch_stall_timeout=stall_timeout)
    async with EtcdClient(config) as etcd:
        leader = await _leader_index(etcd, cluster)
        watcher, host = await _open_on_a_follower(etcd, cluster, leader)
        # The change is made through the leader alone: a round robin writer could pick the paused member.
        writer = EtcdClient(replace(cluster.config(timeout=2.0), endpoints=(cluster.members[leader].endpoint,)))
        prefix = watcher._key.decode()
        done = False

        async def reads() -> None:
            # A planner's unary traffic on the same client (a few calls in flight): it gets the paused member
            # ejected, so that the re-opened stream goes elsewhere. One call at a time would not: a member must
            # fail two calls within the ejection's half-second interval.
            while not done:
                with contextlib.suppress(EtcdError):
                    await etcd.get(prefix + "first", timeout=0.3)
                await asyncio.sleep(0.01)

        readers = [asyncio.create_task(reads()) for _ in range(4)]
        cluster.pause(host)
        try:
            await asyncio.sleep(0.5)
            await writer.put(prefix + "second", b"v")
            put_at = time.monotonic()
            try:
                while True:
                    batch = await asyncio.wait_for(watcher.__anext__(), _KEEPALIVE_S - 1 - (time.monotonic() - put_at))
                    if any(ev.kv.key.endswith(b"/second") for ev in batch.events):
                        return time.monotonic() - put_at, watcher.stalls
            except TimeoutError:
                return None, watcher.stalls
        finally:
            cluster.resume(host)
            done = True
            await asyncio.gather(*readers)
            await watcher.close()
            await writer.close()


async def test_a_watch_on_a_paused_member_is_reopened_elsewhere(etcd_cluster3: EtcdCluster) -> None:
    """The watch's member is stopped (its connection stays up); a change made meanwhile reaches the watcher within
    a few stall timeouts, not at the keepalive's 15 s, and nothing is lost (the stream resumes from its revision)."""
    took, stalls = await _delivery_while_paused(etcd_cluster3, stall_timeout=2.0)
    assert took is not None, "the event did not arrive while the member was paused"
    assert stalls >= 1
    assert took < 8.0, took


async def test_a_quiet_healthy_watch_is_not_dropped(etcd_server: EtcdCluster) -> None:
    """The guard's progress requests are answered on a healthy idle stream: no stream is dropped for silence."""
    async with EtcdClient(etcd_server.config(watch_stall_timeout=0.4)) as etcd:
        rev = (await etcd.put("/quiet/a", b"v")).revision
        watcher = etcd.watch("/quiet/", prefix=True, start_revision=rev)
        seen: list[bytes] = []

        async def read() -> None:
            async for batch in watcher:
                seen.extend(ev.kv.key for ev in batch.events)

        task = asyncio.create_task(read())
        await asyncio.sleep(3.0)  # 15 of the guard's half-timeouts
        await etcd.put("/quiet/b", b"v")
        await asyncio.sleep(0.5)
        await watcher.close()
        await task
        assert seen == [b"/quiet/a", b"/quiet/b"]
        assert watcher.stalls == 0 and watcher.reconnects == 0
