"""The Python worker SDK (docs/workers.md): `Worker`, the handler's `ExecutionContext`, and the
exceptions that classify a failure. Built-in executors are in `scheduler.worker.executors`."""

from scheduler.ids import FencingToken
from scheduler.worker.context import ExecutionContext
from scheduler.worker.errors import PermanentError, TaskTimeout, TransientError
from scheduler.worker.settings import WorkerSettings
from scheduler.worker.worker import Worker

__all__ = [
    "ExecutionContext",
    "FencingToken",
    "PermanentError",
    "TaskTimeout",
    "TransientError",
    "Worker",
    "WorkerSettings",
]
