"""LeaseKeeper: one persistent keepalive stream per lease, and a local deadline for self-fencing.

Safety rule (DESIGN.md, Ownership and fencing): a planner must stop acting as owner *before* etcd can
expire its lease. etcd restarts a lease's TTL when it processes a keepalive, which happens after the
client sent it; so the time a keepalive was *sent* plus the TTL is an upper bound of the server-side
expiry, whatever the network delays. The keeper records, for the latest acknowledged keepalive, the
monotonic time it was sent (`last_ack`), and `deadline() = last_ack + TTL - safety_margin`.

A lost lease stays lost: once etcd answers TTL <= 0, or the local deadline passes without an
acknowledgement, the keeper stops for good. It never re-grants and never lets a late acknowledgement
move a passed deadline forward; the caller must start a new session with a new lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import deque
from typing import Any

import grpc

from scheduler.store.etcd import _pb
from scheduler.store.etcd.connection import EOF, Connection, reauthenticate_after
from scheduler.store.etcd.deadline import LeaseDeadline, LeaseLostReason
from scheduler.store.etcd.errors import LeaseNotFound, from_rpc_error
from scheduler.store.etcd.types import Lease
from scheduler.tasks import cancel_and_wait

__all__ = ["LeaseKeeper", "LeaseLostReason"]

log = logging.getLogger(__name__)

_BACKOFF = (0.05, 1.0)  # pause before reopening a broken stream: first, largest (seconds)


class _StreamStalled(Exception):
    """The oldest keepalive on this stream went unanswered for too long: reopen the stream."""


class LeaseKeeper(LeaseDeadline):
    def __init__(
        self,
        conn: Connection,
        lease: Lease,
        *,
        safety_margin: float,
        renew_interval: float | None = None,
        ack_timeout: float | None = None,
    ) -> None:
        super().__init__(conn.clock, lease, safety_margin=safety_margin, renew_interval=renew_interval,
                         ack_timeout=ack_timeout)
        self._conn = conn
        self._task: asyncio.Task[None] | None = None
        self._call: Any = None  # the keepalive stream open now (cancelled by stop())
        self.streams_opened = 0

    async def wait_lost(self) -> LeaseLostReason:
        """Wait until the lease is lost. Wakes at the deadline by itself, so it returns in time
        even if the renewing task has stopped."""
        while (reason := self.lost_reason) is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._lost_event.wait(), timeout=max(self.remaining(), 0.001))
        return reason

    # ---- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("a LeaseKeeper is started once")
        self._task = asyncio.create_task(self._run(), name=f"lease-keeper-{self.lease_id:x}")

    async def stop(self) -> None:
        """Stop renewing (the lease then expires on its own within TTL unless revoked)."""
        if self._task is not None:
            # The stream first: a keepalive write waiting on a stuck stream is not ended by cancelling its
            # task (wait_for waits for the write to give up, which it does only when the call is cancelled),
            # and a node shutting down waited for it for ever (seen in the test suite under load).
            if self._call is not None:
                self._call.cancel()
            self._task.cancel()
            # Bounded all the same: a keeper that still does not end is abandoned (its lease expires on
            # its own), never waited for. The caller's own cancellation propagates from asyncio.wait.
            done, _ = await asyncio.wait({self._task}, timeout=self.ack_timeout + 1.0)
            if not done:
                log.warning("lease %x keeper did not stop within %.1fs; abandoned", self.lease_id,
                            self.ack_timeout + 1.0)
            elif not self._task.cancelled() and (exc := self._task.exception()) is not None:
                raise exc

    async def __aenter__(self) -> LeaseKeeper:
        if self._task is None:
            self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # ---- internals ------------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._renew_until_lost()
        except Exception:
            # A bug must not pass silently; the deadline still fences the caller (see wait_lost).
            log.exception("lease %x keeper crashed; renewals stopped", self.lease_id)

    async def _renew_until_lost(self) -> None:
        pause = _BACKOFF[0]
        while self.lost_reason is None:
            token = self._conn.token
            try:
                await self._one_stream()
            except grpc.aio.AioRpcError as exc:
                if isinstance(from_rpc_error(exc, write=False), LeaseNotFound):
                    self._mark_lost(LeaseLostReason.EXPIRED)
                    break
                await reauthenticate_after(self._conn, exc, token)  # then back off like any other break
                self._renew_failed("stream_error")
                log.info("lease %x keepalive stream broke: %s %s", self.lease_id, exc.code(), exc.details())
            except _StreamStalled:
                self._renew_failed("stalled")
                log.info("lease %x keepalive unanswered for %.2fs, reopening", self.lease_id, self.ack_timeout)
            except asyncio.InvalidStateError:
                self._renew_failed("stream_error")
                log.info("lease %x keepalive stream ended while writing, reopening", self.lease_id)
            if self.lost_reason is None:
                await asyncio.sleep(max(0.0, min(pause, self.remaining())))
                pause = min(pause * 2, _BACKOFF[1])

    def _renew_failed(self, reason: str) -> None:
        if self.observer is not None:
            self.observer.renew_failed(reason)

    async def _one_stream(self) -> None:
        call: Any = self._conn.stream(self._conn.stubs.lease.LeaseKeepAlive)
        self._call = call
        self.streams_opened += 1
        sent: deque[float] = deque()  # send times of unanswered keepalives; etcd answers in order
        reader = asyncio.create_task(self._read_acks(call, sent))
        try:
            next_send = self._clock()
            while self.lost_reason is None:
                now = self._clock()
                if sent and now - sent[0] >= self.ack_timeout:
                    raise _StreamStalled
                if now >= next_send:
                    sent.append(now)
                    try:
                        # Bounded: a stream waiting for a connection must not hold us past the deadline.
                        await asyncio.wait_for(call.write(_pb.lease_keepalive_request(self.lease_id)),
                                               timeout=max(self.ack_timeout, 0.001))
                    except TimeoutError:
                        raise _StreamStalled from None
                    next_send = now + self.renew_interval
                wake = min(next_send, self.deadline(), sent[0] + self.ack_timeout if sent else math.inf)
                await asyncio.wait({reader}, timeout=max(0.0, wake - self._clock()))
                if reader.done():
                    reader.result()  # raises the stream's error; a clean end means "reopen"
                    return
        finally:
            reader.cancel()
            call.cancel()
            with contextlib.suppress(grpc.aio.AioRpcError):
                await cancel_and_wait(reader)

    async def _read_acks(self, call: Any, sent: deque[float]) -> None:
        while self._lost is None:
            response = await call.read()
            if response is EOF:
                return
            if sent:  # an answer with nothing outstanding cannot be matched to a send time: ignore
                self._on_ack(sent.popleft(), int(response.TTL))
