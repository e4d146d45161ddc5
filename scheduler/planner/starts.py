"""The owner's half of start confirmation (docs/workers.md, "Start confirmation").

A dispatched attempt carries a start-by instant. A worker runs its handler only after a planner has
recorded DISPATCHED(n) -> RUNNING(n) by a compare-and-swap from the record's revision; the owner, past
start-by, ends attempt n never-started and makes the execution due again (same id, next attempt) by a
CAS from that same revision. Exactly one of the two can win, so an undelivered or frozen dispatch costs
`start_timeout` and never two runs. Pure: the partition loop commits what this returns.
"""

from __future__ import annotations

from collections.abc import Iterable

from scheduler.execution import Execution, unstarted
from scheduler.planner.pending import PendingIndex


def unstarted_cas(pending: PendingIndex, taken: Iterable[Execution], now_ms: int) -> list[tuple[Execution, Execution]]:
    """(old, new) pairs for every dispatched attempt past its start-by, leaving out executions already in
    this round's txn (`taken`: timed out or lost): one key twice in a txn is refused by etcd."""
    seen = {e.id for e in taken}
    out = []
    for e in pending.unstarted(now_ms):
        if e.id in seen:
            continue
        new = unstarted(e, now_ms)
        if new is not None:
            seen.add(e.id)
            out.append((e, new))
    return out
