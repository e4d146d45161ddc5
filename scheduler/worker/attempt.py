"""One attempt on this worker: run its handler under the time limit, honour stop requests, and turn
whatever happened into an `Outcome` with the right error class."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Any

from scheduler.worker.context import ExecutionContext
from scheduler.worker.errors import PermanentError, TaskTimeout, TransientError

Handler = Callable[[ExecutionContext, bytes], Coroutine[Any, Any, None]]
AttemptKey = tuple[str, int]  # (execution_id, attempt)

MAX_MESSAGE_BYTES = 4096  # Result.message limit in the proto
DRAIN_MESSAGE = "worker draining"
ORPHANED_MESSAGE = ("stopped by the worker: its planner stream was gone for longer than the heartbeat timeout "
                    "and no planner re-attached it (the planner times it out too)")


class Status(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class ErrorClass(StrEnum):
    NONE = ""
    TRANSIENT = "transient"
    PERMANENT = "permanent"
    UNKNOWN = "unknown"
    TIMEOUT = "timeout"


class Stop(StrEnum):
    """Why the worker stopped an attempt before its handler finished; the first reason wins."""

    CANCEL = "cancel"  # the planner sent Cancel
    TIMEOUT = "timeout"  # the local execution timeout passed
    DRAIN = "drain"  # the worker is shutting down and the grace ran out
    REJECTED = "rejected"  # a planner refused to re-attach it: a newer attempt may run elsewhere
    ORPHANED = "orphaned"  # its planner stream was gone past the heartbeat timeout and no planner re-attached it
    DISARM = "disarm"  # handed out ahead of its time and not wanted started after all (wpb.Disarm)


class State(Enum):
    PENDING = "pending"  # received, handler not started: can still be handed back on drain
    RUNNING = "running"
    DONE = "done"
    RETURNED = "returned"  # handed back unstarted (Drain.returned); no result is sent


@dataclass(frozen=True)
class Outcome:
    status: Status
    error_class: ErrorClass = ErrorClass.NONE
    message: str = ""
    retry_after: float | None = None
    not_started: bool = False  # the handler never ran (start refused or unconfirmed): re-dispatched at once


def truncate(text: str, limit: int = MAX_MESSAGE_BYTES) -> str:
    data = text.encode()
    return text if len(data) <= limit else data[:limit].decode(errors="ignore")


def classify(exc: BaseException) -> Outcome:
    """A handler's exception -> outcome. Anything untyped is UNKNOWN: the effect may have happened."""
    if isinstance(exc, TransientError):
        return Outcome(Status.FAILED, ErrorClass.TRANSIENT, truncate(str(exc) or "transient error"), exc.retry_after)
    if isinstance(exc, PermanentError):
        return Outcome(Status.FAILED, ErrorClass.PERMANENT, truncate(str(exc) or "permanent error"))
    if isinstance(exc, TaskTimeout):
        return Outcome(Status.FAILED, ErrorClass.TIMEOUT, truncate(str(exc) or "handler timed out"))
    return Outcome(Status.FAILED, ErrorClass.UNKNOWN, truncate(f"{type(exc).__name__}: {exc}"))


