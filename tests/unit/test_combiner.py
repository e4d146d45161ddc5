"""The write combiner against the in-memory twin: batches of several partitions share one txn, and
one stale fence fails only its own batch."""

from __future__ import annotations

import asyncio

import pytest

from scheduler.errors import FencedOut
from scheduler.store.combiner import WriteCombiner
from scheduler.store.etcd.ops import Compare, put
from scheduler.store.fenced import Fence
from scheduler.store.memory import MemoryKV


async def claim(kv: MemoryKV, key: bytes) -> int:
    r = await kv.txn([Compare.create_revision(key, "==", 0)], [put(key, b"me")])
    return r.revision


async def test_batches_of_many_partitions_share_one_txn() -> None:
    kv = MemoryKV()
    fences = [Fence(p, f"/o/{p}".encode(), await claim(kv, f"/o/{p}".encode())) for p in range(10)]
    c = WriteCombiner(kv)
    results = await asyncio.gather(*(c.submit(f, [put(f"/d/{f.partition}/{i}", b"v") for i in range(5)])
                                     for f in fences))
    assert c.txns == 1
    assert c.batches == 10
    assert all(len(r) == 1 and len(r[0].responses) == 5 for r in results)
    assert (await kv.range(b"/d/", prefix=True, count_only=True)).count == 50


async def test_a_stale_fence_fails_only_its_own_batch() -> None:
    kv = MemoryKV()
    good = Fence(0, b"/o/0", await claim(kv, b"/o/0"))
    stale = Fence(1, b"/o/1", await claim(kv, b"/o/1"))
    await kv.delete(b"/o/1")
    await claim(kv, b"/o/1")  # taken over: `stale` no longer holds
    c = WriteCombiner(kv)
    ok, bad = await asyncio.gather(c.submit(good, [put(b"/d/0", b"v")]), c.submit(stale, [put(b"/d/1", b"v")]),
                                   return_exceptions=True)
    assert not isinstance(ok, BaseException)
    assert isinstance(bad, FencedOut)
    assert await kv.get(b"/d/0") is not None
    assert await kv.get(b"/d/1") is None, "the stale batch must not land with its neighbour's txn"


async def test_too_big_for_sharing_goes_alone() -> None:
    kv = MemoryKV()
    f = Fence(0, b"/o/0", await claim(kv, b"/o/0"))
    c = WriteCombiner(kv, max_ops=10)
    rs = await c.submit(f, [put(f"/d/{i}", b"v") for i in range(25)])
    assert len(rs) == 3  # split under the op limit, each chunk fenced


@pytest.mark.parametrize("n", [1, 3])
async def test_results_map_back_in_order(n: int) -> None:
    kv = MemoryKV()
    fs = [Fence(p, f"/o/{p}".encode(), await claim(kv, f"/o/{p}".encode())) for p in range(n)]
    c = WriteCombiner(kv)
    batches = [[put(f"/d/{f.partition}/{i}", b"v") for i in range(f.partition + 1)] for f in fs]
    rs = await asyncio.gather(*(c.submit(f, ops) for f, ops in zip(fs, batches, strict=True)))
    assert [len(r[0].responses) for r in rs] == [p + 1 for p in range(n)]
