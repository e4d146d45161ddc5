"""Watch: history replay, filters, progress notifications, compaction, resume across an etcd restart."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from chaos.infra.etcd import EtcdFactory
from scheduler.store.etcd import (
    Compacted,
    EtcdClient,
    EventType,
    WatchBatch,
    Watcher,
    WatchEvent,
    WatchFilter,
)

pytestmark = pytest.mark.etcd


async def _events(watcher: Watcher, n: int, within: float = 5.0) -> list[WatchEvent]:
    """The next n events (progress notifications skipped)."""
    got: list[WatchEvent] = []

    async def collect() -> None:
        async for batch in watcher:
            got.extend(batch.events)
            if len(got) >= n:
                return

    await asyncio.wait_for(collect(), within)
    return got


async def _next_progress(watcher: Watcher, within: float = 5.0) -> WatchBatch:
    async def find() -> WatchBatch:
        async for batch in watcher:
            if batch.is_progress:
                return batch
        raise AssertionError("watch ended")

    return await asyncio.wait_for(find(), within)


async def test_watch_from_a_past_revision_replays_history(etcd_client: EtcdClient, key_prefix: str) -> None:
    first = await etcd_client.put(f"{key_prefix}a", b"1")
    await etcd_client.put(f"{key_prefix}b", b"2")
    await etcd_client.put(f"{key_prefix}a", b"3")
    await etcd_client.delete(f"{key_prefix}b")
    await etcd_client.put("/elsewhere", b"x")  # outside the prefix: not delivered
    async with etcd_client.watch(key_prefix, prefix=True, start_revision=first.revision, prev_kv=True) as w:
        events = await _events(w, 4)
        assert [(e.type, e.kv.key[-1:], e.kv.value) for e in events] == [
            (EventType.PUT, b"a", b"1"),
            (EventType.PUT, b"b", b"2"),
            (EventType.PUT, b"a", b"3"),
            (EventType.DELETE, b"b", b""),
        ]
        revisions = [e.revision for e in events]
        assert revisions == sorted(revisions)
        assert revisions[0] == first.revision
        assert events[2].prev_kv is not None
        assert events[2].prev_kv.value == b"1"
        assert events[3].prev_kv is not None
        assert events[3].prev_kv.value == b"2"
        assert w.revision == revisions[-1]
        # Live events follow the replayed ones on the same iterator.
        live = await etcd_client.put(f"{key_prefix}c", b"4")
        (event,) = await _events(w, 1)
        assert event.revision == live.revision


async def test_watch_single_key_with_filter(etcd_client: EtcdClient, key_prefix: str) -> None:
    key = f"{key_prefix}k"
    start = await etcd_client.put(key, b"1")
    await etcd_client.put(f"{key}2", b"not this key")
    await etcd_client.delete(key)
    async with etcd_client.watch(key, start_revision=start.revision, filters=[WatchFilter.NO_PUT]) as w:
        (event,) = await _events(w, 1)
        assert event.type is EventType.DELETE
        assert event.kv.key == key.encode()


async def test_progress_notifications_periodic_and_on_demand(etcd_client: EtcdClient, key_prefix: str) -> None:
    # The module's server sends progress notifications every 500 ms to watchers that asked for them.
    now = (await etcd_client.put(f"{key_prefix}x", b"1")).revision
    async with etcd_client.watch(f"{key_prefix}quiet", progress_notify=True) as w:
        batch = await _next_progress(w, within=3)
        assert batch.events == ()
        assert batch.revision >= now
        assert w.revision >= now

    put = await etcd_client.put(f"{key_prefix}y", b"1")
    async with etcd_client.watch(f"{key_prefix}y", start_revision=put.revision) as w:  # no periodic ones
        await _events(w, 1)  # its first event proves the stream is open
        assert await w.request_progress()
        batch = await _next_progress(w, within=3)
        assert batch.revision >= put.revision


async def test_watch_from_a_compacted_revision_raises(etcd_factory: EtcdFactory) -> None:
    server = etcd_factory()
    async with EtcdClient(server.config()) as etcd:
        first = await etcd.put("k", b"1")
        last = await etcd.put("k", b"2")
        await etcd.compact(last.revision)
        watcher = etcd.watch("k", start_revision=first.revision)
        with pytest.raises(Compacted) as caught:
            await _events(watcher, 1)
        assert caught.value.compact_revision == last.revision
        # Recovery is the caller's: re-list, then watch from the list's revision + 1.
        listed = await etcd.range("k")
        async with etcd.watch("k", start_revision=listed.revision + 1) as again:
            put = await etcd.put("k", b"3")
            (event,) = await _events(again, 1)
            assert event.revision == put.revision


async def test_watch_resumes_across_an_etcd_restart_without_losing_events(etcd_factory: EtcdFactory) -> None:
    server = etcd_factory()
    async with EtcdClient(server.config()) as etcd:
        start = (await etcd.put("/w/0", b"0")).revision
        watcher = etcd.watch("/w/", prefix=True, start_revision=start)
        seen = await _events(watcher, 1)
        for i in (1, 2):
            await etcd.put(f"/w/{i}", str(i).encode())
        server.kill(0)  # SIGKILL: the stream breaks mid-flight
        server.restart(0)
        for i in (3, 4, 5):  # written while the watcher is (probably) still reconnecting
            await etcd.put(f"/w/{i}", str(i).encode(), timeout=10)
        seen += await _events(watcher, 5, within=15)
        assert [e.kv.value for e in seen] == [str(i).encode() for i in range(6)]
        assert watcher.reconnects >= 1
        await watcher.close()


async def test_watch_notices_a_frozen_member_by_keepalive_and_resumes(etcd_factory: EtcdFactory) -> None:
    # A SIGSTOPped etcd keeps its TCP connections open: only HTTP/2 pings reveal it. 5 s is the
    # fastest ping etcd accepts (--grpc-keepalive-min-time).
    server = etcd_factory()
    async with EtcdClient(server.config(keepalive_time=5, keepalive_timeout=1)) as etcd:
        start = await etcd.put("/f/0", b"0")
        watcher = etcd.watch("/f/", prefix=True, start_revision=start.revision)
        await _events(watcher, 1)
        pending = asyncio.ensure_future(_events(watcher, 1, within=30))
        server.pause(0)
        try:
            for _ in range(100):  # the stream must break within keepalive_time + keepalive_timeout
                if watcher.reconnects:
                    break
                await asyncio.sleep(0.1)
        finally:
            server.resume(0)
        assert watcher.reconnects >= 1, "a frozen etcd went unnoticed for 10 s"
        put = await etcd.put("/f/1", b"1", timeout=10)
        (event,) = await pending
        assert event.revision == put.revision
        await watcher.close()


async def test_watch_resumes_after_grpc_core_internal_error(etcd_client: EtcdClient, key_prefix: str) -> None:
    """grpc.aio reports a call its core lost (a stream the server ended while we wrote to it) as INTERNAL
    "Internal error from Core", with etcd's real status gone. The game day's harness watch ended on it when
    an F4 killed a member; it is a broken stream like any other and the watch resumes where it was."""
    start = (await etcd_client.put(f"{key_prefix}0", b"0")).revision
    watcher = etcd_client.watch(key_prefix, prefix=True, start_revision=start)
    seen = await _events(watcher, 1)
    call = watcher._call
    assert call is not None
    real_read = call.read
    failed = False

    async def read_once_broken() -> object:
        nonlocal failed
        if not failed:
            failed = True
            raise grpc.aio.AioRpcError(grpc.StatusCode.INTERNAL, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                       "Internal error from Core", None)
        return await real_read()

    call.read = read_once_broken
    for i in (1, 2, 3):
        await etcd_client.put(f"{key_prefix}{i}", str(i).encode())
    seen += await _events(watcher, 3)
    assert [e.kv.value for e in seen] == [b"0", b"1", b"2", b"3"]  # none lost, none repeated
    assert failed and watcher.reconnects == 1
    await watcher.close()


async def _cancelled_under_the_reader(etcd_client: EtcdClient, key_prefix: str, how: str) -> list[bytes]:
    """Keys a consumer iterating a watch receives when its stream's call is cancelled while it reads: `how` is
    "call" (the call cancelled outright) or "write" (a write on the call cancelled: grpc.aio then cancels the whole
    call). The consumer must go on from the next revision, not end as if its own task were cancelled."""
    rev = (await etcd_client.put(key_prefix + "a", b"1")).revision
    watcher = etcd_client.watch(key_prefix, prefix=True, start_revision=rev)
    seen: list[bytes] = []
    first = asyncio.Event()

    async def consume() -> None:
        async for batch in watcher:
            seen.extend(ev.kv.key for ev in batch.events)
            if seen:
                first.set()
            if len(seen) >= 2:
                return

    consumer = asyncio.create_task(consume())
    try:
        await asyncio.wait_for(first.wait(), 5.0)
        await asyncio.sleep(0.05)  # the consumer is in its next read
        call = watcher._call
        assert call is not None
        if how == "call":
            call.cancel()
        else:
            from scheduler.store.etcd import _pb

            write = asyncio.create_task(call.write(_pb.watch_progress_request()))
            await asyncio.sleep(0)  # the write has begun
            write.cancel()
            await asyncio.gather(write, return_exceptions=True)
        await etcd_client.put(key_prefix + "b", b"2")
        await asyncio.wait_for(consumer, 5.0)
    finally:
        consumer.cancel()
        await asyncio.gather(consumer, return_exceptions=True)
        await watcher.close()
    return seen


@pytest.mark.parametrize("how", ["call", "write"])
async def test_a_call_cancelled_under_the_reader_resumes_the_watch(
        etcd_client: EtcdClient, key_prefix: str, how: str) -> None:
    """A game day's planner lost its members cache this way (the stall guard's bounded progress write was cancelled,
    and grpc.aio cancelled the call with it): its cache task ended and the planner claimed nothing for 11 minutes."""
    seen = await _cancelled_under_the_reader(etcd_client, key_prefix, how)
    assert seen == [(key_prefix + "a").encode(), (key_prefix + "b").encode()]
