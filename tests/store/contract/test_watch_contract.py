"""Contract: watch replay, live events, filters, prev_kv, compaction and progress notifications."""

from __future__ import annotations

import asyncio

import pytest

from scheduler.store.etcd import Compacted, EventType, KeyValue, WatchEvent, WatchFilter, ops
from scheduler.store.kv import KV
from tests.store.contract.conftest import PROGRESS_INTERVAL
from tests.store.contract.helpers import b, next_events, next_progress


def _deleted(key: str, revision: int) -> KeyValue:
    """The kv of a DELETE event: only the key and the delete's revision."""
    return KeyValue(b(key), b"", 0, revision, 0, 0)


async def test_replay_from_a_past_revision_is_the_exact_history(kv: KV, key_prefix: str) -> None:
    w = key_prefix + "w/"
    a1 = await kv.put(w + "a", b"1")
    b2 = await kv.put(w + "b", b"2")
    txn = await kv.txn([], [ops.put(w + "a", b"3"), ops.delete(w + "b"), ops.put(w + "c", b"4")])
    await kv.put(key_prefix + "other", b"x")  # outside the watched prefix
    lease = await kv.lease_grant(30)
    e5 = await kv.put(w + "e", b"5", lease=lease.id)
    d6 = await kv.put(w + "d", b"6", lease=lease.id)
    revoked = await kv.lease_revoke(lease.id)

    kv_a1 = KeyValue(b(w + "a"), b"1", a1.revision, a1.revision, 1, 0)
    kv_b2 = KeyValue(b(w + "b"), b"2", b2.revision, b2.revision, 1, 0)
    kv_e5 = KeyValue(b(w + "e"), b"5", e5.revision, e5.revision, 1, lease.id)
    kv_d6 = KeyValue(b(w + "d"), b"6", d6.revision, d6.revision, 1, lease.id)
    expected = [
        WatchEvent(EventType.PUT, kv_a1, None),
        WatchEvent(EventType.PUT, kv_b2, None),
        # One txn: one revision, its events in the order of its operations.
        WatchEvent(EventType.PUT, KeyValue(b(w + "a"), b"3", a1.revision, txn.revision, 2, 0), kv_a1),
        WatchEvent(EventType.DELETE, _deleted(w + "b", txn.revision), kv_b2),
        WatchEvent(EventType.PUT, KeyValue(b(w + "c"), b"4", txn.revision, txn.revision, 1, 0), None),
        WatchEvent(EventType.PUT, kv_e5, None),
        WatchEvent(EventType.PUT, kv_d6, None),
        # A revoke deletes the lease's keys in one revision, in key order.
        WatchEvent(EventType.DELETE, _deleted(w + "d", revoked.revision), kv_d6),
        WatchEvent(EventType.DELETE, _deleted(w + "e", revoked.revision), kv_e5),
    ]

    watch = kv.watch(w, prefix=True, start_revision=a1.revision, prev_kv=True)
    try:
        assert await next_events(watch, len(expected)) == expected
        assert watch.revision == revoked.revision
        # Live events follow on the same stream, one revision per batch.
        live = await kv.put(w + "f", b"7")
        batch = await asyncio.wait_for(anext(watch), 5)
        assert batch.revision == live.revision
        assert [(e.type, e.kv.key, e.prev_kv) for e in batch.events] == [(EventType.PUT, b(w + "f"), None)]
    finally:
        await watch.close()


async def test_one_key_filters_and_prev_kv(kv: KV, key_prefix: str) -> None:
    key = key_prefix + "k"
    start = await kv.put(key, b"1")
    await kv.put(key + "2", b"not this key")
    updated = await kv.put(key, b"2")
    deleted = await kv.delete(key)

    no_puts = kv.watch(key, start_revision=start.revision, filters=[WatchFilter.NO_PUT])
    no_deletes = kv.watch(key, start_revision=start.revision, filters=[WatchFilter.NO_DELETE])
    try:
        (event,) = await next_events(no_puts, 1)
        assert (event.type, event.revision, event.prev_kv) == (EventType.DELETE, deleted.revision, None)
        events = await next_events(no_deletes, 2)
        assert [(e.type, e.kv.value, e.revision) for e in events] == [
            (EventType.PUT, b"1", start.revision),
            (EventType.PUT, b"2", updated.revision),
        ]
        assert [e.prev_kv for e in events] == [None, None]  # not asked for
    finally:
        await no_puts.close()
        await no_deletes.close()


async def test_watch_from_a_future_revision_starts_there(kv: KV, key_prefix: str) -> None:
    now = (await kv.range(key_prefix)).revision
    watch = kv.watch(key_prefix, prefix=True, start_revision=now + 3)
    try:
        for i in range(3):
            await kv.put(key_prefix + str(i), b"x")
        (event,) = await next_events(watch, 1)
        assert (event.kv.key, event.revision) == (b(key_prefix + "2"), now + 3)
    finally:
        await watch.close()


async def test_watch_from_a_compacted_revision_raises_compacted(kv: KV, key_prefix: str) -> None:
    key = key_prefix + "k"
    first = await kv.put(key, b"1")
    last = await kv.put(key, b"2")
    await kv.compact(last.revision)

    watch = kv.watch(key, start_revision=first.revision)
    with pytest.raises(Compacted) as caught:
        await next_events(watch, 1)
    assert caught.value.compact_revision == last.revision
    with pytest.raises(StopAsyncIteration):  # the watch is over
        await anext(watch)
    await watch.close()

    # From the compaction revision itself, history is still there; prev_kv from before it is not.
    again = kv.watch(key, start_revision=last.revision, prev_kv=True)
    try:
        (event,) = await next_events(again, 1)
        assert (event.kv.value, event.revision, event.prev_kv) == (b"2", last.revision, None)
        newer = await kv.put(key, b"3")
        (event,) = await next_events(again, 1)
        assert event.revision == newer.revision
        assert event.prev_kv is not None
        assert event.prev_kv.value == b"2"
    finally:
        await again.close()


async def test_progress_notification_on_request(kv: KV, key_prefix: str) -> None:
    put = await kv.put(key_prefix + "y", b"1")
    watch = kv.watch(key_prefix + "y", start_revision=put.revision)
    try:
        assert not await watch.request_progress()  # no stream yet: it opens on the first iteration
        await next_events(watch, 1)
        elsewhere = await kv.put(key_prefix + "z", b"1")  # moves the revision, not this watch
        assert await watch.request_progress()
        batch = await next_progress(watch, within=3)
        assert batch.events == ()
        assert batch.revision >= elsewhere.revision
        assert watch.revision >= elsewhere.revision  # nothing at or below it is still to come
    finally:
        await watch.close()


async def test_periodic_progress_notifications(kv: KV, key_prefix: str) -> None:
    now = (await kv.put(key_prefix + "x", b"1")).revision
    watch = kv.watch(key_prefix + "quiet", progress_notify=True)
    try:
        batch = await next_progress(watch, within=PROGRESS_INTERVAL * 6)
        assert batch.revision >= now
        assert watch.revision >= now
    finally:
        await watch.close()


async def test_close_ends_the_iteration(kv: KV, key_prefix: str) -> None:
    put = await kv.put(key_prefix + "k", b"1")
    watch = kv.watch(key_prefix + "k", start_revision=put.revision)
    await next_events(watch, 1)
    await watch.close()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(watch), 2)
