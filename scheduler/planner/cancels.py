"""Cancel is recorded before the work stops: the overlap policy's side (docs/workers.md, "Cancel").

A cancel of an attempt that is out makes the execution CANCELLING, not CANCELLED: it ends when the
worker confirms the stop (its result of that attempt) or when the kill deadline (the attempt's
deadline, brought forward to cancel time + `execution.KILL_AFTER_MS`) passes and the owner times it
out. Under `cancel_other` the new run waits (deferred round after round) until every run it cancelled
has ended, so two runs of one schedule never overlap because of the policy meant to prevent it. Pure:
the partition loop commits what this returns.
"""

from __future__ import annotations

from collections.abc import Iterable

from scheduler.execution import IN_FLIGHT, ExecState, Execution, cancel
from scheduler.planner.pending import PendingIndex


def cancel_for_overlap(pending: PendingIndex, running: Iterable[str], now_ms: int,
                       reason: str = "overlap") -> tuple[list[tuple[Execution, Execution]], bool]:
    """(old, new) cancels to write for the runs still going, and whether any of them is still stopping
    after them (then the new run must wait)."""
    cas: list[tuple[Execution, Execution]] = []
    stopping = False
    for rid in running:
        r = pending.get(rid)
        if r is None or r.state not in IN_FLIGHT:
            continue
        if r.state is ExecState.CANCELLING:
            stopping = True  # cancelled in an earlier round; its worker has not confirmed the stop yet
            continue
        new = cancel(r, reason, now_ms)
        cas.append((r, new))
        stopping = stopping or new.state is ExecState.CANCELLING
    return cas, stopping
