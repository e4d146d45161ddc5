"""The owner's half of start confirmation (docs/workers.md, "Start confirmation").

A dispatched attempt carries a start-by instant. A worker runs its handler only after a planner has
recorded DISPATCHED(n) -> RUNNING(n) by a compare-and-swap from the record's revision; the owner, past
start-by, ends attempt n never-started and makes the execution due again (same id, next attempt) by a
CAS from that same revision. Exactly one of the two can win, so an undelivered or frozen dispatch costs
`start_timeout` and never two runs. Pure: the partition loop commits what this returns.
"""

from __future__ import annotations

from scheduler.execution import Execution, unstarted
from scheduler.planner.pending import PendingIndex


def unstarted_cas(pending: PendingIndex, now_ms: int) -> list[tuple[Execution, Execution]]:
    """(old, new) pairs for every dispatched attempt past its start-by. The caller leaves these out of the
    round's timeouts (one key twice in a txn is refused by etcd): never started is what the record proves,
    whatever else is due for it."""
    out = []
    for e in pending.unstarted(now_ms):
        new = unstarted(e, now_ms)
        if new is not None:
            out.append((e, new))
    return out
