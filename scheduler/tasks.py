"""Stopping asyncio tasks without swallowing the caller's own cancellation.

`task.cancel(); with suppress(CancelledError): await task` absorbs the task's CancelledError, but
also the caller's if the caller is cancelled while it waits: the caller then carries on as if nobody
had asked it to stop. A node shut down while its lease keeper was being stopped (a session lost at the
same moment) went on to open a new session, and the shutdown waited for it for ever.
"""

from __future__ import annotations

import asyncio
from typing import Any


def cancelled_by_caller() -> bool:
    """Whether the running task has a cancellation request of its own pending."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def cancel_and_wait(task: asyncio.Future[Any]) -> None:
    """Cancel `task` and wait until it has ended. Its cancellation is absorbed; the caller's is not.
    Any other exception the task ends with propagates."""
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        if cancelled_by_caller():
            raise
