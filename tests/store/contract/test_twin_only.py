"""The twin alone: exact timing on a fake clock, and the fault hooks that make failure tests
possible without a cluster. (Everything a real etcd can also show is in the contract tests.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from scheduler.clock import FakeClock
from scheduler.store.etcd import (
    Compacted,
    Compare,
    EventType,
    LeaseLostReason,
    NoSpace,
    OutcomeUnknown,
    Unavailable,
    ops,
)
from scheduler.store.kv import KV, Keeper, WatchStream
from scheduler.store.memory import MemoryEtcd, MemoryKV
from tests.store.contract.helpers import b, next_events, next_progress, nothing_within


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def twin(clock: FakeClock) -> AsyncIterator[MemoryKV]:
    async with MemoryKV(clock.monotonic, progress_notify_interval=10) as kv:
        yield kv


def advance(clock: FakeClock, kv: MemoryKV, seconds: float, step: float = 0.25) -> None:
    """Let `seconds` pass with the twin's timers running every `step` (a live process)."""
    remaining = seconds
    while remaining > 1e-9:
        clock.advance(min(step, remaining))
        remaining -= step
        kv.run_due()


async def test_it_is_a_kv(twin: MemoryKV) -> None:
    kv: KV = twin  # checked by mypy: the twin implements the whole interface
    keeper: Keeper = kv.keep_alive(await kv.lease_grant(5), safety_margin=1)
    watch: WatchStream = kv.watch("k")
    await keeper.stop()
    await watch.close()


async def test_an_empty_store_is_at_revision_one(twin: MemoryKV) -> None:
    assert (await twin.range("k")).revision == 1  # as a fresh etcd (measured)
    assert (await twin.put("k", b"v")).revision == 2


async def test_leases_expire_exactly_at_their_ttl_one_revision_each(twin: MemoryKV, clock: FakeClock) -> None:
    short, long_ = await twin.lease_grant(5), await twin.lease_grant(10)
    await twin.put("a", b"", lease=short.id)
    await twin.put("b", b"", lease=short.id)
    last = await twin.put("c", b"", lease=long_.id)
    clock.advance(4.75)  # (quarter seconds: exact in binary, so the boundary is exact too)
    info = await twin.lease_time_to_live(short.id)
    assert info.ttl == 0  # 0.25 s left, reported in whole seconds rounded down, as etcd does
    assert (await twin.range("a", range_end="d")).count == 3
    clock.advance(0.25)
    after = await twin.range("a", range_end="d")
    assert [kv.key for kv in after.kvs] == [b"c"]
    assert after.revision == last.revision + 1  # both keys of the lease in one revision
    clock.advance(5)
    assert (await twin.range("c")).revision == last.revision + 2  # the next lease: its own revision
    assert (await twin.lease_time_to_live(long_.id)).ttl == -1


async def test_leases_due_together_expire_in_expiry_order(twin: MemoryKV, clock: FakeClock) -> None:
    first = await twin.lease_grant(5)
    clock.advance(1)
    second = await twin.lease_grant(5)
    await twin.put("second", b"", lease=second.id)
    await twin.put("first", b"", lease=first.id)
    start = (await twin.range("x")).revision
    watch = twin.watch("", prefix=True, start_revision=start + 1)
    clock.advance(10)  # both past due at the next look
    events = await next_events(watch, 2)
    assert [(e.kv.key, e.revision) for e in events] == [(b"first", start + 1), (b"second", start + 2)]
    await watch.close()


async def test_keeper_renews_on_the_clock_and_fences_itself_when_renewals_are_lost(
    twin: MemoryKV, clock: FakeClock
) -> None:
    lease = await twin.lease_grant(6)
    await twin.put("owner", b"me", lease=lease.id)
    keeper = twin.keep_alive(lease, safety_margin=1)  # renews every 2 s
    assert keeper.acks == 1  # the first renewal goes out at once
    advance(clock, twin, 30)
    assert keeper.alive()
    assert keeper.acks == 16
    assert keeper.deadline() == keeper.last_ack + 5

    assert keeper.last_ack == clock.monotonic()  # just renewed
    twin.pause_keepalives()  # e.g. the network to etcd is cut; renewals are sent and lost
    advance(clock, twin, 4.75)
    assert keeper.alive()
    advance(clock, twin, 0.25)
    assert keeper.lost_reason is LeaseLostReason.LOCAL_DEADLINE  # the planner stops here ...
    assert await twin.get("owner") is not None  # ... while etcd still holds the lease ...
    advance(clock, twin, 1)
    assert await twin.get("owner") is None  # ... which expires one margin later
    twin.resume_keepalives()
    advance(clock, twin, 5)
    assert keeper.lost_reason is LeaseLostReason.LOCAL_DEADLINE  # lost stays lost
    await keeper.stop()


