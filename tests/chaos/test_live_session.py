"""The aim's test of a planner's session (chaos/live.py `session_lasts`), on a real etcd: a fault is aimed at
a planner only while its session's lease has a second left, since one whose keep-alives an earlier fault cut
still owns until etcd expires the lease, and a fault injected then exercises nothing."""

from __future__ import annotations

import asyncio

import pytest

from chaos.live import session_lasts
from scheduler.store.etcd import EtcdClient

pytestmark = pytest.mark.etcd


async def test_a_lease_lasts_while_renewed_and_not_in_its_last_second(etcd_client: EtcdClient) -> None:
    lease = await etcd_client.lease_grant(2)
    assert await session_lasts(etcd_client, lease.id), "a fresh 2 s lease has a second left"
    await asyncio.sleep(1.3)  # no keep-alive: under a second left
    assert not await session_lasts(etcd_client, lease.id), "a lease in its last second does not last"
    await asyncio.sleep(1.5)  # expired
    assert not await session_lasts(etcd_client, lease.id)
    assert not await session_lasts(etcd_client, 0x7E57), "a lease that never existed does not last"
