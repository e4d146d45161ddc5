"""A live copy of one key prefix: list at a revision, then watch from the next one.

Like a Kubernetes informer: `run()` keeps `items` equal to etcd's state at `revision`. The watch
resumes by itself after disconnects (the client's Watcher restarts from the last seen revision);
when etcd has compacted past what we need, we list again. Consumers are woken through
`changed` (an asyncio.Event they clear) and read the snapshot; they never poll etcd.
"""

from __future__ import annotations

import asyncio
import logging

from scheduler.store.etcd.errors import Compacted, EtcdError
from scheduler.store.etcd.types import EventType, KeyValue
from scheduler.store.kv import KV

log = logging.getLogger(__name__)


class PrefixCache:
    def __init__(self, kv: KV, prefix: bytes, *, timeout: float = 1.0, retry_pause: float = 0.2) -> None:
        self._kv = kv
        self.prefix = prefix
        self._timeout = timeout
        self._retry_pause = retry_pause
        self.items: dict[bytes, KeyValue] = {}
        self.revision = 0
        self.changed = asyncio.Event()
        self.synced = asyncio.Event()
        self.relists = 0

    async def _list(self) -> None:
        r = await self._kv.range(self.prefix, prefix=True, timeout=self._timeout)
        self.items = {kv.key: kv for kv in r.kvs}
        self.revision = r.revision
        self.relists += 1
        self.synced.set()
        self.changed.set()

    async def run(self) -> None:
        while True:
            try:
                await self._list()
                watch = self._kv.watch(self.prefix, prefix=True, start_revision=self.revision + 1, progress_notify=True)
                try:
                    async for batch in watch:
                        for ev in batch.events:
                            if ev.type is EventType.PUT:
                                self.items[ev.kv.key] = ev.kv
                            else:
                                self.items.pop(ev.kv.key, None)
                        self.revision = max(self.revision, batch.revision if batch.is_progress else
                                            batch.events[-1].revision)
                        if batch.events:
                            # Not on a progress notification: the watch's stall guard asks for one every
                            # second a watch is quiet, and nothing here changed.
                            self.changed.set()
                finally:
                    await watch.close()
            except Compacted:
                log.info("watch on %r compacted: listing again", self.prefix)
            except EtcdError as e:
                log.warning("prefix cache %r: %s; retrying", self.prefix, e)
                await asyncio.sleep(self._retry_pause)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling() > 0:
                    raise
                # Not our cancellation (a gRPC call cancelled under a read): a cache that ended here would
                # leave its readers a frozen view for good, as a planner's members cache once did.
                log.error("prefix cache %r: its watch ended in a cancellation that was not ours; listing again",
                          self.prefix)
                await asyncio.sleep(self._retry_pause)
