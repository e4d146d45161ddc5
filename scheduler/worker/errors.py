"""Exceptions a handler raises to say how an attempt failed; the class decides whether it is retried.

Anything else a handler raises is ERROR_CLASS_UNKNOWN (retried a bounded number of times), because
the worker cannot tell whether the effect happened.
"""

from __future__ import annotations

from scheduler.errors import SchedError


class TransientError(SchedError):
    """Worth retrying with backoff (a timeout inside the handler, 429, 5xx, a connection error).

    `retry_after` (seconds) is the least delay the target asked for, e.g. HTTP Retry-After; the
    planner waits at least that long before the next attempt.
    """

    def __init__(self, message: str = "", *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PermanentError(SchedError):
    """Retrying cannot help (bad payload, a 4xx): the execution is dead-lettered at once."""


class TaskTimeout(SchedError):
    """The handler gave up because its own time limit passed (e.g. the shell executor's
    `timeout_s`): reported as ERROR_CLASS_TIMEOUT, retried like a transient error."""
