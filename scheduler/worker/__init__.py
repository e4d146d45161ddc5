"""The Python worker SDK (docs/workers.md): `Worker`, the handler's `ExecutionContext`, and the
exceptions that classify a failure. Built-in executors are in `scheduler.worker.executors`."""

from typing import TYPE_CHECKING

from scheduler.ids import FencingToken
from scheduler.worker.context import ExecutionContext
from scheduler.worker.errors import PermanentError, TaskTimeout, TransientError
from scheduler.worker.settings import WorkerSettings

if TYPE_CHECKING:
    from scheduler.worker.worker import Worker


def __getattr__(name: str) -> object:
    # `Worker` (gRPC, prometheus, the executors' machinery) is loaded on first use, so that importing
    # `scheduler.worker.settings`, as every `schedctl` command does for its flags, stays cheap (PEP 562).
    if name == "Worker":
        from scheduler.worker.worker import Worker

        return Worker
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "ExecutionContext",
    "FencingToken",
    "PermanentError",
    "TaskTimeout",
    "TransientError",
    "Worker",
    "WorkerSettings",
]
