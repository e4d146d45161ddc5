"""The worker's half of start confirmation (docs/workers.md, "Start confirmation").

An assignment that carries a `start_timeout` runs only once a planner has recorded its start: the
worker sends `Started` on the stream the assignment came on and waits for the `StartAck`. STARTED:
run the handler. REFUSED, no answer within `start_timeout` of receipt, or the stream gone: the
handler never runs (the owner has re-dispatched it, or will once its start-by passes, and a late
STARTED for a dropped attempt is ignored). UNKNOWN (etcd did not answer that planner, which may have
recorded the start): the same request goes to another connected planner, which reads the record and
answers for it; with none left to ask, it is refused. Requests of attempts received together share
one message.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler.worker.attempt import Attempt, AttemptKey

Send = Callable[[str, wpb.WorkerMessage], bool]  # (stream address, message) -> sent


@dataclass
class _Asked:
    attempt: Attempt
    request: wpb.StartRequest
    on: str  # the stream the request was last sent on
    asked: set[str] = field(default_factory=set)  # every stream it was sent on


class StartGate:
    def __init__(self, send: Send, connected: Callable[[], Sequence[str]] = tuple) -> None:
        self._send = send
        self._connected = connected
        self._waiting: dict[AttemptKey, asyncio.Future[str]] = {}  # -> "" (started) or why refused
        self._asked: dict[AttemptKey, _Asked] = {}
        self._outgoing: dict[str, list[wpb.StartRequest]] = {}
        self._flush_pending = False
        self.refused = 0
        self.timed_out = 0
        self.asked_again = 0  # UNKNOWN answers sent on to another planner

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
        req = wpb.StartRequest(
            execution_id=ctx.execution_id, attempt=ctx.attempt,
            fencing_token={"partition": ctx.fencing_token.partition, "revision": ctx.fencing_token.revision})
        self._asked[attempt.key] = _Asked(attempt, req, attempt.origin, {attempt.origin})
        self._queue(attempt.origin, req)
        # A timer that answers the future itself: cheaper than wait_for's wrapper on every execution.
        timer = asyncio.get_running_loop().call_later(timeout, self._expire, fut, attempt)
        try:
            return await fut
        finally:
            timer.cancel()
            if self._waiting.get(attempt.key) is fut:
                del self._waiting[attempt.key]
                self._asked.pop(attempt.key, None)
            if not fut.done():
                fut.cancel()

    def _queue(self, address: str, req: wpb.StartRequest) -> None:
        self._outgoing.setdefault(address, []).append(req)
        if not self._flush_pending:  # attempts of one Assignments message share one Started message
            self._flush_pending = True
            asyncio.get_running_loop().call_soon(self._flush)

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

    def on_ack(self, ack: wpb.StartAck, address: str = "") -> None:
        for a in ack.acks:
            if a.disposition == wpb.START_DISPOSITION_UNKNOWN:
                x = self._asked.get((a.execution_id, a.attempt))
                if x is not None and x.on != address:
                    continue  # not the planner asked last: its answer is not awaited
                if self._ask_again(a, address):
                    continue
            ok = a.disposition == wpb.START_DISPOSITION_STARTED
            self._answer(a.execution_id, a.attempt, "" if ok else f"start refused: {a.reason or 'no reason given'}")

    def _ask_again(self, a: wpb.StartAckEntry, address: str) -> bool:
        """The planner at `address` could not tell whether it recorded the start (etcd did not answer it):
        send the request to a connected planner not asked yet. False if there is none (refused then). Safe
        as any start: the other planner answers STARTED only for a record RUNNING for this worker at this
        attempt, or after its own CAS from DISPATCHED under the attempt's token."""
        x = self._asked.get((a.execution_id, a.attempt))
        if x is None:
            return False
        x.attempt.origin_silent = True  # its not_started result, if it comes to that, goes elsewhere first
        other = next((c for c in self._connected() if c not in x.asked), None)
        if other is None:
            return False
        x.on = other
        x.asked.add(other)
        self.asked_again += 1
        self._queue(other, x.request)
        return True

    def stream_lost(self, address: str, pending: list[Attempt]) -> None:
        """Requests in flight on a broken stream get no answer: refuse them at once (never run)."""
        for a in pending:
            x = self._asked.get(a.key)
            if (x.on if x is not None else a.origin) == address:
                self._answer(a.ctx.execution_id, a.ctx.attempt,
                             "its planner stream broke before the start was acknowledged")
        with contextlib.suppress(KeyError):
            del self._outgoing[address]