async def test_a_frozen_process_finds_its_lease_gone(twin: MemoryKV, clock: FakeClock) -> None:
    lease = await twin.lease_grant(3)
    keeper = twin.keep_alive(lease, safety_margin=0.5)
    clock.advance(60)  # SIGSTOP: no timer of this process ran meanwhile
    waiter = asyncio.ensure_future(keeper.wait_lost())
    assert await asyncio.wait_for(waiter, 1) is LeaseLostReason.LOCAL_DEADLINE  # its own deadline first
    assert (await twin.lease_time_to_live(lease.id)).ttl == -1
    await keeper.stop()


async def test_keeper_loses_a_revoked_lease_at_its_next_renewal(twin: MemoryKV, clock: FakeClock) -> None:
    lease = await twin.lease_grant(9)
    keeper = twin.keep_alive(lease, safety_margin=1)
    await twin.lease_revoke(lease.id)
    advance(clock, twin, 2.75)
    assert keeper.alive()  # it cannot know before it asks
    advance(clock, twin, 0.25)
    assert keeper.lost_reason is LeaseLostReason.EXPIRED
    await keeper.stop()


async def test_stopped_keeper_leaves_the_lease_to_expire(twin: MemoryKV, clock: FakeClock) -> None:
    lease = await twin.lease_grant(4)
    keeper = twin.keep_alive(lease, safety_margin=1, renew_interval=1)
    advance(clock, twin, 10)
    await keeper.stop()
    advance(clock, twin, 3.75)
    assert (await twin.lease_time_to_live(lease.id)).ttl == 0
    advance(clock, twin, 0.25)
    assert (await twin.lease_time_to_live(lease.id)).ttl == -1


async def test_timers_run_in_the_background_while_the_loop_runs(twin: MemoryKV, clock: FakeClock) -> None:
    lease = await twin.lease_grant(5)
    await twin.put("k", b"", lease=lease.id)
    watch = twin.watch("k", start_revision=(await twin.range("k")).revision + 1)
    assert await nothing_within(watch, 0.05) == []  # the watch is created
    clock.advance(5)  # no request follows: the background task must expire the lease
    (event,) = await next_events(watch, 1, within=1)
    assert event.type is EventType.DELETE
    await watch.close()


async def test_periodic_progress_is_skipped_after_events(twin: MemoryKV, clock: FakeClock) -> None:
    watch = twin.watch("k", progress_notify=True)
    assert await nothing_within(watch, 0.05) == []  # creates the watch; nothing is due yet
    clock.advance(10)
    assert (await next_progress(watch, within=1)).revision == 1
    put = await twin.put("k", b"1")
    assert [e.revision for e in await next_events(watch, 1)] == [put.revision]
    clock.advance(10)
    twin.run_due()
    assert await nothing_within(watch, 0.05) == []  # etcd elides one notification after events
    clock.advance(10)
    assert (await next_progress(watch, within=1)).revision == put.revision
    await watch.close()


async def test_watch_with_start_zero_begins_at_its_first_iteration(twin: MemoryKV) -> None:
    # As EtcdClient's Watcher, which opens its stream on the first __anext__ (measured): a write
    # between watch() and the first iteration is not seen. Pass start_revision to be exact.
    watch = twin.watch("k")
    await twin.put("k", b"before")
    assert await nothing_within(watch, 0.05) == []
    after = await twin.put("k", b"after")
    assert [e.revision for e in await next_events(watch, 1)] == [after.revision]
    await watch.close()


async def test_fail_next_without_applying(twin: MemoryKV) -> None:
    twin.fail_next("put")
    with pytest.raises(OutcomeUnknown):
        await twin.put("k", b"1")
    assert await twin.get("k") is None  # a timeout that did not land
    assert (await twin.put("k", b"2")).revision == 2  # once only

    twin.fail_next("range")
    with pytest.raises(Unavailable):
        await twin.get("k")
    twin.fail_next("txn")
    with pytest.raises(Unavailable):  # a txn that only reads is a read
        await twin.txn([], [ops.get("k")])
    twin.fail_next("lease_grant", NoSpace("quota"))
    with pytest.raises(NoSpace):
        await twin.lease_grant(5)


