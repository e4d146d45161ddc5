"""Recording a worker's result: read the record, apply the pure transition, compare-and-swap.

Any planner may do this for any execution (a result must not be lost when ownership moves), so it is
not fenced by a partition token: the CAS on the record's mod_revision plus the attempt check in
`execution.result` make a stale or repeated report harmless. A lost CAS means the record changed
under us (another result, a timeout, a cancel): read again and decide again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from scheduler.errors import NotFound
from scheduler.execution import Disposition, ErrorClass, ExecState, Execution, result
from scheduler.ids import execution_id
from scheduler.store.etcd.ops import Op
from scheduler.store.kv import KV
from scheduler.store.ledger import Ledger

PayloadLookup = Callable[[str], Awaitable[bytes]]


async def record_result(
    kv: KV,
    ledger: Ledger,
    schedule_id: str,
    planned_ms: int,
    attempt: int,
    *,
    succeeded: bool,
    error_class: ErrorClass | None,
    message: str,
    now_ms: int,
    retry_after_ms: int = 0,
    worker: str = "",
    payload_of: PayloadLookup | None = None,
    timeout: float | None = None,
    max_rounds: int = 5,
    extra: Sequence[Op] = (),
    **details: Any,
) -> tuple[Execution, Disposition]:
    """`extra`: ops committed only with the result (a notice for a partition owned elsewhere). `details`:
    what else the result says (`execution.result`'s started_ms, not_started, cancelled, output)."""
    for _ in range(max_rounds):
        e = await ledger.get(kv, schedule_id, planned_ms, timeout=timeout)
        if e is None:
            raise NotFound(f"execution {execution_id(schedule_id, planned_ms)} not found")
        new, disposition = result(e, attempt, succeeded=succeeded, error_class=error_class, message=message,
                                  now_ms=now_ms, retry_after_ms=retry_after_ms, worker=worker, **details)
        if disposition is not Disposition.RECORDED:
            return e, disposition
        payload = b""
        if new.state is ExecState.DEAD_LETTER:  # dead letters keep the payload for replay
            if new.payload is not None:
                payload = new.payload  # a replayed dead letter dying again keeps the one it ran with
            elif payload_of is not None:
                payload = await payload_of(schedule_id)
        r = await kv.txn([], [ledger.cas_op(new, e.mod_revision, payload=payload, now_ms=now_ms, extra=extra)],
                         timeout=timeout)
        if ledger.cas_results(r)[0]:
            return ledger.with_revision(new, r.revision), Disposition.RECORDED
    raise NotFound(f"execution {execution_id(schedule_id, planned_ms)}: record kept changing; "
                   f"gave up after {max_rounds} reads")
