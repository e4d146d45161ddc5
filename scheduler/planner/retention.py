"""Bounded history: which records a partition's owner deletes (DESIGN.md, "history is bounded").

Terminal records past the retention period or beyond the count per schedule (never dead letters, and
never records a new owner might plan again), and skip records past the period. The caller commits
the returned ops in its fenced batch.

Keys first: a key names the schedule and the planned time, so the candidates (too old, or beyond the
count) are found without transferring a single record; only the candidates' values are read, to
delete the terminal ones. A partition with nothing to delete costs one keys-only listing, not a read
of its whole history.
"""

from __future__ import annotations

from collections.abc import Callable

from scheduler.execution import TERMINAL
from scheduler.planner.settings import PlannerSettings
from scheduler.store.codec import peek_state
from scheduler.store.etcd.ops import Compare, Op, delete, get, txn
from scheduler.store.keyspace import Keyspace
from scheduler.store.kv import KV
from scheduler.store.paging import range_pages
from scheduler.tasks import Pacer


async def retention_deletes(
    kv: KV, ks: Keyspace, partition: int, now_ms: int, s: PlannerSettings, *,
    keep_after: Callable[[str], int | None], unfinished: Callable[[str], bool], timeout: float | None,
) -> list[Op]:
    """The deletes retention asks for now. `keep_after(schedule id)`: records planned after this are
    kept whatever their count (None: none protected); `unfinished(execution id)`: the owner knows the
    record is not finished (it is neither counted nor deleted)."""
    # A long history must not starve lease keep-alives: pages, and bounded stretches between loop turns.
    pacer = Pacer()
    cutoff = now_ms - s.retention_ms
    by_schedule: dict[bytes, list[tuple[int, bytes]]] = {}  # (planned ms, key)
    async for kvs, _ in range_pages(kv, ks.executions(partition), keys_only=True, page=5000, timeout=timeout):
        for x in kvs:
            head, _, planned = x.key.rpartition(b"/")
            by_schedule.setdefault(head, []).append((int(planned), x.key))
            await pacer.pace()
    candidates: list[bytes] = []
    for es in by_schedule.values():
        await pacer.pace()
        if len(es) <= s.retention_count and min(es)[0] >= cutoff:
            continue
        protected = keep_after(ks.execution_id_of(es[0][1]).schedule_id)
        es.sort(reverse=True)
        kept = 0  # the count is of terminal records; unfinished ones are not counted
        for planned_ms, k in es:
            if unfinished(str(ks.execution_id_of(k))):
                continue
            if protected is not None and planned_ms > protected:
                kept += 1
            elif kept >= s.retention_count or planned_ms < cutoff:
                candidates.append(k)
            else:
                kept += 1
    doomed: list[Op] = []
    for i in range(0, len(candidates), 100):
        got = await kv.txn([], [get(k) for k in candidates[i:i + 100]], timeout=timeout)
        for r in got.responses:
            for x in getattr(r, "kvs", ()):
                if peek_state(x.value) in TERMINAL:
                    # Only if unchanged since we read it: a replay may have brought it back to life.
                    doomed.append(txn([Compare.mod_revision(x.key, "==", x.mod_revision)], [delete(x.key)]))
    skips = await kv.range(ks.skips(partition), prefix=True, keys_only=True, timeout=timeout)
    for x in skips.kvs:
        await pacer.pace()
        if int(x.key.rsplit(b"-", 1)[1]) < cutoff:
            doomed.append(delete(x.key))
    return doomed
