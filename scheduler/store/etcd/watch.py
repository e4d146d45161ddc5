"""Watcher: an async iterator over watch responses that survives disconnects without losing events.

It remembers the next revision it still needs (last delivered revision + 1, advanced also by progress
notifications) and, when the stream breaks (etcd restarted, member lost its leader, connection cut),
re-creates the watch from exactly that revision after a backoff. etcd delivers all events of one
revision in one response (fragmentation is off), so resuming at a revision boundary neither drops
nor repeats events. If that revision has been compacted meanwhile, `Compacted` is raised: the caller
must re-list and watch again from the list's revision.

A stream can also go silent without breaking: a SIGSTOPped (or wedged) member keeps its TCP connection
up, and gRPC notices only when a keepalive ping goes unanswered (10 + 5 s by default), while every
change meanwhile waits. So a read that has waited half of `watch_stall_timeout` sends a progress request,
which a healthy member answers at once (or, while the watch is catching up, its events keep coming);
one left unanswered until the whole timeout has passed drops the stream, and it is re-created from the
next revision like a broken one (on whichever member the channel picks: the outlier ejection of
connection.py keeps a member that fails calls out of it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Sequence
from typing import Any

import grpc

from scheduler.store.etcd import _pb
from scheduler.store.etcd.connection import EOF, Connection, reauthenticate_after
from scheduler.store.etcd.errors import Compacted, EtcdError, Unavailable, from_rpc_error
from scheduler.store.etcd.types import WatchBatch, WatchFilter

__all__ = ["Watcher"]

log = logging.getLogger(__name__)

_BACKOFF = (0.05, 2.0)  # pause before re-creating a broken watch: first, largest (seconds)


class Watcher:
    """`async for batch in watcher`: events in revision order, and progress notifications as
    batches without events. Close it (or use `async with`) to end the stream."""

    def __init__(
        self,
        conn: Connection,
        key: bytes,
        range_end: bytes,
        *,
        start_revision: int = 0,
        progress_notify: bool = False,
        prev_kv: bool = False,
        filters: Sequence[WatchFilter] = (),
    ) -> None:
        self._conn = conn
        self._key = key
        self._range_end = range_end
        self._next_rev = start_revision  # 0 until etcd tells us what "now" was
        self._progress_notify = progress_notify
        self._prev_kv = prev_kv
        self._filters = tuple(filters)
        self._call: Any = None
        self._opening: Any = None
        self._closed = False
        self._pause = _BACKOFF[0]
        self.reconnects = 0
        self.stalls = 0  # streams dropped for silence (a subset of reconnects)
        self._stall_timeout = conn.config.watch_stall_timeout
        self._guard: asyncio.Task[None] | None = None
        self._waiting_since: float | None = None  # loop time the pending read began (None: no read pending)
        self._asked_at = 0.0  # loop time of the guard's latest progress request on this stream
        # The guard's progress requests not yet written, each with the call it is written on (closed with us).
        self._asks: dict[asyncio.Task[bool], Any] = {}

    @property
    def revision(self) -> int:
        """Every event at or below this revision has been delivered (0: nothing known yet)."""
        return max(self._next_rev - 1, 0)

    def __aiter__(self) -> Watcher:
        return self

    async def __anext__(self) -> WatchBatch:
        while not self._closed:
            if self._call is None:
                await self._open()
                continue
            token = self._conn.token
            call = self._call
            self._waiting_since = asyncio.get_running_loop().time()
            try:
                response = await call.read()
            except asyncio.CancelledError:
                if self._closed_locally():
                    break
                if self._call_cancelled(call):
                    continue  # re-opened from the next revision
                raise
            except grpc.aio.AioRpcError as exc:
                if self._closed:
                    break
                if self._call is not call:
                    continue  # the guard dropped it: re-opened from the next revision
                await self._on_stream_error(exc, token)
                continue
            finally:
                self._waiting_since = None
            if response is EOF:
                self._drop("etcd ended the stream")
                continue
            batch = self._on_response(response)
            if batch is not None:
                return batch
        raise StopAsyncIteration

    async def request_progress(self) -> bool:
        """Ask etcd for a progress notification now. False when no stream is open at the moment."""
        call = self._call
        return False if call is None else await self._ask(call)

    async def _ask(self, call: Any) -> bool:
        try:
            await call.write(_pb.watch_progress_request())
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling() > 0:
                raise
            return False  # the call was cancelled (dropped by the guard, or closed): the iterator resumes
        except Exception:  # a best-effort probe: whatever the write raises, the iterator resumes
            # The stream broke or was dropped meanwhile (grpc.aio raises several kinds for a write on a call
            # that ended). Raised out of the guard's task, it would only be logged as never retrieved.
            return False
        return True

    async def close(self) -> None:
        self._closed = True
        for call in (self._opening, self._call):
            if call is not None:
                call.cancel()
        self._call = None
        for task in (self._guard, *self._asks):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._guard = None

    async def __aenter__(self) -> Watcher:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ---- internals ------------------------------------------------------------------------------

    def _closed_locally(self) -> bool:
        """True when a CancelledError came from close() cancelling the call, not from our task
        being cancelled (which must propagate)."""
        task = asyncio.current_task()
        return self._closed and (task is None or task.cancelling() == 0)

    async def _open(self) -> None:
        if self._guard is None and self._stall_timeout > 0:
            self._guard = asyncio.create_task(self._watch_for_silence(), name="etcd-watch-stall-guard")
        token = self._conn.token
        call = self._conn.stream(self._conn.stubs.watch.Watch, require_leader=True)
        # Visible to close() while the create request waits for a connection; becomes `_call` only
        # once the create is written, so a progress request can never overtake it.
        self._opening = call
        request = _pb.watch_create_request(
            self._key, self._range_end, self._next_rev, self._progress_notify, self._prev_kv, self._filters
        )
        try:
            await call.write(request)
        except asyncio.CancelledError:
            if not self._closed_locally():
                call.cancel()
                raise
            return
        except grpc.aio.AioRpcError as exc:
            call.cancel()
            if not self._closed:
                await self._on_stream_error(exc, token)
            return
        finally:
            self._opening = None
        self._call = call

    def _call_cancelled(self, call: Any) -> bool:
        """Whether a CancelledError out of `call.read()` is the call's, not our task's: the guard dropped the
        stream, or grpc.aio cancelled the call itself (it does when a write on it is cancelled). Then the
        stream is dropped and re-opened like a broken one. Propagated, it ended the task that iterates us as
        if cancelled: a game day's planner lost its members cache that way after a freeze and claimed no
        partition for 11 minutes."""
        task = asyncio.current_task()
        if task is not None and task.cancelling() > 0:
            return False
        if self._call is call:
            self._drop("cancelled")
        return True

    async def _watch_for_silence(self) -> None:
        """The stall guard (module docstring): checks a pending read four times per timeout."""
        loop = asyncio.get_running_loop()
        half = self._stall_timeout / 2
        while not self._closed:
            await asyncio.sleep(half / 2)
            call, since = self._call, self._waiting_since
            if call is None or since is None:
                continue
            now = loop.time()
            asked = self._asked_at > since  # a progress request is out since this read began
            if asked and now - since >= self._stall_timeout and now - self._asked_at >= half:
                log.warning("watch %r: no answer from etcd for %.1fs, %.1fs after a progress request; "
                            "re-opening it from revision %d", self._key, now - since, now - self._asked_at,
                            self._next_rev)
                self.stalls += 1
                self._drop("silent")
            elif not asked and now - since >= half and call not in self._asks.values():
                # (A request still pending on a call dropped before must not hold up the ones on this call.)
                self._asked_at = now
                # A task of its own, never awaited here nor cancelled while the stream lives: a write the
                # member's flow control holds up must not keep this loop from dropping the stream, and a
                # cancelled write makes grpc.aio cancel the whole call.
                ask = asyncio.create_task(self._ask(call), name="etcd-watch-progress")
                self._asks[ask] = call
                ask.add_done_callback(self._forget_ask)

    def _forget_ask(self, ask: asyncio.Task[bool]) -> None:
        self._asks.pop(ask, None)

    def _on_response(self, r: Any) -> WatchBatch | None:
        revision = int(r.header.revision)
        if r.canceled:
            self._closed = True
            self._call.cancel()
            compact_revision = int(r.compact_revision)
            if compact_revision > 0:
                raise Compacted(compact_revision)
            raise EtcdError(f"etcd canceled the watch: {r.cancel_reason or 'no reason given'}")
        if r.created:
            self._pause = _BACKOFF[0]  # a working stream again
            if self._next_rev == 0:
                self._next_rev = revision + 1
            return None
        events = _pb.watch_events(r)
        if events:
            self._next_rev = events[-1].revision + 1
            return WatchBatch(revision, events)
        # Progress notification: nothing at or below `revision` is still to come on this watch.
        self._next_rev = max(self._next_rev, revision + 1)
        return WatchBatch(revision, ())

    async def _on_stream_error(self, exc: grpc.aio.AioRpcError, token: str | None) -> None:
        self._drop(f"{exc.code()} {exc.details()}")
        if not await reauthenticate_after(self._conn, exc, token):
            err = from_rpc_error(exc, write=False)
            if not isinstance(err, Unavailable):
                self._closed = True
                raise err from exc
        # Back off even after a re-authentication, so that a token etcd keeps refusing cannot spin.
        pause = self._pause * random.uniform(0.5, 1.0)
        self._pause = min(self._pause * 2, _BACKOFF[1])
        log.info("watch %r broke (%s %s); resuming from revision %d in %.2fs",
                 self._key, exc.code(), exc.details(), self._next_rev, pause)
        await asyncio.sleep(pause)

    def _drop(self, why: str) -> None:
        if self._call is not None:
            with contextlib.suppress(Exception):
                self._call.cancel()
            self._call = None
            self.reconnects += 1
            log.debug("watch %r stream dropped: %s", self._key, why)
