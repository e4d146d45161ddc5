"""The worker's half of start confirmation (docs/workers.md, "Start confirmation").

An assignment that carries a `start_timeout` runs only once a planner has recorded its start: the
worker sends `Started` on the stream the assignment came on and waits for the `StartAck`. STARTED:
run the handler. REFUSED, no answer within `start_timeout` of receipt, or the stream gone: the
handler never runs (the owner has re-dispatched it, or will once its start-by passes, and a late
STARTED for a dropped attempt is ignored). Requests of attempts received together share one message.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler.worker.attempt import Attempt, AttemptKey

Send = Callable[[str, wpb.WorkerMessage], bool]  # (stream address, message) -> sent


class StartGate:
    def __init__(self, send: Send) -> None:
        self._send = send
        self._waiting: dict[AttemptKey, asyncio.Future[str]] = {}  # -> "" (started) or why refused
        self._outgoing: dict[str, list[wpb.StartRequest]] = {}
        self._flush_pending = False
        self.refused = 0
        self.timed_out = 0

    def __len__(self) -> int:
        return len(self._waiting)

    async def confirm(self, attempt: Attempt, timeout: float) -> str:
        """Ask for the start and wait at most `timeout` seconds (what is left of the assignment's
        start_timeout): "" to run, else why not to."""
        if timeout <= 0:
            self.timed_out += 1
            return "start_timeout passed before the start could be asked for"
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiting[attempt.key] = fut
        ctx = attempt.ctx
        self._outgoing.setdefault(attempt.origin, []).append(wpb.StartRequest(
            execution_id=ctx.execution_id, attempt=ctx.attempt,
            fencing_token={"partition": ctx.fencing_token.partition, "revision": ctx.fencing_token.revision}))
        if not self._flush_pending:  # attempts of one Assignments message share one Started message
            self._flush_pending = True
            asyncio.get_running_loop().call_soon(self._flush)
        # A timer that answers the future itself: cheaper than wait_for's wrapper on every execution.
        timer = asyncio.get_running_loop().call_later(timeout, self._expire, fut, attempt)
        try:
            return await fut
        finally:
            timer.cancel()
            if self._waiting.get(attempt.key) is fut:
                del self._waiting[attempt.key]
            if not fut.done():
                fut.cancel()

    def _expire(self, fut: asyncio.Future[str], attempt: Attempt) -> None:
        if not fut.done():
            self.timed_out += 1
            # Its planner never answered: it may be frozen or cut off with the start recorded, so the
            # not_started result goes to another planner first (worker/outbox.py).
            attempt.origin_silent = True
            fut.set_result(f"no start acknowledgement within start_timeout ({attempt.start_timeout:g} s after receipt)")

    def _flush(self) -> None:
        self._flush_pending = False
        out, self._outgoing = self._outgoing, {}
        for address, reqs in out.items():
            if not self._send(address, wpb.WorkerMessage(started=wpb.Started(starts=reqs))):
                for r in reqs:  # the stream is gone: nobody can record the start now
                    self._answer(r.execution_id, r.attempt, "its planner stream closed before the start was asked for")

    def _answer(self, execution_id: str, attempt: int, why: str) -> None:
        fut = self._waiting.get((execution_id, attempt))
        if fut is not None and not fut.done():
            if why:
                self.refused += 1
            fut.set_result(why)

    def on_ack(self, ack: wpb.StartAck) -> None:
        for a in ack.acks:
            ok = a.disposition == wpb.START_DISPOSITION_STARTED
            self._answer(a.execution_id, a.attempt, "" if ok else f"start refused: {a.reason or 'no reason given'}")

    def stream_lost(self, address: str, pending: list[Attempt]) -> None:
        """Requests in flight on a broken stream get no answer: refuse them at once (never run)."""
        for a in pending:
            if a.origin == address:
                self._answer(a.ctx.execution_id, a.ctx.attempt,
                             "its planner stream broke before the start was acknowledged")
        with contextlib.suppress(KeyError):
            del self._outgoing[address]
