"""The planner loop of one owned partition: snapshot -> decide -> act, every `loop_interval`.

On claim it reads the checkpoint watermark W, the partition's schedules and its unfinished
executions, and applies each schedule's missed-run policy to the planned times it is owed
(`(max(W, activated), now - grace]`). Then each round:

1. materialize: every planned time up to `now + lookahead` becomes an execution record (created
   only if absent, inside the owner's fenced batch) or, for a paused schedule, a skip record; the
   checkpoint moves to the horizon in the last txn;
2. dispatch: due executions pass the overlap policy (from the ledger's view of running and buffered
   executions), are marked dispatched(attempt n, deadline) with a compare-and-swap, and go to the
   dispatch queue;
3. time out: in-flight attempts past their recorded deadline get a TIMEOUT result (retry or dead
   letter).

Any FencedOut ends the loop at once (the ownership layer drops the partition); OutcomeUnknown and
lost compare-and-swaps end it too, and the node restarts it from etcd's state, which is always safe
because creates are idempotent and transitions are CAS.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from scheduler.clock import Clock
from scheduler.errors import NotFound
from scheduler.execution import (
    IN_FLIGHT,
    KILL_MESSAGE,
    TERMINAL,
    ErrorClass,
    ExecState,
    Execution,
    Trigger,
    dispatch,
    log_fields,
    new_execution,
    result,
    skip,
    with_revision,
)
from scheduler.metrics.planner import PlannerMetrics
from scheduler.model import ScheduleState, execution_id
from scheduler.planner import starts
from scheduler.planner.cancels import cancel_for_overlap
from scheduler.planner.ownership import Ownership
from scheduler.planner.pending import PendingIndex
from scheduler.planner.settings import PlannerSettings
from scheduler.store.checkpoint import Checkpoint, advance, read_checkpoint
from scheduler.store.codec import decode_execution, peek_state
from scheduler.store.combiner import WriteCombiner
from scheduler.store.etcd.ops import Compare, Op, delete, get, txn
from scheduler.store.etcd.types import TxnResult
from scheduler.store.fenced import Fence, FenceStats, fenced_txn
from scheduler.store.keyspace import Keyspace
from scheduler.store.kv import KV
from scheduler.store.ledger import Ledger
from scheduler.store.notices import Notice, parse_notice
from scheduler.store.schedules import ScheduleStore, StoredSchedule
from scheduler.timeplan import Overlap, Plan, SkipReason, jitter_ms
from scheduler.timeplan.missed import SkipRange, decide_missed
from scheduler.timeplan.overlap import OverlapAction, decide_overlap

log = logging.getLogger(__name__)


LOST_MESSAGE = ("worker stopped heartbeating or disconnected, and no planner re-attached the attempt within "
                "the heartbeat timeout")


class Restart(Exception):
    """State may be stale (a lost CAS, an unknown outcome): reload from etcd."""


class DispatchSink(Protocol):
    def capacity(self, pool: str) -> int:
        """How many more assignments workers of this pool can take now (granted credits)."""
        ...

    def reserve(self, pool: str, n: int) -> None:
        """Hold `n` of the pool's capacity for dispatches being committed: the partition loops run
        concurrently, and without this each would see (and take) the whole capacity."""
        ...

    def release(self, pool: str, n: int) -> None:
        """Give back a reservation (after the dispatches were submitted or abandoned)."""
        ...

    def submit(self, e: Execution, payload: bytes, token: str) -> None: ...

    def cancel(self, e: Execution, reason: str) -> None: ...


@dataclass
class _Sched:
    stored: StoredSchedule
    plan: Plan


@dataclass
class PlannerStats:
    created: int = 0
    skipped_ranges: int = 0
    dispatched: int = 0
    timed_out: int = 0
    rounds: int = 0


class PartitionPlanner:
    def __init__(
        self,
        partition: int,
        *,
        kv: KV,
        ks: Keyspace,
        ownership: Ownership,
        store: ScheduleStore,
        ledger: Ledger,
        dispatcher: DispatchSink,
        settings: PlannerSettings,
        clock: Clock,
        node_id: str,
        rpc_timeout: float = 1.0,
        disable_fencing: bool = False,
        fence_stats: FenceStats | None = None,
        max_ops: int = 127,
        combiner: WriteCombiner | None = None,
        metrics: PlannerMetrics | None = None,
    ) -> None:
        self.p = partition
        self.metrics = metrics
        self.combiner = combiner
        self.kv, self.ks, self.ownership, self.store, self.ledger = kv, ks, ownership, store, ledger
        self.dispatcher, self.s, self.clock, self.node_id = dispatcher, settings, clock, node_id
        self.rpc_timeout, self.disable_fencing = rpc_timeout, disable_fencing
        self.fence_stats = fence_stats or FenceStats()
        self.stats = PlannerStats()
        self.schedules: dict[str, _Sched] = {}
        self.heap: list[tuple[int, str]] = []  # (next planned ms, schedule id); stale entries skipped
        self.pending = PendingIndex()  # unfinished executions of this partition
        self._withdraw: set[str] = set()  # schedules paused or deleted: withdraw their pre-written runs
        self.ck = Checkpoint(partition, 0, 0)
        self.wake = asyncio.Event()
        self.max_ops = max_ops
        # Due work is waiting for worker capacity: the node wakes this loop when credits arrive,
        # instead of letting it wait out `loop_interval`.
        self.starved = False
        # Schedules paused or deleted that may still have pending executions: only while there are
        # some does a round take ready items beyond worker capacity (to skip or hold them).
        self._inactive: set[str] = set()
        self._pools: frozenset[str] | None = None  # worker pools of the schedules (cache)
        # Notices of records others changed (API operations, results recorded elsewhere): key ->
        # (notice, its mod_revision). `_rescan`: list the partition's notices from etcd next round.
        self._notices: dict[bytes, tuple[Notice, int]] = {}
        self._rescan = False
        # Attempts whose worker stream was lost (execution id -> attempt): timed out by the next round.
        self._lost: dict[str, int] = {}

    # ---- snapshot ---------------------------------------------------------------------------------

    async def load(self) -> int:
        """Read checkpoint, schedules and unfinished executions; returns the revision to watch from."""
        self.ck = await read_checkpoint(self.kv, self.ks, self.p, timeout=self.rpc_timeout)
        stored, rev = await self.store.list_partition(self.p)
        execs, _ = await self.ledger.list_unfinished(self.kv, self.p, timeout=self.rpc_timeout)
        self.pending.clear()
        for e in execs:
            self.pending.put(e)
        self._withdraw = set(self.pending_schedule_ids())
        self.schedules.clear()
        self.heap.clear()
        self._pools = None
        for st in stored:
            self._add_schedule(st)
        self._inactive = {sid for sid in self._withdraw if sid not in self.schedules}
        self._inactive |= {sid for sid, sch in self.schedules.items()
                           if sch.stored.schedule.state is ScheduleState.PAUSED}
        # The records were just read: notices left from before (no owner, a crash) are cleared in the
        # first round, after re-reading what they name (cheap, and correct whatever their age).
        self._rescan = True
        return rev

    def _add_schedule(self, st: StoredSchedule) -> None:
        try:
            plan = st.schedule.plan()
        except Exception:  # stored specs were validated; a newer engine refusing one must not stop the loop
            log.exception("cannot plan schedule", extra={"schedule_id": st.schedule.id, "partition": self.p})
            return
        self.schedules[st.schedule.id] = _Sched(st, plan)
        self._pools = None
        if st.schedule.state is ScheduleState.PAUSED:
            self._inactive.add(st.schedule.id)
        else:
            self._inactive.discard(st.schedule.id)
        cursor = max(self.ck.watermark_ms, st.activated_ms)
        nxt = plan.next_after_ms(cursor)
        if nxt is not None:
            heapq.heappush(self.heap, (nxt, st.schedule.id))

    def on_schedule_put(self, st: StoredSchedule) -> None:
        """A create or update seen by watch: re-plan from the later of the watermark and activation."""
        old = self.schedules.get(st.schedule.id)
        if old is not None and old.stored.schedule.version >= st.schedule.version:
            return
        self._add_schedule(st)
        if st.schedule.state is ScheduleState.PAUSED:
            self._withdraw.add(st.schedule.id)
        self.wake.set()

    def on_schedule_delete(self, schedule_id: str) -> None:
        self.schedules.pop(schedule_id, None)
        self._pools = None
        self._withdraw.add(schedule_id)
        self._inactive.add(schedule_id)
        self.wake.set()

    # ---- decide + act ---------------------------------------------------------------------------

    async def _fenced(self, fence: Fence, ops: Sequence[Op], compares: Sequence[Compare] = ()) -> list[TxnResult]:
        if self.combiner is not None:
            return await self.combiner.submit(fence, ops, compares)
        return await fenced_txn(self.kv, fence, ops, compares=compares, max_ops=self.max_ops,
                                timeout=self.rpc_timeout, disable_fencing=self.disable_fencing,
                                stats=self.fence_stats)

    async def _commit(self, ops: Sequence[Op]) -> list[tuple[bool, int]]:
        """Fenced commit of a batch; returns per-op success of nested creates/CASes."""
        if not ops:
            return []
        async with self.ownership.writing(self.p) as fence:
            rs = await self._fenced(fence, ops)
        return [(ok, r.revision) for r in rs for ok in self.ledger.cas_results(r)]

    def _new_execution(self, sch: _Sched, planned_ms: int, due_ms: int) -> Execution:
        s = sch.stored.schedule
        return new_execution(
            id=execution_id(s.id, planned_ms), schedule_id=s.id, tenant=s.tenant, pool=s.worker_pool,
            task_type=s.task_type, planned_ms=planned_ms, due_ms=due_ms, trigger=Trigger.SCHEDULED,
            retry=s.policies.retry, timeout_ms=s.policies.execution_timeout_ms,
        )

    def catch_up(self, now_ms: int) -> tuple[list[Execution], list[tuple[str, SkipRange]]]:
        """Missed-run decisions for every schedule owed planned times older than the grace."""
        runs: list[Execution] = []
        skips: list[tuple[str, SkipRange]] = []
        horizon = now_ms - self.s.late_grace_ms
        for sid, sch in self.schedules.items():
            s = sch.stored.schedule
            owed_from = max(self.ck.watermark_ms, sch.stored.activated_ms)
            if horizon <= owed_from:
                continue
            if s.state is ScheduleState.PAUSED:
                if sch.plan.any_between_ms(owed_from, horizon):
                    skips.append((sid, SkipRange(SkipReason.PAUSED, owed_from, horizon)))
                continue
            p = s.policies
            d = decide_missed(sch.plan, owed_from, horizon, p.missed_runs, p.catchup_window_ms, p.catchup_cap)
            runs += [self._new_execution(sch, t, now_ms) for t in d.run]
            skips += [(sid, r) for r in d.skipped]
        # The heap restarts after the catch-up horizon for everyone.
        self.heap = []
        for sid, sch in self.schedules.items():
            cursor = max(self.ck.watermark_ms, sch.stored.activated_ms, horizon)
            nxt = sch.plan.next_after_ms(cursor)
            if nxt is not None:
                self.heap.append((nxt, sid))
        heapq.heapify(self.heap)
        return runs, skips

    def plan_round(
        self, horizon_ms: int, limit: int | None = None
    ) -> tuple[list[Execution], list[tuple[str, SkipRange]], int]:
        """Planned times up to the horizon: executions for active schedules, skips for paused ones.

        At most `limit` of them per round, so that an overloaded planner keeps dispatching between
        rounds instead of spending itself on materialization (backpressure). Returns the watermark
        the round reached: the horizon, or just before the first planned time it left for the next
        round (every planned time at or before the watermark was handled)."""
        execs: list[Execution] = []
        skips: list[tuple[str, SkipRange]] = []
        heap = self.heap
        while heap and heap[0][0] <= horizon_ms:
            if limit is not None and len(execs) + len(skips) >= limit:
                return execs, skips, heap[0][0] - 1
            t, sid = heapq.heappop(heap)
            sch = self.schedules.get(sid)
            if sch is None:
                continue  # deleted
            cursor = max(self.ck.watermark_ms, sch.stored.activated_ms)
            if t <= cursor:  # a stale heap entry from before a re-plan
                continue
            s = sch.stored.schedule
            if s.state is ScheduleState.PAUSED:
                skips.append((sid, SkipRange(SkipReason.PAUSED, t - 1, t)))
            else:
                due = t + jitter_ms(s.id, t, s.policies.jitter_ms)
                execs.append(self._new_execution(sch, t, due))
            nxt = sch.plan.next_after_ms(t)
            if nxt is not None:
                heapq.heappush(heap, (nxt, sid))
        return execs, skips, horizon_ms

    async def write_planned(
        self, execs: list[Execution], skips: list[tuple[str, SkipRange]], watermark_ms: int
    ) -> None:
        """Creates, skips and the checkpoint in ONE fenced txn when they fit (the common case); a larger
        batch goes in chunks with the checkpoint last. An idle partition writes its checkpoint only
        every `checkpoint_interval_ms`, so hundreds of idle partitions do not flood etcd."""
        ops: list[Op] = list(self.ledger.create_ops(execs))
        ops += [self.ledger.skip_op(self.p, sid, r) for sid, r in skips]
        lag = watermark_ms - self.ck.watermark_ms
        write_ck = lag > 0 and (bool(ops) or lag >= self.s.checkpoint_interval_ms)
        if not ops and not write_ck:
            return
        async with self.ownership.writing(self.p) as fence:
            compares, ck_ops, new = advance(self.ks, self.ck, watermark_ms, self.node_id, fence.token)
            if write_ck and len(ops) + len(ck_ops) <= self.max_ops:
                rs = await self._fenced(fence, [*ops, *ck_ops], compares)
            else:
                rs = await self._fenced(fence, ops) if ops else []
                if write_ck:
                    rs += await self._fenced(fence, ck_ops, compares)
        if write_ck:
            self.ck = replace(new, mod_revision=rs[-1].revision)
        results = [(ok, r.revision) for r in rs for ok in self.ledger.cas_results(r)][: len(execs)]
        created = 0
        for e, (ok, rev) in zip(execs, results, strict=False):
            if ok:
                created += 1
                self.pending.put(with_revision(e, rev))  # the next CAS compares against it
        if created < len(execs):
            # Records that already existed (an earlier owner's lookahead): the create's failure branch
            # read them back, so track their real state instead of reloading the whole partition.
            for r in rs:
                for x in self.ledger.existing(r):
                    self.pending.put(x)
        self.stats.created += created
        self.stats.skipped_ranges += len(skips)

    def backlogged(self, now_ms: int) -> bool:
        """Backpressure: workers lack capacity for what is due, and the oldest waiting execution is
        more than `backlog_ms` late. Materializing more would only spend the CPU that dispatch needs
        and grow etcd with records nobody can run yet; the planned times wait in the timer heap (the
        checkpoint does not pass them), and the lag shows in the metrics. Only a round that started
        all it could makes the loop starved: buffered executions of one schedule, or a pool without
        workers, cannot stall the other schedules of the partition."""
        if not self.starved:
            return False
        oldest = self.pending.oldest_ready()
        return oldest is not None and oldest < now_ms - self.s.backlog_ms

    def pending_schedule_ids(self) -> set[str]:
        return {e.schedule_id for e in self.pending.values()}

    def _withdrawals(self) -> list[tuple[Execution, Execution]]:
        """Pause and delete take effect at once: pre-written executions are withdrawn now, not when
        they come due."""
        cas = []
        for sid in self._withdraw:
            sch = self.schedules.get(sid)
            if sch is not None and sch.stored.schedule.state is not ScheduleState.PAUSED:
                continue
            why = SkipReason.PAUSED.value if sch else "schedule_deleted"
            cas += [(x, skip(x, why)) for x in self.pending.of_schedule(sid) if x.state is ExecState.SCHEDULED]
        self._withdraw.clear()
        return cas

    async def dispatch_due(self, now_ms: int) -> None:
        reserved: dict[str, int] = {}
        try:
            await self._dispatch_due(now_ms, reserved)
        finally:
            for pool, n in reserved.items():
                self.dispatcher.release(pool, n)

    async def _dispatch_due(self, now_ms: int, reserved: dict[str, int]) -> None:
        self.starved = False
        cas: list[tuple[Execution, Execution]] = self._withdrawals()  # (old, new)
        budget: dict[str, int] = {}
        if self._pools is None:
            self._pools = frozenset(sch.stored.schedule.worker_pool for sch in self.schedules.values())
        # Items beyond worker capacity would only be deferred again: do not even take them out. Items
        # of paused/deleted schedules need no capacity; a few extra cover them while there are any.
        capacity = sum(self.dispatcher.capacity(pool) for pool in self._pools)
        # Bounded like materialization: one round is one uninterrupted stretch of the event loop, and
        # lease keep-alives wait behind every stretch of every partition.
        can_start = min(capacity, self.s.max_planned_per_round)
        limit = can_start + (16 if self._inactive else 0)
        if limit <= 0 and not cas:
            self.starved = self.pending.has_ready(now_ms)  # no worker can take anything now
            return
        due = self.pending.ready(now_ms, limit)
        # Starved (backpressure, see backlogged()) only when the round used all it could start: a
        # pool without workers holds its own executions back, not the schedules of other pools.
        started = 0
        for sid, waiting in due.items():
            sch = self.schedules.get(sid)
            if sch is None or sch.stored.schedule.state is ScheduleState.PAUSED:
                why = SkipReason.PAUSED.value if sch else "schedule_deleted"
                cas += [(x, skip(x, why)) for x in waiting if x.state is ExecState.SCHEDULED]
                for x in waiting:
                    if x.state is not ExecState.SCHEDULED:
                        self.pending.defer(x)  # a retry of a paused schedule waits for the resume
                continue
            sched_policy = sch.stored.schedule.policies.overlap
            # An execution may carry its own policy (trigger/backfill override; rerun and replay run
            # regardless). ALLOW_ALL and retries always START: the running set is needed only otherwise.
            policies = [x.overlap or sched_policy for x in waiting]
            need_running = any(x.state is not ExecState.RETRY_WAIT and pol is not Overlap.ALLOW_ALL
                               for x, pol in zip(waiting, policies, strict=True))
            running = self.pending.running(sid) if need_running else ()
            for i, x in enumerate(waiting):
                pool = x.pool
                if pool not in budget:
                    budget[pool] = self.dispatcher.capacity(pool)
                policy = policies[i]
                if x.state is ExecState.RETRY_WAIT or policy is Overlap.ALLOW_ALL:
                    action = OverlapAction.START  # a retry is the same run, not a new one
                else:
                    buffered = tuple(y.id for y in waiting[:i] if y.state is ExecState.SCHEDULED)
                    action = decide_overlap(policy, running, buffered).action
                if action is OverlapAction.SKIP:
                    cas.append((x, skip(x, SkipReason.OVERLAP_SKIP.value)))
                    continue
                if action is OverlapAction.BUFFER:
                    self.pending.defer(x)  # waits for the running one; later ones see it as buffered
                    continue
                if budget[pool] <= 0:
                    for y in waiting[i:]:
                        self.pending.defer(y)  # waits for worker capacity
                    break
                if action is OverlapAction.CANCEL_THEN_START:
                    stops, stopping = cancel_for_overlap(self.pending, running, now_ms)  # planner/cancels.py
                    for r, stop in stops:
                        cas.append((r, stop))
                        self.dispatcher.cancel(r, "overlap")
                    if stopping:  # starts once the cancelled runs have really stopped (CANCELLING ended)
                        self.pending.defer(x)
                        continue
                    running = ()
                budget[pool] -= 1
                started += 1
                self.dispatcher.reserve(pool, 1)
                reserved[pool] = reserved.get(pool, 0) + 1
                fence = self.ownership.fence(self.p)
                if fence is None:
                    return
                new = dispatch(x, worker="", planner=self.node_id, token=f"{self.p}:{fence.token}", now_ms=now_ms,
                               start_timeout_ms=self.s.start_timeout_ms)
                cas.append((x, new))
                if need_running:
                    running = (*running, x.id)
        self.starved = started >= can_start and self.pending.has_ready(now_ms)
        if not cas:
            return
        ok = await self._commit([self.ledger.cas_op(new, old.mod_revision, now_ms=now_ms, old_state=old.state)
                                  for old, new in cas])
        lost = False
        sent: list[Execution] = []
        debug = log.isEnabledFor(logging.DEBUG)  # per-execution lines only when asked for: hot path
        for (_old, new), (applied, rev) in zip(cas, ok, strict=False):
            if not applied:
                lost = True
                continue
            new = with_revision(new, rev)
            self.pending.put(new)
            if new.state is ExecState.DISPATCHED:
                cur = new.current
                self.dispatcher.submit(new, self._payload(new), cur.token if cur else "")
                self.stats.dispatched += 1
                sent.append(new)
                if debug:
                    log.debug("execution dispatched", extra={"event": "dispatch", **log_fields(new, self.p)})
            elif new.state in (ExecState.CANCELLED, ExecState.CANCELLING):
                log.info("execution cancelled", extra={"event": "cancel", "reason": new.skip_reason,
                                                       **log_fields(new, self.p)})
            elif debug:
                log.debug("execution skipped", extra={"event": "skip", "reason": new.skip_reason,
                                                      **log_fields(new, self.p, self._token())})
        if sent and self.metrics is not None:
            self.metrics.dispatched(sent, now_ms)
        if lost:
            raise Restart("a dispatch compare-and-swap lost: someone else changed the record")

    def lose(self, attempts: list[tuple[str, int]]) -> None:
        """Attempts whose worker stopped heartbeating or disconnected and was not re-attached in time
        (the dispatcher's watchdog): time them out in the next round as if their deadline had passed."""
        for eid, n in attempts:
            e = self.pending.get(eid)
            if e is not None and e.attempt == n and e.state in IN_FLIGHT:
                self._lost[eid] = n
        if self._lost:
            self.wake.set()

    def _take_lost(self, late: list[Execution]) -> list[Execution]:
        seen = {e.id for e in late}
        out = []
        for eid, n in self._lost.items():
            e = self.pending.get(eid)
            if e is not None and e.attempt == n and e.state in IN_FLIGHT and eid not in seen:
                out.append(e)
        self._lost.clear()
        return out

    async def time_out(self, now_ms: int) -> None:
        late = self.pending.expired(now_ms)
        lost = self._take_lost(late) if self._lost else []
        unstarted = starts.unstarted_cas(self.pending, [*late, *lost], now_ms)  # no start confirmed by start-by
        if not late and not lost and not unstarted:
            return
        cas = unstarted
        for e in late:  # a CANCELLING one ends CANCELLED: its kill deadline passed
            new, _ = result(e, e.attempt, succeeded=False, error_class=ErrorClass.TIMEOUT, now_ms=now_ms,
                            message=KILL_MESSAGE if e.state is ExecState.CANCELLING else
                            "deadline passed without a result")
            cas.append((e, new))
        for e in lost:  # the same CAS against the record this owner holds: a result recorded meanwhile wins
            new, _ = result(e, e.attempt, succeeded=False, error_class=ErrorClass.TIMEOUT, message=LOST_MESSAGE,
                            now_ms=now_ms)
            cas.append((e, new))
        ok = await self._commit([self.ledger.cas_op(new, old.mod_revision, payload=self._dead_payload(new),
                                                    now_ms=now_ms, old_state=old.state)
                                  for old, new in cas])
        for (_, new), (applied, rev) in zip(cas, ok, strict=False):
            if applied:
                self.stats.timed_out += 1
                self.pending.put(with_revision(new, rev))
                if self.metrics is not None:
                    self.metrics.attempt_recorded(new)
                cur = new.current
                if cur is not None and cur.never_started:  # start confirmation (planner/starts.py)
                    log.info("execution not started by its start-by deadline; dispatching it again",
                             extra={"event": "unstarted", **log_fields(new, self.p)})
                    continue
                log.info("execution timed out", extra={"event": "timeout", **log_fields(new, self.p)})
                if new.state is ExecState.DEAD_LETTER:
                    log.info("execution dead-lettered", extra={"event": "dead_letter", "task_type": new.task_type,
                                                               **log_fields(new, self.p)})
        if not all(a for a, _ in ok):
            raise Restart("a timeout compare-and-swap lost: a result arrived meanwhile")

    # ---- notices (scheduler.store.notices) --------------------------------------------------------

    def on_notice(self, key: bytes, notice: Notice, mod_revision: int) -> None:
        """A notice seen by the node's watch: re-read what it names in the next round, which starts now."""
        self._notices[key] = (notice, mod_revision)
        self.wake.set()

    def rescan_notices(self) -> None:
        """Events may have been missed (a compacted watch): list the partition's notices next round."""
        self._rescan = True
        self.wake.set()

    async def apply_notices(self) -> None:
        if self._rescan:
            self._rescan = False
            # Keys only: the owner needs what to re-read, not the cancel detail (the record says it).
            listing = await self.kv.range(self.ks.notices(self.p), prefix=True, keys_only=True,
                                          timeout=self.rpc_timeout)
            for kv in listing.kvs:
                n = parse_notice(kv.key, b"")
                if n is None or n.partition != self.p:
                    self._notices.setdefault(kv.key, (Notice(self.p, "", 0, -1), kv.mod_revision))  # junk: delete
                else:
                    self._notices.setdefault(kv.key, (n, kv.mod_revision))
        if not self._notices:
            return
        notices, self._notices = self._notices, {}
        wanted = [n for n, _ in notices.values() if n.schedule_id]
        listings = []
        for i in range(0, len(wanted), 32):  # a few reads in flight at once, not hundreds after a claim
            listings += await asyncio.gather(*(
                self.kv.range(self.ks.execution(self.p, n.schedule_id, n.from_ms),
                              range_end=self.ks.execution(self.p, n.schedule_id, n.through_ms + 1),
                              timeout=self.rpc_timeout)
                for n in wanted[i:i + 32]))
        unknown: set[str] = set()
        for listing in listings:
            for kv in listing.kvs:
                e = decode_execution(kv.value, kv.mod_revision)
                self._refresh(e)
                if not e.terminal and e.schedule_id not in self.schedules:
                    unknown.add(e.schedule_id)
        # Schedules and notices come on separate watch streams: a run triggered right after its
        # schedule was created can be noticed first. Read the schedule rather than take it for deleted.
        for sid in unknown:
            with contextlib.suppress(NotFound):
                self.on_schedule_put(await self.store.get(sid))
        # Only if unchanged since read: a newer notice on the same key (a cancel after a trigger) stays.
        await self._commit([txn([Compare.mod_revision(k, "==", rev)], [delete(k)])
                            for k, (_, rev) in notices.items()])

    def _refresh(self, e: Execution) -> None:
        """Take in a record as read from etcd (linearizable, so at least as new as the notice)."""
        old = self.pending.get(e.id)
        if old is not None and old.mod_revision > e.mod_revision:
            return  # our own dispatcher recorded something newer while we read
        cur = e.current
        if e.state in (ExecState.CANCELLED, ExecState.CANCELLING) and cur is not None and not cur.finished_ms:
            self.dispatcher.cancel(e, e.skip_reason or "cancelled")  # its worker is told to stop
        self.pending.put(e)
        if e.state is not ExecState.SCHEDULED or e.schedule_id not in self.schedules:
            return
        sch = self.schedules[e.schedule_id]
        if sch.stored.schedule.state is ScheduleState.PAUSED:
            self._withdraw.add(e.schedule_id)  # a run written as the pause landed is withdrawn too

    def _payload(self, e: Execution) -> bytes:
        """What the execution runs with: its own payload (a replay) or its schedule's current one."""
        if e.payload is not None:
            return e.payload
        sch = self.schedules.get(e.schedule_id)
        return sch.stored.schedule.payload if sch else b""

    def _token(self) -> str:
        """This owner's fencing token, for log lines about executions no attempt has carried yet."""
        fence = self.ownership.fence(self.p)
        return f"{self.p}:{fence.token}" if fence is not None else ""

    def _dead_payload(self, e: Execution) -> bytes:
        """A dead letter keeps the payload it ran with for a replay (as results.record_result does): its
        own (a replayed run) or the schedule's."""
        return self._payload(e) if e.state is ExecState.DEAD_LETTER else b""

    def record_transition(self, e: Execution) -> None:
        """A result recorded by this node's dispatcher: keep the snapshot current."""
        self.pending.put(e)
        self.wake.set()

    async def sweep(self, now_ms: int) -> int:
        """Delete terminal records past the retention period or count (never dead letters), and
        skip records past the period. Fenced like every owner write. Returns how many were deleted.

        Keys first: a key names the schedule and the planned time, so the candidates (too old, or
        beyond the count) are found without transferring a single record; only the candidates' values
        are read, to delete the terminal ones. A partition with nothing to delete costs one keys-only
        listing, not a read of its whole history."""
        listing = await self.kv.range(self.ks.executions(self.p), prefix=True, keys_only=True,
                                      timeout=self.rpc_timeout)
        cutoff = now_ms - self.s.retention_ms
        by_schedule: dict[bytes, list[tuple[int, bytes]]] = {}  # (planned ms, key), unfinished ones left out
        for i, x in enumerate(listing.kvs):
            head, _, planned = x.key.rpartition(b"/")
            by_schedule.setdefault(head, []).append((int(planned), x.key))
            if i % 5000 == 4999:
                await asyncio.sleep(0)  # a long history must not starve lease keep-alives
        candidates: list[bytes] = []
        for es in by_schedule.values():
            if len(es) <= self.s.retention_count and min(es)[0] >= cutoff:
                continue
            es.sort(reverse=True)
            # The count is of terminal records; unfinished ones (known to this owner) are not counted.
            kept = 0
            for planned_ms, k in es:
                if self.pending.get(self.ks.execution_id_of(k)) is not None:
                    continue
                if kept >= self.s.retention_count or planned_ms < cutoff:
                    candidates.append(k)
                else:
                    kept += 1
        doomed: list[Op] = []
        for i in range(0, len(candidates), 100):
            got = await self.kv.txn([], [get(k) for k in candidates[i:i + 100]], timeout=self.rpc_timeout)
            for r in got.responses:
                for x in getattr(r, "kvs", ()):
                    if peek_state(x.value) in TERMINAL:
                        # Only if unchanged since we read it: a replay may have brought it back to life.
                        doomed.append(txn([Compare.mod_revision(x.key, "==", x.mod_revision)], [delete(x.key)]))
        skips = await self.kv.range(self.ks.skips(self.p), prefix=True, keys_only=True, timeout=self.rpc_timeout)
        for kv in skips.kvs:
            through = int(kv.key.rsplit(b"-", 1)[1])
            if through < cutoff:
                doomed.append(delete(kv.key))
        await self._commit(doomed)
        self._rescan = True  # leftover notices (a lost watch event) are cleared with each sweep
        return len(doomed)

    # ---- the loop -----------------------------------------------------------------------------------

    async def run(self) -> None:
        await self.load()
        now = self.clock.wall_ms()
        runs, skips = self.catch_up(now)
        await self.write_planned(runs, skips, max(self.ck.watermark_ms, now - self.s.late_grace_ms))
        # Partitions sweep at staggered times (first sweep after 0.5-1x the interval), so that the
        # listings of all partitions a node claimed together do not land in the same instant.
        next_sweep = self.clock.monotonic() + self.s.retention_interval * (0.5 + (self.p % 16) / 32)
        while True:
            now = self.clock.wall_ms()
            if self.clock.monotonic() >= next_sweep:
                await self.sweep(now)
                next_sweep = self.clock.monotonic() + self.s.retention_interval
            # Work that is due first (timeouts, dispatch), then materialization, bounded per round:
            # under overload the loop keeps handing out work instead of only writing it down.
            await self.time_out(now)
            await self.apply_notices()  # records others changed: taken in before deciding on dispatch
            await self.dispatch_due(now)
            again = False
            if not self.backlogged(now):
                execs, skips, reached = self.plan_round(now + self.s.lookahead_ms, self.s.max_planned_per_round)
                await self.write_planned(execs, skips, reached)
                again = reached < now + self.s.lookahead_ms  # more to materialize
            self.stats.rounds += 1
            self.wake.clear()
            if again or self._notices:  # the next round starts at once (after the others had a turn)
                self.wake.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self.s.loop_interval)
