"""Built-in executors, usable without writing a handler: `shell` and `http` (docs/workers.md)."""

from __future__ import annotations

from scheduler.clock import SYSTEM_CLOCK, Clock
from scheduler.worker.executors.http import HttpExecutor
from scheduler.worker.executors.shell import ShellExecutor
from scheduler.worker.settings import WorkerSettings
from scheduler.worker.worker import Worker

__all__ = ["HttpExecutor", "ShellExecutor", "register_builtin"]


def register_builtin(worker: Worker, settings: WorkerSettings, clock: Clock = SYSTEM_CLOCK) -> None:
    """Task types `shell` and `http`; the HTTP connection pool is closed with the worker."""
    worker.task("shell")(ShellExecutor(kill_grace=settings.shell_kill_grace))
    worker.task("http")(HttpExecutor(default_timeout=settings.http_timeout, clock=clock))
