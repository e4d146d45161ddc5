"""Leases and the LeaseKeeper: one stream, local deadline, loss is final."""

from __future__ import annotations

import asyncio
import time

import pytest

from chaos.infra.etcd import EtcdFactory
from scheduler.store.etcd import (
    EtcdClient,
    EtcdConfig,
    Lease,
    LeaseKeeper,
    LeaseLost,
    LeaseLostReason,
    LeaseNotFound,
)
from scheduler.store.etcd.connection import Connection


@pytest.mark.etcd
async def test_grant_time_to_live_revoke(etcd_client: EtcdClient, key_prefix: str) -> None:
    lease = await etcd_client.lease_grant(20)
    assert lease.ttl == 20
    await etcd_client.put(f"{key_prefix}a", b"1", lease=lease.id)
    info = await etcd_client.lease_time_to_live(lease.id, keys=True)
    assert info.granted_ttl == 20
    assert 0 < info.ttl <= 20
    assert info.keys == (f"{key_prefix}a".encode(),)
    await etcd_client.lease_revoke(lease.id)
    assert await etcd_client.get(f"{key_prefix}a") is None  # revoking deletes the lease's keys
    assert (await etcd_client.lease_time_to_live(lease.id)).ttl == -1
    with pytest.raises(LeaseNotFound):
        await etcd_client.lease_revoke(lease.id)


@pytest.mark.etcd
async def test_keeper_holds_a_short_lease_on_one_stream_then_it_expires(
    etcd_client: EtcdClient, key_prefix: str
) -> None:
    margin = 0.5
    lease = await etcd_client.lease_grant(2)
    await etcd_client.put(f"{key_prefix}owner", b"me", lease=lease.id)
    keeper = etcd_client.keep_alive(lease, safety_margin=margin)
    started = time.monotonic()
    while time.monotonic() - started < 5.5:  # nearly three TTLs
        # The local deadline never promises more than the last acknowledged send + TTL - margin ...
        before = keeper.deadline()
        assert before == keeper.last_ack + keeper.ttl - margin
        assert keeper.last_ack <= time.monotonic()
        # ... and never outlives the server's own expiry (etcd reports whole seconds: expiry < now + ttl + 1).
        info = await etcd_client.lease_time_to_live(lease.id)
        assert before + margin < time.monotonic() + info.ttl + 1
        assert keeper.alive()
        await asyncio.sleep(0.25)
    assert keeper.streams_opened == 1
    assert keeper.acks >= 7  # one every TTL/3
    assert await etcd_client.get(f"{key_prefix}owner") is not None

    await keeper.stop()  # the client stops renewing: etcd must expire the lease within TTL
    stopped = time.monotonic()
    while (await etcd_client.lease_time_to_live(lease.id)).ttl != -1:
        assert time.monotonic() - stopped < lease.ttl + 1.0, "lease outlived its TTL without renewals"
        await asyncio.sleep(0.1)
    assert await etcd_client.get(f"{key_prefix}owner") is None


@pytest.mark.etcd
async def test_keeper_reports_a_revoked_lease_and_never_revives_it(etcd_client: EtcdClient) -> None:
    lease = await etcd_client.lease_grant(3)
    keeper = etcd_client.keep_alive(lease, safety_margin=0.5)
    try:
        await asyncio.sleep(0.2)
        await etcd_client.lease_revoke(lease.id)
        reason = await asyncio.wait_for(keeper.wait_lost(), timeout=3)
        assert reason is LeaseLostReason.EXPIRED
        with pytest.raises(LeaseLost):
            keeper.check()
        streams, acks = keeper.streams_opened, keeper.acks
        await asyncio.sleep(1.5)
        assert (keeper.streams_opened, keeper.acks) == (streams, acks)  # it stopped for good
        assert (await etcd_client.lease_time_to_live(lease.id)).ttl == -1  # and granted nothing new
    finally:
        await keeper.stop()


@pytest.mark.etcd
async def test_keeper_fences_itself_when_etcd_stops_answering(etcd_factory: EtcdFactory) -> None:
    server = etcd_factory()
    async with EtcdClient(server.config()) as etcd:
        lease = await etcd.lease_grant(2)
        keeper = etcd.keep_alive(lease, safety_margin=0.5)
        await asyncio.sleep(0.8)
        assert keeper.acks >= 1
        server.pause(0)
        try:
            reason = await asyncio.wait_for(keeper.wait_lost(), timeout=3)
            noticed = time.monotonic()
        finally:
            server.resume(0)
        assert reason is LeaseLostReason.LOCAL_DEADLINE
        # Noticed at the deadline (give or take an event-loop hiccup on a busy 2-core box), and the
        # deadline itself came before etcd could have expired the lease.
        assert keeper.deadline() <= noticed < keeper.deadline() + 0.5
        assert keeper.deadline() < keeper.last_ack + lease.ttl
        await asyncio.sleep(0.5)  # etcd is back: a late acknowledgement must not revive the lease
        assert not keeper.alive()
        await keeper.stop()


async def test_deadline_follows_the_injected_clock() -> None:
    now = [100.0]
    conn = Connection(EtcdConfig(endpoints=("127.0.0.1:1",)), clock=lambda: now[0])
    try:
        keeper = LeaseKeeper(conn, Lease(id=7, ttl=6, sent_at=100.0), safety_margin=1.0)  # not started
        assert keeper.deadline() == 105.0
        assert keeper.renew_interval == 2.0
        now[0] = 104.9
        assert keeper.alive()
        assert keeper.remaining() == pytest.approx(0.1)
        now[0] = 105.0
        assert keeper.lost_reason is LeaseLostReason.LOCAL_DEADLINE
        with pytest.raises(LeaseLost):
            keeper.check()
    finally:
        await conn.close()


@pytest.mark.parametrize(("margin", "interval"), [(2.0, None), (-0.1, None), (0.5, 1.6), (0.5, 0.0)])
async def test_keeper_refuses_timings_that_cannot_work(margin: float, interval: float | None) -> None:
    conn = Connection(EtcdConfig(endpoints=("127.0.0.1:1",)))
    try:
        with pytest.raises(ValueError, match="must"):
            LeaseKeeper(conn, Lease(id=7, ttl=2, sent_at=0.0), safety_margin=margin, renew_interval=interval)
    finally:
        await conn.close()
