"""Contract: leases and keepers, on real time (both backends default to the monotonic clock).

TTLs are etcd's smallest (2 s), so the two tests that wait for an expiry take about 5 s per backend.
etcd checks for expired leases every 500 ms, so it deletes a lease's keys up to half a second after
the TTL; the twin does so at the TTL. The assertions allow for both.
"""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from scheduler.store.etcd import EtcdError, EventType, Lease, LeaseLost, LeaseLostReason, LeaseNotFound
from scheduler.store.kv import KV
from tests.store.contract.helpers import acked, b, next_events, revoke_quietly

# How late etcd may delete an expired lease's keys: its lessor's 500 ms check, plus scheduling.
_EXPIRY_SLACK = 1.0


async def test_grant_time_to_live_revoke(kv: KV, key_prefix: str) -> None:
    lease = await kv.lease_grant(20)
    assert lease.ttl == 20
    await kv.put(key_prefix + "a", b"1", lease=lease.id)
    last = await kv.put(key_prefix + "b", b"2", lease=lease.id)
    info = await kv.lease_time_to_live(lease.id, keys=True)
    assert (info.id, info.granted_ttl) == (lease.id, 20)
    assert 18 <= info.ttl <= 20  # whole seconds, rounded down
    assert set(info.keys) == {b(key_prefix + "a"), b(key_prefix + "b")}  # etcd's order is random
    assert (await kv.lease_time_to_live(lease.id)).keys == ()  # only listed when asked for

    revoked = await kv.lease_revoke(lease.id)
    assert revoked.revision == last.revision + 1  # both keys deleted in one revision
    assert (await kv.range(key_prefix, prefix=True)).count == 0
    gone = await kv.lease_time_to_live(lease.id, keys=True)
    assert (gone.ttl, gone.keys) == (-1, ())
    with pytest.raises(LeaseNotFound):
        await kv.lease_revoke(lease.id)

    empty = await kv.lease_grant(20)
    assert (await kv.lease_revoke(empty.id)).revision == revoked.revision  # no keys: no revision


async def test_grant_with_a_chosen_id_and_the_minimum_ttl(kv: KV) -> None:
    chosen = random.getrandbits(62) | 1  # unique on the shared server
    lease = await kv.lease_grant(20, lease_id=chosen)
    try:
        assert lease.id == chosen
        with pytest.raises(EtcdError, match="lease already exists"):
            await kv.lease_grant(20, lease_id=chosen)
    finally:
        await revoke_quietly(kv, chosen)
    short = await kv.lease_grant(1)
    assert short.ttl == 2  # etcd raises TTLs to its minimum (2 s with default flags)
    await kv.lease_revoke(short.id)


async def test_keeper_holds_the_lease_then_expiry_deletes_its_keys_in_one_revision(kv: KV, key_prefix: str) -> None:
    margin = 0.5
    lease = await kv.lease_grant(2)
    await kv.put(key_prefix + "a", b"1", lease=lease.id)
    last = await kv.put(key_prefix + "b", b"2", lease=lease.id)
    keeper = acked(kv.keep_alive(lease, safety_margin=margin, renew_interval=0.5))
    try:
        started = time.monotonic()
        while time.monotonic() - started < 2.6:  # longer than the TTL: only renewals keep it
            now = time.monotonic()
            # The local deadline never promises more than the last acknowledged send + TTL - margin ...
            assert keeper.deadline() == keeper.last_ack + keeper.ttl - margin
            assert keeper.last_ack <= now
            assert keeper.deadline() <= now + keeper.ttl - margin
            # ... which etcd's own expiry (reported in whole seconds, rounded down) never precedes.
            info = await kv.lease_time_to_live(lease.id)
            assert keeper.deadline() + margin < time.monotonic() + info.ttl + 1
            assert keeper.alive()
            await asyncio.sleep(0.2)
        assert (await kv.range(key_prefix, prefix=True)).count == 2
    finally:
        await keeper.stop()

    watch = kv.watch(key_prefix, prefix=True, start_revision=last.revision + 1)
    try:
        stopped = time.monotonic()
        while (await kv.lease_time_to_live(lease.id)).ttl != -1:
            assert time.monotonic() - stopped < lease.ttl + _EXPIRY_SLACK, "lease outlived its TTL"
            await asyncio.sleep(0.05)
        events = await next_events(watch, 2)
        assert [(e.type, e.kv.key) for e in events] == [
            (EventType.DELETE, b(key_prefix + "a")),
            (EventType.DELETE, b(key_prefix + "b")),
        ]
        assert events[0].revision == events[1].revision == last.revision + 1  # one revision per lease
    finally:
        await watch.close()
    assert not keeper.alive()  # stopped keepers still fence: their deadline has passed
    assert keeper.lost_reason is LeaseLostReason.LOCAL_DEADLINE


async def test_keeper_reports_a_revoked_lease_and_stays_lost(kv: KV) -> None:
    lease = await kv.lease_grant(3)
    keeper = kv.keep_alive(lease, safety_margin=0.5, renew_interval=0.3)
    try:
        await asyncio.sleep(0.1)
        await kv.lease_revoke(lease.id)
        assert await asyncio.wait_for(keeper.wait_lost(), timeout=3) is LeaseLostReason.EXPIRED
        with pytest.raises(LeaseLost):
            keeper.check()
        await asyncio.sleep(0.5)  # past the next renewals: nothing revives it or grants a new lease
        assert keeper.lost_reason is LeaseLostReason.EXPIRED
        assert (await kv.lease_time_to_live(lease.id)).ttl == -1
    finally:
        await keeper.stop()


async def test_keeper_of_a_lease_that_is_gone_is_lost_at_once(kv: KV) -> None:
    lease = await kv.lease_grant(5)
    await kv.lease_revoke(lease.id)
    keeper = kv.keep_alive(lease, safety_margin=1)
    try:
        assert await asyncio.wait_for(keeper.wait_lost(), timeout=2) is LeaseLostReason.EXPIRED
    finally:
        await keeper.stop()


@pytest.mark.parametrize(("margin", "interval"), [(2.0, None), (-0.1, None), (0.5, 1.6), (0.5, 0.0)])
async def test_keeper_refuses_timings_that_cannot_work(kv: KV, margin: float, interval: float | None) -> None:
    with pytest.raises(ValueError, match="must"):
        kv.keep_alive(Lease(id=7, ttl=2, sent_at=0.0), safety_margin=margin, renew_interval=interval)
