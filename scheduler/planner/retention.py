"""Bounded history: which records a partition's owner deletes (DESIGN.md, "history is bounded").

Terminal records past the retention period or beyond the count per schedule (never dead letters, and
never records a new owner might plan again), and skip records past the period. The caller commits
the returned ops in its fenced batch.

Keys first: a key names the schedule and the planned time, so the candidates (too old, or beyond the
count) are found without transferring a single record; only the candidates' values are read, to
delete the terminal ones.

Listed only where needed: a keys-only listing of the whole partition every sweep cost its owner about
1 us per record kept, every 10 s, for records nowhere near the count or the period (issue 12: a fifth of a
planner's CPU in the materialization benchmark, and at a production history of 1,000 records for each of
10,000 schedules, 10 million keys per sweep). `History` keeps, per schedule, how many records the
partition holds and the oldest one's planned time, from one full listing and then from what the owner
learns of every record made since (its own creates, and the notices that every record made by another,
a trigger or a backfill, comes with). A sweep lists only the schedules that are over the count or hold a
record past the period. The tally may run high (a record counted twice, one deleted by another), which
costs a listing of that schedule that corrects it; it never runs low while the owner holds the partition.
A full listing every `FULL_EVERY` sweeps re-bases it all the same (a record made by a path this module
was never told of would otherwise wait for the next owner).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from scheduler.execution import TERMINAL
from scheduler.planner.settings import PlannerSettings
from scheduler.store.codec import peek_state
from scheduler.store.etcd.ops import Compare, Op, delete, get, txn
from scheduler.store.keyspace import Keyspace
from scheduler.store.kv import KV
from scheduler.store.paging import range_pages
from scheduler.tasks import Pacer

FULL_EVERY = 60  # sweeps between full listings (10 minutes at the default retention_interval)
LIST_AT_ONCE = 32  # schedules listed concurrently by a targeted sweep
_MS_BITS = 43  # a tally packs (count, oldest planned ms) into one int: ms < 2**43 (year 2248)
_MS_MASK = (1 << _MS_BITS) - 1


class History:
    """What one owner knows of its partition's stored history: per schedule, how many records and the
    oldest one's planned time; the oldest skip record's end. Until the first full listing it knows
    nothing, and the first sweep lists everything."""

    __slots__ = ("_tally", "full_listings", "keys_listed", "oldest_skip_ms", "sweeps")

    def __init__(self) -> None:
        # schedule id -> count << 43 | oldest planned ms: one int per schedule with history, not an object
        # (a planner holds up to a million schedules within 1 KiB each: docs/architecture.md).
        self._tally: dict[str, int] = {}
        self.oldest_skip_ms: int | None = None
        self.sweeps = 0  # the first (0) and every FULL_EVERY-th sweep list the whole partition
        self.full_listings = 0
        self.keys_listed = 0  # execution keys read by sweeps, in all (for tests and the benchmark)

    def created(self, schedule_id: str, planned_ms: int) -> None:
        """A record of `schedule_id` at `planned_ms` was made (or may have been: counting one twice is safe)."""
        v = self._tally.get(schedule_id)
        if v is None:
            self._tally[schedule_id] = 1 << _MS_BITS | planned_ms
        else:
            self._tally[schedule_id] = ((v >> _MS_BITS) + 1) << _MS_BITS | min(v & _MS_MASK, planned_ms)

    def skipped(self, through_ms: int) -> None:
        """A skip record ending at `through_ms` was written."""
        if self.oldest_skip_ms is None or through_ms < self.oldest_skip_ms:
            self.oldest_skip_ms = through_ms

    def count(self, schedule_id: str) -> int:
        return self._tally.get(schedule_id, 0) >> _MS_BITS

    def due(self, cutoff_ms: int, count: int) -> list[str]:
        """Schedules whose records may include some to delete: over the count, or one past the cutoff."""
        limit = (count + 1) << _MS_BITS
        return [sid for sid, v in self._tally.items() if v >= limit or v & _MS_MASK < cutoff_ms]

    def set(self, schedule_id: str, count: int, oldest_ms: int) -> None:
        """What a listing found of `schedule_id` (less what it deletes)."""
        if count:
            self._tally[schedule_id] = count << _MS_BITS | oldest_ms
        else:
            self._tally.pop(schedule_id, None)

    def rebase(self) -> None:
        """A full listing follows: forget every count (schedules with no record left drop out)."""
        self._tally = {}
        self.full_listings += 1


async def retention_deletes(
    kv: KV, ks: Keyspace, partition: int, now_ms: int, s: PlannerSettings, *,
    keep_after: Callable[[str], int | None], unfinished: Callable[[str], bool], timeout: float | None,
    history: History | None = None,
) -> list[Op]:
    """The deletes retention asks for now. `keep_after(schedule id)`: records planned after this are
    kept whatever their count (None: none protected); `unfinished(execution id)`: the owner knows the
    record is not finished (it is neither counted nor deleted). With a `history`, only the schedules it
    names as due are listed (after a first full listing, and a full one every FULL_EVERY sweeps)."""
    # A long history must not starve lease keep-alives: pages, and bounded stretches between loop turns.
    pacer = Pacer()
    cutoff = now_ms - s.retention_ms
    full = history is None or history.sweeps % FULL_EVERY == 0
    if history is not None:
        history.sweeps += 1
    by_schedule: dict[str, list[tuple[int, bytes]]] = {}  # (planned ms, key)
    listed = 0
    if full:
        heads: dict[bytes, list[tuple[int, bytes]]] = {}
        async for kvs, _ in range_pages(kv, ks.executions(partition), keys_only=True, page=5000, timeout=timeout):
            listed += len(kvs)
            for x in kvs:
                head, _, planned = x.key.rpartition(b"/")
                heads.setdefault(head, []).append((int(planned), x.key))
                await pacer.pace()
        by_schedule = {ks.execution_id_of(es[0][1]).schedule_id: es for es in heads.values()}
    elif history is not None:
        wanted = history.due(cutoff, s.retention_count)
        for i in range(0, len(wanted), LIST_AT_ONCE):
            chunk = wanted[i:i + LIST_AT_ONCE]
            for sid, keys in zip(chunk, await asyncio.gather(
                    *(_schedule_keys(kv, ks, partition, sid, timeout) for sid in chunk)), strict=True):
                listed += len(keys)
                by_schedule[sid] = [(int(k.rpartition(b"/")[2]), k) for k in keys]
                await pacer.pace()
    candidates: list[tuple[str, bytes]] = []
    kept: dict[str, tuple[int, int]] = {}  # schedule id -> (records that stay, the oldest one's planned ms)
    for sid, es in by_schedule.items():
        await pacer.pace()
        if not es:  # listed for a count that ran high: nothing left (deleted by another)
            kept[sid] = (0, 0)
            continue
        if len(es) <= s.retention_count and min(es)[0] >= cutoff:
            kept[sid] = (len(es), min(es)[0])
            continue
        protected = keep_after(sid)
        es.sort(reverse=True)
        counted = 0  # the count is of terminal records; unfinished ones are not counted
        stay = 0
        oldest = 0
        for planned_ms, k in es:
            if not unfinished(str(ks.execution_id_of(k))):
                if protected is not None and planned_ms > protected:
                    counted += 1
                elif counted >= s.retention_count or planned_ms < cutoff:
                    candidates.append((sid, k))
                    continue
                else:
                    counted += 1
            stay += 1
            oldest = planned_ms  # newest first: the last one that stays is the oldest
        kept[sid] = (stay, oldest)
    doomed: list[Op] = []
    for i in range(0, len(candidates), 100):
        batch = candidates[i:i + 100]
        got = await kv.txn([], [get(k) for _, k in batch], timeout=timeout)
        for (sid, _), r in zip(batch, got.responses, strict=True):
            for x in getattr(r, "kvs", ()):
                if peek_state(x.value) in TERMINAL:
                    # Only if unchanged since we read it: a replay may have brought it back to life.
                    doomed.append(txn([Compare.mod_revision(x.key, "==", x.mod_revision)], [delete(x.key)]))
                else:  # a candidate that is not terminal stays, and stays counted
                    stay, oldest = kept.get(sid, (0, 0))
                    planned_ms = ks.execution_id_of(x.key).planned_ms
                    kept[sid] = (stay + 1, min(oldest, planned_ms) if stay else planned_ms)
    if history is not None:
        if full:
            history.rebase()
        for sid, (stay, oldest) in kept.items():
            history.set(sid, stay, oldest)
        history.keys_listed += listed
    doomed += await _skip_deletes(kv, ks, partition, cutoff, pacer, history, full, timeout)
    return doomed


async def _schedule_keys(kv: KV, ks: Keyspace, partition: int, schedule_id: str,
                         timeout: float | None) -> list[bytes]:
    return [x.key async for kvs, _ in range_pages(kv, ks.executions(partition, schedule_id), keys_only=True,
                                                   page=5000, timeout=timeout) for x in kvs]


async def _skip_deletes(kv: KV, ks: Keyspace, partition: int, cutoff: int, pacer: Pacer, history: History | None,
                        full: bool, timeout: float | None) -> list[Op]:
    """Skip records that ended before the cutoff. Only the owner writes them (in its planning batch), so
    between full listings they are listed only when the oldest one it knows of is past the cutoff."""
    if history is not None and not full and (history.oldest_skip_ms is None or history.oldest_skip_ms >= cutoff):
        return []
    out: list[Op] = []
    oldest: int | None = None
    skips = await kv.range(ks.skips(partition), prefix=True, keys_only=True, timeout=timeout)
    for x in skips.kvs:
        await pacer.pace()
        through = int(x.key.rsplit(b"-", 1)[1])
        if through < cutoff:
            out.append(delete(x.key))
        elif oldest is None or through < oldest:
            oldest = through
    if history is not None:
        history.oldest_skip_ms = oldest
    return out
