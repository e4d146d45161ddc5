"""The wire witness (chaos/wire.py) on real etcd traffic: a fenced txn with a stale token, sent through a
forwarder that feeds the witness, is seen with etcd's refusal; an ordinary fenced write is seen as
succeeded; other traffic (puts, ranges, watches, leases) is ignored."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from chaos.infra.etcd import EtcdFactory
from chaos.wire import FencedTxn, WireWitness
from scheduler.clock import SYSTEM_CLOCK
from scheduler.errors import FencedOut
from scheduler.store.etcd import EtcdClient
from scheduler.store.etcd.ops import put
from scheduler.store.fenced import Fence, fenced_txn

pytestmark = pytest.mark.etcd

OWNERS = b"/w/owners/"


@contextlib.asynccontextmanager
async def forwarder(upstream: str, witness: WireWitness) -> AsyncIterator[str]:
    host, _, port = upstream.rpartition(":")
    tasks: set[asyncio.Task[None]] = set()

    async def pump(r: asyncio.StreamReader, w: asyncio.StreamWriter, feed: object) -> None:
        try:
            while data := await r.read(65536):
                feed(data)  # type: ignore[operator]
                w.write(data)
                await w.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            w.close()

    async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        ur, uw = await asyncio.open_connection(host, int(port))
        for t in (pump(cr, uw, witness.client_bytes), pump(ur, cw, witness.server_bytes)):
            task = asyncio.create_task(t)
            tasks.add(task)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_stale_fenced_write_is_seen_refused_on_the_wire(etcd_factory: EtcdFactory) -> None:
    etcd = etcd_factory()
    seen: list[FencedTxn] = []
    witness = WireWitness("p1", OWNERS, seen.append, SYSTEM_CLOCK.wall_ms)
    async with forwarder(etcd.endpoints[0], witness) as address, \
            EtcdClient(etcd.config(endpoints=(address,), timeout=3.0)) as kv:
        key = OWNERS + b"3"
        claim = await kv.txn([], [put(key, b'{"node":"p1"}')])
        token = claim.header.revision
        fence = Fence(3, key, token)
        await fenced_txn(kv, fence, [put(b"/w/checkpoints/3", b"1")])  # ours: succeeds
        await kv.put(b"/w/other", b"x")  # not fenced: ignored
        await kv.delete(key)
        await kv.put(key, b'{"node":"p2"}')  # a new owner: the old token is stale
        with pytest.raises(FencedOut):
            await fenced_txn(kv, fence, [put(b"/w/checkpoints/3", b"2")])
        for _ in range(50):
            if len(seen) >= 2:
                break
            await asyncio.sleep(0.02)
    assert [(t.succeeded, t.refused_by_fence, t.token) for t in seen] == [(True, False, token), (False, True, token)]
    stale = seen[1]
    assert stale.partition_key == (OWNERS + b"3").decode() and stale.owner_revision > token and stale.writes == 1
    assert stale.answered_ms >= stale.sent_ms


async def test_only_an_owners_writes_count_for_the_nemeses_that_act_at_a_write(etcd_factory: EtcdFactory) -> None:
    """F1 `at = write` and F2 beyond the TTL act at the planner's next write as an owner (`owned_writes`).
    A write an API call or a result makes is not fenced, so freezing a planner on one lands no stale write
    (a game day's F2 froze on a resume's schedule write and its run was invalid for want of a refusal)."""
    etcd = etcd_factory()
    witness = WireWitness("p1", OWNERS, lambda t: None, SYSTEM_CLOCK.wall_ms)
    async with forwarder(etcd.endpoints[0], witness) as address, \
            EtcdClient(etcd.config(endpoints=(address,), timeout=3.0)) as kv:
        key = OWNERS + b"5"
        claim = await kv.txn([], [put(key, b'{"node":"p1"}')])
        await kv.txn([], [put(b"/w/schedules/00005/s1", b"{}")])  # an API update: a write, not an owner's
        await kv.put(b"/w/audit/1-p1-000001", b"{}")
        assert (witness.writes, witness.owned_writes) == (2, 0)
        await fenced_txn(kv, Fence(5, key, claim.header.revision), [put(b"/w/checkpoints/5", b"1")])
        await kv.txn([], [put(b"/w/checkpoints/6", b"1")])  # an owner's write with its fence switched off
    assert (witness.writes, witness.owned_writes) == (4, 2)
