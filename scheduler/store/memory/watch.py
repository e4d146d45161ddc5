"""MemoryWatcher: the twin of `Watcher`, fed synchronously by the twin's writes.

It behaves as the real one does from the outside: the watch is created on the first `__anext__`
(that is when `Watcher` opens its stream, so `start_revision=0` means "from then", not "from the
call to watch()"); history from `start_revision` comes in one batch whose revision is the store's
current one; each later revision comes in its own batch; progress notifications are batches without
events; a compacted start raises `Compacted` and ends the watch; after a broken stream (a
disconnected client) it resumes from the revision after the last one it delivered.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from scheduler.store.etcd.types import EventType, WatchBatch, WatchEvent, WatchFilter
from scheduler.store.memory.mvcc import in_range

__all__ = ["MemoryWatcher", "WatchHost"]


class WatchHost(Protocol):
    """The client a watcher belongs to."""

    @property
    def connected(self) -> bool: ...

    def open_watch(self, watcher: MemoryWatcher) -> None:
        """Create the watch on the server from `watcher.next_revision` (replay, then live). May
        raise `Compacted`."""
        ...

    def forget_watch(self, watcher: MemoryWatcher) -> None: ...

    def current_revision(self) -> int: ...


class MemoryWatcher:
    def __init__(
        self,
        host: WatchHost,
        key: bytes,
        range_end: bytes,
        *,
        start_revision: int = 0,
        progress_notify: bool = False,
        prev_kv: bool = False,
        filters: Sequence[WatchFilter] = (),
    ) -> None:
        self._host = host
        self.key = key
        self.range_end = range_end
        self.progress_notify = progress_notify
        self.prev_kv = prev_kv
        self._drop_puts = WatchFilter.NO_PUT in filters
        self._drop_deletes = WatchFilter.NO_DELETE in filters
        self._next_rev = start_revision  # 0 until the watch is created ("from now")
        self._min_rev = 0  # events below this are not for this watch (a start in the future)
        self._queue: deque[WatchBatch] = deque()
        self._wake = asyncio.Event()
        self._created = False
        self._closed = False
        self.reconnects = 0
        # etcd's per-watch progress state: the next tick time, and whether that tick may send
        # (etcd skips one periodic notification after a batch with events).
        self.progress_due = 0.0
        self.progress_allowed = True

    @property
    def revision(self) -> int:
        """Every event at or below this revision has been delivered (0: nothing known yet)."""
        return max(self._next_rev - 1, 0)

    @property
    def next_revision(self) -> int:
        return self._next_rev

    @property
    def created(self) -> bool:
        return self._created

    def __aiter__(self) -> MemoryWatcher:
        return self

    async def __anext__(self) -> WatchBatch:
        await asyncio.sleep(0)  # a read from a stream always yields to the loop
        while not self._closed:
            if not self._created:
                if self._host.connected:
                    self._create()
                    continue
            elif self._queue:
                batch = self._queue.popleft()
                if batch.events:
                    self._next_rev = batch.events[-1].revision + 1
                else:
                    self._next_rev = max(self._next_rev, batch.revision + 1)
                return batch
            self._wake.clear()
            await self._wake.wait()
        raise StopAsyncIteration

    async def request_progress(self) -> bool:
        """Ask for a progress notification now. False when no stream is open at the moment."""
        if not self._created or self._closed:
            return False
        self.queue_progress(self._host.current_revision())
        return True

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._created = False
            self._queue.clear()
            self._host.forget_watch(self)
            self._wake.set()

    async def __aenter__(self) -> MemoryWatcher:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ---- driven by the client and server --------------------------------------------------------

    def _create(self) -> None:
        try:
            self._host.open_watch(self)
        except BaseException:
            self._closed = True  # a compacted watch is cancelled for good, as etcd cancels it
            self._host.forget_watch(self)
            raise

    def on_created(self, start: int, current: int, history: Sequence[WatchEvent], compact_revision: int) -> None:
        """The server created the watch at `start` (resolved from 0 if need be) and replays `history`."""
        self._created = True
        if self._next_rev == 0:
            self._next_rev = start
        self._min_rev = start
        events = self._select(history, compact_revision)
        if events:
            self._push(WatchBatch(current, events))

    def on_revision(self, revision: int, events: Sequence[WatchEvent], compact_revision: int) -> None:
        """Live events of one revision (the server sends every write's events to every watch)."""
        if not self._created or revision < self._min_rev:
            return
        selected = self._select(events, compact_revision)
        if selected:
            self.progress_allowed = False
            self._push(WatchBatch(revision, selected))

    def queue_progress(self, revision: int) -> None:
        self._push(WatchBatch(revision, ()))

    def break_stream(self) -> None:
        """The connection dropped: undelivered batches are lost; the watch resumes from
        `next_revision` once the client is connected again."""
        if self._created:
            self._created = False
            self._queue.clear()
            self.reconnects += 1

    def wake(self) -> None:
        self._wake.set()

    def _select(self, events: Sequence[WatchEvent], compact_revision: int) -> tuple[WatchEvent, ...]:
        selected = []
        for event in events:
            if not in_range(event.kv.key, self.key, self.range_end):
                continue
            if (self._drop_puts and event.type is EventType.PUT) or (
                self._drop_deletes and event.type is EventType.DELETE
            ):
                continue
            # etcd reads prev_kv at the event's revision - 1 when it sends the event: nothing there
            # once that revision is compacted.
            keep_prev = self.prev_kv and event.revision - 1 >= compact_revision
            selected.append(event if keep_prev or event.prev_kv is None else replace(event, prev_kv=None))
        return tuple(selected)

    def _push(self, batch: WatchBatch) -> None:
        self._queue.append(batch)
        self._wake.set()
