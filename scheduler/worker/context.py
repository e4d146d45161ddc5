"""What a handler knows about the attempt it runs: identity, fencing token, time limits, cancellation."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from scheduler.clock import Clock
from scheduler.ids import FencingToken, format_rfc3339_ms
from scheduler.timeplan.plan import to_ms

OUTPUT_TAIL_BYTES = 4096  # per stream: the tail of stdout/stderr kept on the attempt


@dataclass(frozen=True)
class ExecutorOutput:
    """What an executor that runs a process reports with the result (kept on the attempt record)."""

    stdout_tail: str = ""
    stderr_tail: str = ""
    exit_code: int | None = None  # negative: killed by that signal


def tail(data: bytes, limit: int = OUTPUT_TAIL_BYTES) -> str:
    """The last `limit` bytes as text (a multi-byte character cut at the edge is dropped)."""
    return data[-limit:].decode(errors="ignore") if len(data) > limit else data.decode(errors="replace")


@dataclass
class ExecutionContext:
    execution_id: str
    schedule_id: str
    tenant: str
    task_type: str
    attempt: int
    fencing_token: FencingToken
    planned_at: datetime  # aware, UTC
    deadline: datetime | None  # planner wall time after which the planner times the attempt out
    trigger: str  # scheduled, manual, rerun, backfill, replay (lower case; unspecified if not given)
    worker_id: str
    clock: Clock = field(repr=False)
    # Monotonic instant (of `clock`) when the worker stops the handler; None = no limit. Taken from the
    # assignment's timeout at receipt, so a skewed wall clock cannot shorten or stretch it.
    local_deadline: float | None = field(default=None, repr=False)
    cancel_event: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    cancel_reason: str = ""
    output: ExecutorOutput | None = None  # set by executors that capture a process's output (shell)

    @property
    def idempotency_key(self) -> str:
        """The execution id: the same for every attempt of this planned time. Make a repeat harmless."""
        return self.execution_id

    @property
    def cancelled(self) -> bool:
        """True once the planner asked to stop this attempt (or the worker is stopping it)."""
        return self.cancel_event.is_set()

    @property
    def planned_at_rfc3339(self) -> str:
        """Planned time as RFC 3339 UTC with milliseconds, the form used in execution ids."""
        return format_rfc3339_ms(to_ms(self.planned_at))

    def remaining(self) -> float | None:
        """Seconds left before the worker stops the handler (>= 0), or None without a limit."""
        if self.local_deadline is None:
            return None
        return max(0.0, self.local_deadline - self.clock.monotonic())

    def log_fields(self) -> dict[str, object]:
        """Fields every execution log line carries, so logs join on the ids without parsing text."""
        return {
            "execution_id": self.execution_id,
            "schedule_id": self.schedule_id,
            "partition": self.fencing_token.partition,
            "token": str(self.fencing_token),
            "attempt": self.attempt,
            "task_type": self.task_type,
        }


async def stopped_first(ctx: ExecutionContext, work: asyncio.Future[Any], timeout: float | None = None) -> bool:
    """Wait for `work` or a stop (`ctx.cancel_event`), at most `timeout` seconds (TimeoutError): True if the stop
    came first. `work` is cancelled, and awaited, if it has not finished: an executor stops what it was
    waiting for (a command's wait, a request) the moment the stop is asked for, not when the worker cancels
    the handler `cancel_grace` later."""
    stopped = asyncio.ensure_future(ctx.cancel_event.wait())
    try:
        done, _ = await asyncio.wait({work, stopped}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not work.done():
            work.cancel()
            with contextlib.suppress(BaseException):
                await work
    if not done:
        raise TimeoutError
    return work not in done
