"""Coalesce small fenced writes of many partitions into few etcd txns.

A node owning many partitions would otherwise send one small txn per partition per round (a create
batch, a dispatch batch), and etcd's per-request cost, not its per-key cost, would bound
throughput. Writers `submit()` their fenced batch and await it; the combiner packs the batches
waiting at that moment into one txn whose compares are every batch's fence (and own compares) and
whose success branch is all their ops, up to etcd's op limit. When the txn's compares fail (one
partition lost its fence, or one batch's own compare failed), each batch of that txn is retried
alone, so the guilty one gets its FencedOut / CompareFailed and the others still commit: a
combined txn never weakens a fence, it only saves round trips.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from scheduler.errors import OutcomeUnknown
from scheduler.store.etcd.errors import EtcdError
from scheduler.store.etcd.ops import Compare, Op
from scheduler.store.etcd.types import TxnResult
from scheduler.store.fenced import Fence, FenceStats, fenced_txn, nested_width, split_ops
from scheduler.store.kv import KV


@dataclass
class _Batch:
    fence: Fence
    ops: list[Op]
    compares: list[Compare]
    done: asyncio.Future[list[TxnResult]] = field(default_factory=lambda: asyncio.get_running_loop().create_future())

    @property
    def width(self) -> int:  # the widest nested txn: it needs that many ops left over by the parent
        return max((nested_width(op) for op in self.ops), default=0)


class WriteCombiner:
    def __init__(
        self,
        kv: KV,
        *,
        max_ops: int = 127,
        max_bytes: int = 1_000_000,
        timeout: float | None = None,
        disable_fencing: bool = False,
        stats: FenceStats | None = None,
    ) -> None:
        self.kv, self.max_ops, self.max_bytes, self.timeout = kv, max_ops, max_bytes, timeout
        self.disable_fencing = disable_fencing
        self.stats = stats or FenceStats()
        self._queue: list[_Batch] = []
        self._flusher: asyncio.Task[None] | None = None
        self.txns = 0
        self.batches = 0

    async def submit(self, fence: Fence, ops: Sequence[Op], compares: Sequence[Compare] = ()) -> list[TxnResult]:
        """Like fenced_txn (same errors), but possibly sharing one etcd txn with other partitions."""
        b = _Batch(fence, list(ops), list(compares))
        fits = (len(ops) + len(compares) + 1 + b.width <= self.max_ops
                and len(split_ops(ops, self.max_ops, self.max_bytes)) <= 1)
        if not fits:
            return await self._alone(b)
        self._queue.append(b)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        return await b.done

    async def _alone(self, b: _Batch) -> list[TxnResult]:
        self.txns += 1
        return await fenced_txn(self.kv, b.fence, b.ops, compares=b.compares, max_ops=self.max_ops,
                                max_bytes=self.max_bytes, timeout=self.timeout,
                                disable_fencing=self.disable_fencing, stats=self.stats)

    async def _flush(self) -> None:
        await asyncio.sleep(0)  # let the other partitions of this loop iteration submit too
        while self._queue:
            group: list[_Batch] = []
            n = width = 0
            while self._queue:
                head = self._queue[0]
                w = max(width, head.width)
                if group and n + len(head.ops) + len(head.compares) + 1 + w > self.max_ops:
                    break
                group.append(self._queue.pop(0))
                n += len(head.ops) + len(head.compares) + 1
                width = w
            if len(group) == 1:
                await self._settle_alone(group[0])
                continue
            await self._run_group(group)

    async def _settle_alone(self, b: _Batch) -> None:
        try:
            r = await self._alone(b)
            if not b.done.done():
                b.done.set_result(r)
        except BaseException as e:  # handed to the waiting writer, whatever it is
            if not b.done.done():
                b.done.set_exception(e)

    async def _run_group(self, group: list[_Batch]) -> None:
        compares: list[Compare] = []
        ops: list[Op] = []
        for b in group:
            if not self.disable_fencing:
                compares.append(Compare.create_revision(b.fence.owner_key, "==", b.fence.token))
            compares += b.compares
            ops += b.ops
        try:
            r = await self.kv.txn(compares, ops, timeout=self.timeout)
        except OutcomeUnknown as e:
            for b in group:  # every batch in it may or may not have landed: each writer re-reads
                if not b.done.done():  # a writer cancelled meanwhile has nobody to tell
                    b.done.set_exception(e)
            return
        except EtcdError:
            # Refused as a whole (e.g. a request limit): nothing was applied, so each batch alone.
            await asyncio.gather(*(self._settle_alone(b) for b in group))
            return
        self.txns += 1
        self.batches += len(group)
        self.stats.txns += 1
        if not r.succeeded:
            # Someone's compare failed: retry each alone so that only the guilty batch fails.
            await asyncio.gather(*(self._settle_alone(b) for b in group))
            return
        i = 0
        for b in group:
            part = TxnResult(r.header, True, r.responses[i:i + len(b.ops)])
            i += len(b.ops)
            if not b.done.done():
                b.done.set_result([part])
