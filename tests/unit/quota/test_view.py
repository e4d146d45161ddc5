"""The planners' quota view (scheduler/quota/store.py `QuotaView`) over the in-memory etcd twin: it loads the
records, follows their changes by watch (the default and a tenant's, puts and deletes), and a record nobody
can read counts as none rather than stopping the view."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from scheduler.quota import store as qs
from scheduler.quota.record import Quota
from scheduler.store.keyspace import Keyspace
from scheduler.store.memory import MemoryKV


async def wait_for(cond: object, timeout: float = 2.0) -> None:
    assert callable(cond)
    for _ in range(int(timeout / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def test_the_view_follows_puts_and_deletes_of_both_keys() -> None:
    kv, ks = MemoryKV(), Keyspace("/t")
    await qs.cas(kv, ks, "a", 0, Quota(executions_per_second=3.0), timeout=1.0)
    view = qs.QuotaView(kv, ks, timeout=1.0)
    changes: list[int] = []
    view.on_change = lambda: changes.append(view.revision)
    task = asyncio.create_task(view.run())
    try:
        await wait_for(lambda: view.rate("a") == 3.0)
        assert view.any_rate() and view.rate("b") == 0.0
        rev = await qs.cas(kv, ks, None, 0, Quota(executions_per_second=1.5), timeout=1.0)
        await wait_for(lambda: view.revision >= rev)
        assert view.rate("b") == 1.5 and view.rate("a") == 3.0  # its own record replaces the default
        cur = await qs.read(kv, ks, "a", timeout=1.0)
        await qs.remove(kv, ks, "a", cur.version, timeout=1.0)
        await wait_for(lambda: view.rate("a") == 1.5)
        await kv.put(ks.quota("c"), b"not json")
        await wait_for(lambda: "c" not in view.own and view.revision > rev)
        assert view.rate("c") == 1.5
        cur = await qs.read(kv, ks, None, timeout=1.0)
        await qs.remove(kv, ks, None, cur.version, timeout=1.0)
        await wait_for(lambda: not view.any_rate())
        assert changes  # the pacer is told
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_cas_refuses_a_stale_version() -> None:
    kv, ks = MemoryKV(), Keyspace("/t")
    v1 = await qs.cas(kv, ks, "a", 0, Quota(schedules=1), timeout=1.0)
    with pytest.raises(qs.Stale, match="version 0"):  # a create over an existing record
        await qs.cas(kv, ks, "a", 0, Quota(schedules=2), timeout=1.0)
    await qs.cas(kv, ks, "a", v1, Quota(schedules=3), timeout=1.0)
    assert (await qs.read(kv, ks, "a", timeout=1.0)).quota == Quota(schedules=3)
