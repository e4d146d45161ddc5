"""The harness's etcd watcher reports how far it has recorded, so that a history that stopped short makes
the run invalid instead of being judged (a game day's recording stopped 406 s into 1,800 unnoticed)."""

from __future__ import annotations

import asyncio
import io

import pytest

from chaos.record import WatchProgress, record_watch
from scheduler.store.etcd import EtcdClient

pytestmark = pytest.mark.etcd


async def test_the_watch_says_when_it_has_recorded_everything_and_when_not(etcd_client: EtcdClient,
                                                                            key_prefix: str) -> None:
    out, stop, progress = io.StringIO(), asyncio.Event(), WatchProgress()
    task = asyncio.create_task(record_watch(etcd_client, key_prefix, out, stop, progress=progress))
    try:
        for i in range(5):
            await etcd_client.put(f"{key_prefix}k{i}".encode(), b"v")
        rev = (await etcd_client.put(b"/elsewhere/k", b"v")).revision  # a revision outside the prefix
        assert await progress.caught_up(rev, timeout=5.0), "progress notifications cover revisions outside it"
        assert out.getvalue().count("\n") == 5 and progress.written < rev
        # A revision the cluster has not reached stands for a history that stopped short: not caught up.
        assert not await progress.caught_up(rev + 1_000, timeout=0.5)
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