async def test_fail_next_after_applying_is_an_answer_lost(twin: MemoryKV) -> None:
    twin.fail_next("txn", after_apply=True)
    with pytest.raises(OutcomeUnknown):
        await twin.txn([Compare.create_revision("owner", "==", 0)], [ops.put("owner", b"me")])
    # Landed anyway: the caller must re-read before deciding (DESIGN.md: outcome unknown).
    owner = await twin.get("owner")
    assert owner is not None
    assert owner.value == b"me"


async def test_faults_belong_to_one_client(twin: MemoryKV) -> None:
    other = twin.server.client()
    try:
        twin.fail_next("put")
        assert (await other.put("k", b"1")).revision == 2
        with pytest.raises(OutcomeUnknown):
            await twin.put("k", b"2")
    finally:
        await other.close()


async def test_a_disconnected_client_fails_fast_and_its_watch_resumes_without_loss(twin: MemoryKV) -> None:
    other = twin.server.client()
    try:
        start = await other.put("w/0", b"0")
        watch = twin.watch("w/", prefix=True, start_revision=start.revision)
        assert len(await next_events(watch, 1)) == 1
        twin.disconnect()
        with pytest.raises(Unavailable):
            await twin.get("w/0")
        with pytest.raises(OutcomeUnknown):
            await twin.put("w/x", b"never")
        for i in (1, 2, 3):
            await other.put(f"w/{i}", str(i).encode())
        assert not await watch.request_progress()  # no stream while cut off
        twin.reconnect()
        events = await next_events(watch, 3)
        assert [e.kv.value for e in events] == [b"1", b"2", b"3"]
        assert watch.reconnects == 1
        assert await twin.get("w/x") is None
        await watch.close()
    finally:
        await other.close()


async def test_a_watch_cut_off_across_a_compaction_raises_compacted(twin: MemoryKV) -> None:
    other = twin.server.client()
    try:
        start = await other.put("k", b"0")
        watch = twin.watch("k", start_revision=start.revision)
        await next_events(watch, 1)
        twin.disconnect()
        await other.put("k", b"1")
        last = await other.put("k", b"2")
        await other.compact(last.revision)
        twin.reconnect()
        with pytest.raises(Compacted) as caught:
            await next_events(watch, 1)
        assert caught.value.compact_revision == last.revision
    finally:
        await other.close()


async def test_a_disconnected_keeper_fences_itself(twin: MemoryKV, clock: FakeClock) -> None:
    lease = await twin.lease_grant(3)
    keeper = twin.keep_alive(lease, safety_margin=0.5)
    twin.disconnect()
    advance(clock, twin, 2.5)
    assert keeper.lost_reason is LeaseLostReason.LOCAL_DEADLINE
    await keeper.stop()


async def test_closing_one_process_leaves_the_cluster_and_its_lease(clock: FakeClock) -> None:
    cluster = MemoryEtcd(clock=clock.monotonic)
    planner, observer = cluster.client(), cluster.client()
    lease = await planner.lease_grant(5)
    await planner.put("owner", b"planner", lease=lease.id)
    planner.keep_alive(lease, safety_margin=1, renew_interval=1)
    advance(clock, observer, 20)
    await planner.close()  # a killed process: nothing is revoked, renewals just stop
    with pytest.raises(RuntimeError, match="closed"):
        await planner.get("owner")
    advance(clock, observer, 4)
    assert await observer.get("owner") is not None
    advance(clock, observer, 2)
    assert await observer.get("owner") is None
    await observer.close()


async def test_cluster_settings(clock: FakeClock) -> None:
    async with MemoryKV(clock.monotonic, min_lease_ttl=1) as kv:
        assert (await kv.lease_grant(1)).ttl == 1  # etcd's minimum can be lowered for fast tests
    with pytest.raises(ValueError, match="server"):
        MemoryKV(clock.monotonic, server=MemoryEtcd())


async def test_compaction_forgets_history_but_not_the_present(twin: MemoryKV) -> None:
    for i in range(50):
        await twin.put(f"k{i % 5}", b(str(i)))
    await twin.delete("k4")
    head = await twin.put("k0", b"last")
    await twin.compact(head.revision)
    space = twin.server.space
    assert all(len(entries) == 1 for entries in space._history.values())  # one entry per live key
    assert space.keys(b"k", b"l") == [b"k0", b"k1", b"k2", b"k3"]  # the deleted key is gone
    assert [e.revision for e in space.events(0)] == [head.revision]
    assert [kv.value for kv in (await twin.range("k", prefix=True)).kvs] == [b"last", b"46", b"47", b"48"]
