"""One planner node: etcd client, session, partition ownership, and the per-partition loops.

Until the planner loop of issue 4 lands, each owned partition runs a checkpoint loop that advances
the partition's watermark to "now" through fenced writes every `tick` seconds. That is the shape the
planner loop has (fenced batch ending in the checkpoint), and it is what the coordination drills
exercise: claims, takeovers, fenced-out stale writers, watermarks that never go back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import replace

from scheduler.clock import Clock
from scheduler.config import CoordinationSettings, EtcdSettings
from scheduler.errors import FencedOut, OutcomeUnknown
from scheduler.planner.ownership import LostReason, NotOwner, Ownership
from scheduler.store.checkpoint import advance, read_checkpoint
from scheduler.store.etcd import EtcdClient, EtcdConfig
from scheduler.store.etcd.errors import EtcdError
from scheduler.store.fenced import CompareFailed, Fence, FenceStats, fenced_txn
from scheduler.store.keyspace import Keyspace
from scheduler.store.kv import KV

log = logging.getLogger("scheduler.node")


def etcd_client(s: EtcdSettings, rpc_timeout: float) -> EtcdClient:
    return EtcdClient(
        EtcdConfig(
            endpoints=s.etcd_endpoints,
            username=s.etcd_username,
            password=s.etcd_password,
            ca_file=s.etcd_ca_file,
            cert_file=s.etcd_cert_file,
            key_file=s.etcd_key_file,
            timeout=rpc_timeout,
        )
    )


class PlannerNode:
    def __init__(
        self, kv: KV, ks: Keyspace, settings: CoordinationSettings, clock: Clock, *, tick: float = 0.1
    ) -> None:
        self.kv, self.ks, self.s, self.clock, self.tick = kv, ks, settings, clock, tick
        self.ownership = Ownership(kv, ks, settings, clock, listener=self)
        self.fence_stats = FenceStats()
        self._loops: dict[int, asyncio.Task[None]] = {}

    # OwnershipListener
    def on_acquired(self, fence: Fence) -> None:
        log.info("acquired", extra={"event": "acquired", "partition": fence.partition, "token": fence.token})
        old = self._loops.pop(fence.partition, None)
        if old is not None:
            old.cancel()
        self._loops[fence.partition] = asyncio.create_task(self._partition_loop(fence.partition))

    def on_lost(self, partition: int, reason: LostReason) -> None:
        log.warning("lost", extra={"event": "lost", "partition": partition, "reason": reason.value})
        task = self._loops.pop(partition, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()  # stop dispatch for this partition at once

    async def _partition_loop(self, partition: int) -> None:
        ck = None
        while True:
            try:
                if ck is None:
                    ck = await read_checkpoint(self.kv, self.ks, partition, timeout=self.s.rpc_timeout)
                await asyncio.sleep(self.tick)
                async with self.ownership.writing(partition) as fence:
                    wm = max(ck.watermark_ms, self.clock.wall_ms())
                    compares, ops, new = advance(self.ks, ck, wm, self.s.node_id, fence.token)
                    rs = await fenced_txn(
                        self.kv, fence, ops, compares=compares, timeout=self.s.rpc_timeout,
                        disable_fencing=self.s.unsafe_disable_fencing, stats=self.fence_stats,
                    )
                    ck = replace(new, mod_revision=rs[-1].revision)
                    log.debug("checkpoint", extra={"event": "write", "partition": partition,
                                                   "token": fence.token, "revision": rs[-1].revision})
            except NotOwner:
                return
            except FencedOut as e:
                log.warning("fenced out", extra={"event": "fenced_out", "partition": partition, "error": str(e)})
                return
            except (OutcomeUnknown, CompareFailed, EtcdError) as e:
                log.info("re-reading checkpoint after %s", type(e).__name__, extra={"partition": partition})
                ck = None
                await asyncio.sleep(self.tick)

    async def run(self) -> None:
        try:
            await self.ownership.run()
        finally:
            for t in self._loops.values():
                t.cancel()
            with contextlib.suppress(Exception):
                await asyncio.gather(*self._loops.values(), return_exceptions=True)