class Attempt:
    def __init__(self, ctx: ExecutionContext, payload: bytes, handler: Handler | None, origin: str,
                 timeout: float | None, start_timeout: float | None = None, received: float = 0.0,
                 start_in: float = 0.0) -> None:
        self.ctx = ctx
        self.payload = payload
        self.handler = handler
        self.origin = origin  # address of the planner stream it came on; results prefer that stream
        # Its planner never answered the start request in time (worker/starts.py): results avoid it first.
        self.origin_silent = False
        self.timeout = timeout
        # Start confirmation: the handler runs only after a StartAck, asked for within this long of
        # `received` (monotonic); None: the planner does not confirm starts, run at once.
        self.start_timeout = start_timeout
        self.received = received
        # Start ahead: the handler runs this many seconds after `received` (monotonic), once confirmed.
        self.start_in = start_in
        self.armed_ms: int | None = None  # wall ms it began waiting for that instant, start confirmed
        self.wake: asyncio.Future[None] | None = None  # ends that wait early (a stop)
        self.state = State.PENDING
        self.stop: Stop | None = None
        self.started_ms: int | None = None
        self.task: asyncio.Task[None] | None = None  # the worker's task around run()
        self._inner: asyncio.Task[None] | None = None  # the handler itself
        self._force: asyncio.TimerHandle | None = None
        self.orphaned_at: float | None = None  # monotonic time its origin stream was first seen down

    @property
    def key(self) -> AttemptKey:
        return (self.ctx.execution_id, self.ctx.attempt)

    def request_stop(self, reason: Stop, grace: float = 0.0, message: str = "") -> None:
        """Signal the handler (ctx.cancelled), then cancel its task after `grace` seconds if it has not
        returned by itself. A cooperative handler gets the chance to clean up."""
        if self.stop is None:
            self.stop = reason
            self.ctx.cancel_reason = message or reason.value
        self.ctx.cancel_event.set()
        if self.wake is not None and not self.wake.done():
            self.wake.set_result(None)
        if self._inner is None or self._inner.done():
            return
        if grace <= 0:
            self._inner.cancel()
        elif self._force is None:
            self._force = asyncio.get_running_loop().call_later(grace, self._inner.cancel)

    async def run(self) -> Outcome:
        """Run the handler to its end, its time limit, or a stop. Cancelling this coroutine (a hard
        close of the worker) cancels the handler too."""
        if self.stop is not None:  # stopped before it started: the handler never ran
            return self._stopped_outcome()
        if self.handler is None:
            return Outcome(Status.FAILED, ErrorClass.PERMANENT,
                           f"no handler for task type {self.ctx.task_type!r} on this worker")
        self.state = State.RUNNING
        self.started_ms = self.ctx.clock.wall_ms()
        self._inner = asyncio.create_task(self.handler(self.ctx, self.payload))
        try:
            done, _ = await asyncio.wait({self._inner}, timeout=self.ctx.remaining())
            if not done:
                self.request_stop(Stop.TIMEOUT)
                await asyncio.wait({self._inner})
        except asyncio.CancelledError:
            self._inner.cancel()
            with contextlib.suppress(BaseException):
                await self._inner
            raise
        finally:
            if self._force is not None:
                self._force.cancel()
        if self.stop is not None:
            # Once a stop was asked for, a handler that returns early has most likely not finished
            # its work, so the stop decides the outcome whatever the handler did. Its exception (a
            # command killed by the stop's SIGTERM) is taken, or asyncio logs "Task exception was never
            # retrieved" at ERROR for each: a game day's workers logged 726.
            if not self._inner.cancelled():
                self._inner.exception()
            return self._stopped_outcome()
        if self._inner.cancelled():
            return Outcome(Status.FAILED, ErrorClass.UNKNOWN, "handler was cancelled")
        exc = self._inner.exception()
        return Outcome(Status.SUCCEEDED) if exc is None else classify(exc)

    def _stopped_outcome(self) -> Outcome:
        if self.stop is Stop.TIMEOUT:
            limit = "" if self.timeout is None else f" ({self.timeout:g} s)"
            return Outcome(Status.FAILED, ErrorClass.TIMEOUT, f"no result within the execution timeout{limit}")
        if self.stop is Stop.ORPHANED:
            # The same class as the planner's own timeout of it: whichever is recorded first wins.
            return Outcome(Status.FAILED, ErrorClass.TIMEOUT, ORPHANED_MESSAGE)
        if self.stop is Stop.DISARM:
            return Outcome(Status.FAILED, ErrorClass.TRANSIENT, f"not started: {self.ctx.cancel_reason}",
                           not_started=True)
        if self.stop is Stop.DRAIN:
            # Not TIMEOUT/UNKNOWN: nothing is wrong with the execution, so it is retried elsewhere at once.
            return Outcome(Status.FAILED, ErrorClass.TRANSIENT, DRAIN_MESSAGE)
        return Outcome(Status.CANCELLED, ErrorClass.NONE, truncate(self.ctx.cancel_reason))
