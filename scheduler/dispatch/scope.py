"""What one worker stream may touch: executions of its own pool, of a tenant that pool serves.

The pool is checked once, on Hello (the principal must hold `<pool>:worker`), and assignments only ever
go to a stream of the execution's pool whose tenants the pool serves (dispatch/service.py `submit`). The
other direction needs the same rule: every message a worker sends back about an execution (a result, a
start request, a re-attach on Hello or in a heartbeat, a drain's hand-back) names the execution by id,
and the id is the worker's to choose. Without this check a worker of pool `payments` could finish,
start or keep alive a run of another pool or another tenant just by naming it, since results are
recorded by compare-and-swap on the ledger, not by who was sent the work.

A stream's scope is built on Hello when auth is on; with auth off there is none (every worker is
trusted, the dev cluster). The planner's own reports (a refused dispatch recorded as a failure) carry
no scope either.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from scheduler.execution import Execution

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Scope:
    principal: str  # who authenticated the stream (for the log line of a refusal)
    pool: str  # Hello.pool, which the principal was checked to serve
    tenants: frozenset[str] | None  # the tenants the pool serves ([pools] of the auth file); None: all

    @classmethod
    def of(cls, principal: str, pool: str, pools: Mapping[str, frozenset[str]]) -> Scope:
        return cls(principal, pool, pools.get(pool))

    def refusal(self, e: Execution) -> str:
        """Why this stream may not report on `e` ("" if it may)."""
        if e.pool != self.pool:
            return f"execution {e.id} belongs to pool {e.pool!r}, not to this stream's pool {self.pool!r}"
        if self.tenants is not None and e.tenant not in self.tenants:
            return f"execution {e.id} is of tenant {e.tenant!r}, which pool {self.pool!r} does not serve"
        return ""


def refused(scope: Scope | None, e: Execution, what: str, worker: str) -> str:
    """`scope.refusal(e)`, logged when it refuses (`what`: result, start, re-attach, ...)."""
    if scope is None:
        return ""
    why = scope.refusal(e)
    if why:
        log.warning("worker report refused: %s", why, extra={
            "event": "worker_report_refused", "what": what, "worker": worker, "principal": scope.principal,
            "stream_pool": scope.pool, "execution_id": e.id, "pool": e.pool, "tenant": e.tenant})
    return why
