"""Coordination primitives against a real etcd: fenced writes, checkpoints, prefix caches, sessions,
and in-process ownership (the process drills are in tests/integration/)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from chaos.infra.etcd import EtcdCluster, EtcdFactory
from scheduler.clock import FakeClock
from scheduler.config import CoordinationSettings
from scheduler.errors import FencedOut
from scheduler.planner.ownership import ClusterMismatch, LostReason, Ownership
from scheduler.store.cache import PrefixCache
from scheduler.store.checkpoint import WatermarkRegression, advance, read_checkpoint
from scheduler.store.etcd import EtcdClient
from scheduler.store.etcd.ops import Compare, PutOp, delete, put
from scheduler.store.fenced import CompareFailed, Fence, FenceStats, fenced_txn, split_ops
from scheduler.store.keyspace import Keyspace
from scheduler.store.session import Session

pytestmark = pytest.mark.etcd

# No rebalance hold-down: these tests run FakeClocks that never advance on their own, and start their planners
# in a race (tests/store/test_drain.py shows the hold-down with a clock it moves).
FAST = CoordinationSettings(lease_ttl=2, renew_interval=0.5, rpc_timeout=0.4, safety_margin=0.3, partitions=8,
                            rebalance_holddown=0.0)


async def claim(kv: EtcdClient, key: bytes, who: str) -> int:
    r = await kv.txn([Compare.create_revision(key, "==", 0)], [put(key, who.encode())])
    assert r.succeeded
    return r.revision


async def test_fenced_write_lands_while_the_claim_is_current(etcd_client: EtcdClient, key_prefix: str) -> None:
    owner = f"{key_prefix}owner".encode()
    token = await claim(etcd_client, owner, "a")
    await fenced_txn(etcd_client, Fence(0, owner, token), [put(f"{key_prefix}x", b"1")])
    assert (await etcd_client.get(f"{key_prefix}x")) is not None


async def test_stale_token_is_fenced_out_and_nothing_lands(etcd_client: EtcdClient, key_prefix: str) -> None:
    owner = f"{key_prefix}owner".encode()
    old = await claim(etcd_client, owner, "a")
    await etcd_client.delete(owner)  # the lease expired...
    await claim(etcd_client, owner, "b")  # ...and someone else claimed it
    stats = FenceStats()
    with pytest.raises(FencedOut, match="stale"):
        await fenced_txn(etcd_client, Fence(0, owner, old), [put(f"{key_prefix}x", b"stale")], stats=stats)
    assert stats.fenced_out == 1
    assert (await etcd_client.get(f"{key_prefix}x")) is None


async def test_disabled_fencing_lets_the_stale_write_land(etcd_client: EtcdClient, key_prefix: str) -> None:
    """The switch the drills use to show that the checker can fail."""
    owner = f"{key_prefix}owner".encode()
    old = await claim(etcd_client, owner, "a")
    await etcd_client.delete(owner)
    await claim(etcd_client, owner, "b")
    await fenced_txn(etcd_client, Fence(0, owner, old), [put(f"{key_prefix}x", b"stale")], disable_fencing=True)
    assert (await etcd_client.get(f"{key_prefix}x")) is not None


async def test_large_batches_are_split_under_etcd_limits(etcd_client: EtcdClient, key_prefix: str) -> None:
    owner = f"{key_prefix}owner".encode()
    token = await claim(etcd_client, owner, "a")
    ops = [put(f"{key_prefix}k{i:04d}", b"v" * 100) for i in range(300)]
    results = await fenced_txn(etcd_client, Fence(0, owner, token), ops, max_ops=128)
    assert len(results) == 3
    r = await etcd_client.range(key_prefix + "k", prefix=True, count_only=True)
    assert r.count == 300


def test_split_respects_bytes_too() -> None:
    ops = [put(f"k{i}", b"x" * 400) for i in range(10)]
    chunks = split_ops(ops, max_ops=128, max_bytes=1000)
    assert all(sum(len(op.value) for op in c if isinstance(op, PutOp)) <= 1000 for c in chunks)
    assert [op for c in chunks for op in c] == ops


async def test_own_compare_failure_is_not_fenced_out(etcd_client: EtcdClient, key_prefix: str) -> None:
    owner = f"{key_prefix}owner".encode()
    token = await claim(etcd_client, owner, "a")
    with pytest.raises(CompareFailed):
        await fenced_txn(etcd_client, Fence(0, owner, token), [put(f"{key_prefix}x", b"1")],
                         compares=[Compare.version(f"{key_prefix}x", "==", 5)])


async def test_checkpoint_never_moves_backwards(etcd_client: EtcdClient, key_prefix: str) -> None:
    ks = Keyspace(key_prefix.rstrip("/"))
    token = await claim(etcd_client, ks.owner(3), "a")
    fence = Fence(3, ks.owner(3), token)
    ck = await read_checkpoint(etcd_client, ks, 3)
    assert ck.watermark_ms == 0
    compares, ops, new = advance(ks, ck, 1000, "a", token)
    rs = await fenced_txn(etcd_client, fence, ops, compares=compares)
    ck = replace(new, mod_revision=rs[-1].revision)
    assert (await read_checkpoint(etcd_client, ks, 3)).watermark_ms == 1000
    with pytest.raises(WatermarkRegression):
        advance(ks, ck, 999, "a", token)
    # A writer that did not see the latest checkpoint cannot overwrite it, even going forward.
    stale = replace(ck, mod_revision=ck.mod_revision - 1)
    compares, ops, _ = advance(ks, stale, 5000, "a", token)
    with pytest.raises(CompareFailed):
        await fenced_txn(etcd_client, fence, ops, compares=compares)
    assert (await read_checkpoint(etcd_client, ks, 3)).watermark_ms == 1000


async def test_prefix_cache_follows_changes(etcd_client: EtcdClient, key_prefix: str) -> None:
    cache = PrefixCache(etcd_client, key_prefix.encode())
    task = asyncio.create_task(cache.run())
    try:
        await asyncio.wait_for(cache.synced.wait(), 5)
        await etcd_client.put(f"{key_prefix}a", b"1")
        await etcd_client.put(f"{key_prefix}b", b"2")
        await etcd_client.delete(f"{key_prefix}a")
        r = await etcd_client.put(f"{key_prefix}c", b"3")
        async with asyncio.timeout(5):
            while cache.revision < r.revision:
                cache.changed.clear()
                await cache.changed.wait()
        assert sorted(cache.items) == [f"{key_prefix}b".encode(), f"{key_prefix}c".encode()]
    finally:
        task.cancel()


async def test_prefix_cache_relists_after_compaction(etcd_factory: EtcdFactory) -> None:
    server = etcd_factory()
    async with EtcdClient(server.config()) as kv:
        cache = PrefixCache(kv, b"/p/")
        await kv.put(b"/p/a", b"1")
        # Simulate a watcher that fell behind: list at an old revision, then compact past it.
        old = (await kv.put(b"/other", b"x")).revision
        for i in range(5):
            await kv.put(f"/p/k{i}", b"v")
        head = (await kv.put(b"/other", b"y")).revision
        await kv.compact(head)
        cache.revision = old - 3  # what run() would use as its resume point after a long disconnect
        task = asyncio.create_task(cache.run())
        try:
            await asyncio.wait_for(cache.synced.wait(), 5)
            assert len(cache.items) == 6
            assert cache.revision >= head
        finally:
            task.cancel()


@pytest.fixture
async def fast_client(etcd_server: EtcdCluster) -> AsyncIterator[EtcdClient]:
    async with EtcdClient(etcd_server.config(timeout=0.4)) as kv:
        yield kv


async def test_session_self_fences_on_the_local_clock(etcd_server: EtcdCluster) -> None:
    """The deadline passes on our monotonic clock without any word from etcd: fenced()."""
    now = [1000.0]
    async with EtcdClient(etcd_server.config(timeout=0.4), clock=lambda: now[0]) as kv:
        session = Session(kv, FAST)
        await session.start()
        try:
            assert not session.fenced()
            assert session.deadline() <= 1000.0 + FAST.lease_ttl - FAST.safety_margin
            now[0] += FAST.lease_ttl  # a long pause: renewals could not have been acknowledged in time
            assert session.fenced()
        finally:
            await session.close()


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, int, str]] = []

    def on_acquired(self, fence: Fence) -> None:
        self.events.append(("acquired", fence.partition, str(fence.token)))

    def on_lost(self, partition: int, reason: LostReason) -> None:
        self.events.append(("lost", partition, reason.value))


async def wait_until(cond: object, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():  # type: ignore[operator]
            await asyncio.sleep(0.05)


async def test_two_owners_split_then_one_takes_over(fast_client: EtcdClient, key_prefix: str) -> None:
    ks = Keyspace(key_prefix.rstrip("/"))
    clock = FakeClock()
    a_rec, b_rec = Recorder(), Recorder()
    a = Ownership(fast_client, ks, replace(FAST, node_id="a"), clock, listener=a_rec)
    b = Ownership(fast_client, ks, replace(FAST, node_id="b"), clock, listener=b_rec)
    ta = asyncio.create_task(a.run())
    tb = asyncio.create_task(b.run())
    try:
        await wait_until(lambda: len(a.owned) == 4 and len(b.owned) == 4)
        assert set(a.owned).isdisjoint(b.owned)
        ta.cancel()  # a stops: its lease is revoked on the way out
        await asyncio.gather(ta, return_exceptions=True)
        await wait_until(lambda: len(b.owned) == 8)
        owners = await fast_client.range(ks.owners, prefix=True)
        assert {json.loads(kv.value)["node"] for kv in owners.kvs} == {"b"}
        assert ("lost", next(iter(b.owned)), "released") not in b_rec.events
    finally:
        for t in (ta, tb):
            t.cancel()
        await asyncio.gather(ta, tb, return_exceptions=True)


async def test_owner_key_deleted_under_us_drops_the_partition(fast_client: EtcdClient, key_prefix: str) -> None:
    ks = Keyspace(key_prefix.rstrip("/"))
    rec = Recorder()
    a = Ownership(fast_client, ks, replace(FAST, node_id="a", partitions=2), FakeClock(), listener=rec)
    t = asyncio.create_task(a.run())
    try:
        await wait_until(lambda: len(a.owned) == 2)
        token = a.owned[0].token
        await fast_client.delete(ks.owner(0))
        await wait_until(lambda: ("lost", 0, "owner_changed") in rec.events)
        await wait_until(lambda: 0 in a.owned and a.owned[0].token > token)  # and claims it again
    finally:
        t.cancel()
        await asyncio.gather(t, return_exceptions=True)


async def test_refuses_a_different_partition_count(fast_client: EtcdClient, key_prefix: str) -> None:
    ks = Keyspace(key_prefix.rstrip("/"))
    await Ownership(fast_client, ks, FAST, FakeClock()).ensure_cluster()
    with pytest.raises(ClusterMismatch, match="initialised with 8 partitions"):
        await Ownership(fast_client, ks, replace(FAST, partitions=16), FakeClock()).ensure_cluster()


async def test_release_waits_for_in_flight_writes(fast_client: EtcdClient, key_prefix: str) -> None:
    ks = Keyspace(key_prefix.rstrip("/"))
    a = Ownership(fast_client, ks, replace(FAST, node_id="a", partitions=1), FakeClock())
    t = asyncio.create_task(a.run())
    try:
        await wait_until(lambda: 0 in a.owned)
        async with a.writing(0) as fence:
            drain = asyncio.create_task(a.drain())
            await asyncio.sleep(0.3)
            assert 0 in a.owned, "released while a write was in flight"
            assert a.fence(0) is None, "a releasing partition takes no new writes"
            await fenced_txn(fast_client, fence, [put(f"{key_prefix}w", b"1")])
        await asyncio.wait_for(drain, 5)
        assert await fast_client.get(ks.owner(0)) is None
    finally:
        t.cancel()
        await asyncio.gather(t, return_exceptions=True)


async def test_a_planned_release_waits_for_the_starts_it_dispatched_within_a_bound(fast_client: EtcdClient,
                                                                                   key_prefix: str) -> None:
    """A start is recorded only under the dispatching owner's claim: the release keeps the claim until the
    node says nothing it dispatched still waits for its start, and no longer than `release_settle_s`."""
    ks = Keyspace(key_prefix.rstrip("/"))
    a = Ownership(fast_client, ks, replace(FAST, node_id="a", partitions=2), FakeClock())
    started = asyncio.Event()
    asked: list[int] = []

    async def settle(partition: int) -> None:
        asked.append(partition)
        if partition == 0:
            await started.wait()  # partition 0: its start arrives; partition 1: never (the bound ends it)
        else:
            await asyncio.sleep(60)

    a.release_settle, a.release_settle_s = settle, 1.0
    t = asyncio.create_task(a.run())
    try:
        await wait_until(lambda: len(a.owned) == 2)
        drain = asyncio.create_task(a.drain())
        await asyncio.sleep(0.4)
        assert await fast_client.get(ks.owner(0)) is not None, "released before its dispatch had started"
        assert a.fence(0) is None, "a releasing partition takes no new writes"
        started.set()
        await asyncio.wait_for(drain, 5)
        assert await fast_client.get(ks.owner(0)) is None and await fast_client.get(ks.owner(1)) is None
        assert sorted(asked) == [0, 1]
    finally:
        t.cancel()
        await asyncio.gather(t, return_exceptions=True)


async def test_deleting_someone_elses_claim_is_impossible_on_release(fast_client: EtcdClient, key_prefix: str) -> None:
    ks = Keyspace(key_prefix.rstrip("/"))
    mine = await claim(fast_client, ks.owner(0), "a")
    await fast_client.delete(ks.owner(0))
    await claim(fast_client, ks.owner(0), "b")
    r = await fast_client.txn([Compare.create_revision(ks.owner(0), "==", mine)], [delete(ks.owner(0))])
    assert not r.succeeded
    assert await fast_client.get(ks.owner(0)) is not None


async def test_nested_txns_create_only_if_absent_under_one_fence(etcd_client: EtcdClient, key_prefix: str) -> None:
    """The execution ledger's pattern: one fenced batch, each record created only if absent, so a
    duplicate is skipped without failing the batch and never overwritten."""
    from scheduler.store.etcd.ops import TxnOp, txn

    owner = f"{key_prefix}owner".encode()
    token = await claim(etcd_client, owner, "a")
    await etcd_client.put(f"{key_prefix}e1", b"first")
    ops: list[TxnOp] = [
        txn([Compare.create_revision(f"{key_prefix}e{i}", "==", 0)], [put(f"{key_prefix}e{i}", b"second")])
        for i in range(127)
    ]
    (r,) = await fenced_txn(etcd_client, Fence(0, owner, token), ops)
    created = [getattr(x, "succeeded", None) for x in r.responses]
    assert created[1] is False
    assert created.count(True) == 126
    got = await etcd_client.get(f"{key_prefix}e1")
    assert got is not None
    assert got.value == b"first"
