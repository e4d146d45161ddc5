"""Built-in executors, usable without writing a handler: `shell` and `http` (docs/workers.md)."""

from __future__ import annotations

from scheduler.clock import SYSTEM_CLOCK, Clock
from scheduler.worker.context import ExecutionContext
from scheduler.worker.errors import PermanentError
from scheduler.worker.executors.http import HttpExecutor
from scheduler.worker.executors.shell import ShellExecutor
from scheduler.worker.settings import WorkerSettings
from scheduler.worker.worker import Worker

__all__ = ["HttpExecutor", "ShellExecutor", "register_builtin"]


SHELL_OFF = ("shell executions are off on this worker: whoever may create a schedule could run any command "
             "here; start the worker with --allow-shell (allow_shell = true) to run them")


async def refuse_shell(ctx: ExecutionContext, payload: bytes) -> None:
    """The `shell` task type of a worker without allow_shell: a permanent failure that says why, so the
    execution is dead-lettered with the reason instead of waiting for a worker that never comes."""
    raise PermanentError(SHELL_OFF)


def register_builtin(worker: Worker, settings: WorkerSettings, clock: Clock = SYSTEM_CLOCK) -> None:
    """Task types `shell` (runs commands only with allow_shell; refuses them otherwise) and `http`; the HTTP
    connection pool is closed with the worker."""
    if settings.allow_shell:
        worker.task("shell")(ShellExecutor(kill_grace=settings.shell_kill_grace))
    else:
        worker.task("shell")(refuse_shell)
    worker.task("http")(HttpExecutor(default_timeout=settings.http_timeout, clock=clock))
