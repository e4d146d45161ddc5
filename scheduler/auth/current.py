"""The principal of the call being served, set by the interceptor for the handler's task.

grpc.aio serves each call in its own task, and the interceptor sets this inside the handler it wraps,
so the value is the call's own and needs no reset. None: the server runs without auth (the dev
cluster), or the code runs outside a call.
"""

from __future__ import annotations

from contextvars import ContextVar

from scheduler.auth.principal import Principal

_CURRENT: ContextVar[Principal | None] = ContextVar("sched_principal", default=None)


def current() -> Principal | None:
    return _CURRENT.get()


def set_current(p: Principal | None) -> None:
    _CURRENT.set(p)
