"""The planner loop of one owned partition: snapshot -> decide -> act, every `loop_interval`.

On claim it reads the checkpoint watermark W, the partition's schedules and its unfinished
executions, and applies each schedule's missed-run policy to the planned times it is owed: those
after its activation (create, resume, pause, spec change) that the checkpoint's writer had not
handled: `(max(W, activated), now - grace]` for an activation the writer knew (its revision at or
below the checkpoint's `sched_rev`), `(activated, now - grace]` for one it did not. Then each round:

1. materialize: every planned time up to `now + lookahead` becomes an execution record (created
   only if absent, inside the owner's fenced batch); a paused schedule's planned times get a skip
   record once they are due (not ahead: a resume before then runs them); the checkpoint moves to
   what the round reached in the last txn;
2. dispatch: due executions, per worker pool only as many as the pool can start, pass the overlap
   policy (decided from the records of the schedule's runs really in progress at their due time),
   are marked dispatched(attempt n, deadline) with a compare-and-swap, and go to the dispatch queue;
3. time out: in-flight attempts past their recorded deadline get a TIMEOUT result (retry or dead
   letter).

A schedule change seen by the watch re-plans the schedule from its activation (even when the
checkpoint is already past it: those planned times were planned under the old activation, or not at
all) and withdraws, with a recorded reason, pre-written runs the new activation does not plan.

Any FencedOut ends the loop at once (the ownership layer drops the partition); OutcomeUnknown and
lost compare-and-swaps end it too, and the node restarts it from etcd's state, which is always safe
because creates are idempotent and transitions are CAS.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from scheduler.clock import Clock
from scheduler.errors import NotFound
from scheduler.execution import (
    HOLDING,
    IN_FLIGHT,
    KILL_MESSAGE,
    ErrorClass,
    ExecState,
    Execution,
    Trigger,
    armed,
    as_created,
    cancel,
    log_fields,
    may_hand_out,
    reserve,
    result,
    skip,
    with_revision,
)
from scheduler.ids import FencingToken
from scheduler.loop_lag import LOAD_HEAP
from scheduler.metrics.planner import PlannerMetrics
from scheduler.model import ScheduleState
from scheduler.planner import starts
from scheduler.planner.activations import (
    Owed,
    Withdrawal,
    after_change,
    owed_activations,
    segments_between,
    withdrawal_rule,
)
from scheduler.planner.dispatch_round import RoundInput, ScheduleView, plan_dispatch
from scheduler.planner.inherited import inherited_missed
from scheduler.planner.materialize import Materializer, Tracked
from scheduler.planner.ownership import Ownership
from scheduler.planner.pending import PendingIndex
from scheduler.planner.retention import History, retention_deletes
from scheduler.planner.settings import PlannerSettings
from scheduler.quota.pacer import TenantPacer
from scheduler.store.checkpoint import Checkpoint, advance, read_checkpoint
from scheduler.store.codec import decode_execution, decode_schedule, decode_schedule_meta
from scheduler.store.combiner import WriteCombiner
from scheduler.store.etcd.errors import Malformed
from scheduler.store.etcd.ops import Compare, Op, delete, get, put, txn
from scheduler.store.etcd.types import TxnResult
from scheduler.store.fenced import Fence, FenceStats, fenced_txn
from scheduler.store.keyspace import Keyspace
from scheduler.store.kv import KV
from scheduler.store.ledger import Ledger
from scheduler.store.notices import Notice, parse_notice
from scheduler.store.paging import range_pages
from scheduler.store.schedules import ScheduleStore, StoredSchedule
from scheduler.store.txn_check import duplicate_write
from scheduler.tasks import Pacer
from scheduler.timeplan import Overlap, SkipReason
from scheduler.timeplan.missed import SkipRange, cut_out, split_around

log = logging.getLogger(__name__)


LOST_MESSAGE = ("worker stopped heartbeating or disconnected, and no planner re-attached the attempt within "
                "the heartbeat timeout")


class Restart(Exception):
    """State may be stale (a lost CAS, an unknown outcome): reload from etcd."""


# Dispatch passes per round at most (PartitionPlanner.dispatch_due): each puts aside only runs due now.
DISPATCH_PASSES = 8


class DispatchSink(Protocol):
    def capacity(self, pool: str) -> int:
        """How many more assignments workers of this pool can take now (granted credits)."""
        ...

    def served(self, pool: str) -> bool:
        """Whether workers of the pool are connected, busy or not: a pool without capacity is saturated
        (its held planned times run late) rather than without workers (they are missed, by the policy)."""
        ...

    def reserve(self, pool: str, n: int) -> None:
        """Hold `n` of the pool's capacity for dispatches being committed: the partition loops run
        concurrently, and without this each would see (and take) the whole capacity."""
        ...

    def release(self, pool: str, n: int) -> None:
        """Give back a reservation (after the dispatches were submitted or abandoned)."""
        ...

    def submit(self, e: Execution, payload: bytes, token: FencingToken) -> None: ...

    def expect(self, attempts: Sequence[tuple[str, int]]) -> None:
        """Attempts (execution id, attempt) running at this owner's claim: unless a worker reports one
        within the heartbeat timeout, it is lost (`PlannerNode.on_lost_attempts`)."""
        ...

    def cancel(self, e: Execution, reason: str) -> None: ...

    def disarm(self, e: Execution) -> None:
        """Tell the worker holding e's armed attempt (start ahead) not to start it."""
        ...

    def may_arm(self, pool: str) -> bool:
        """Start ahead: whether every worker stream of the pool honours `start_in` (Hello.capabilities): a run
        handed out early to one that does not would start at once, before its due time."""
        ...


@dataclass(frozen=True)
class _Claimed:
    revision: int  # the listing's: watch from here
    runs: list[Execution]  # the claim's catch-up decisions (start() writes them)
    skips: list[tuple[str, SkipRange]]
    now_ms: int  # the wall time they were decided at: its horizon is the first checkpoint's watermark
    # Runs the previous owner wrote ahead that the missed-run policy does not run (planner/inherited.py): (record,
    # its skip), written before the catch-up.
    missed: list[tuple[Execution, Execution]]


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
        node_stats: PlannerStats | None = None,
        load_gate: asyncio.Semaphore | None = None,
        pacer: TenantPacer | None = None,
    ) -> None:
        self.p = partition
        # The node's executions-per-second quota pacer (scheduler/quota/pacer.py): defers the start of a
        # tenant's runs over its rate as they are materialized. None: no quotas.
        self.pacer = pacer
        self.load_gate = load_gate  # shared by the node's partitions: how many load at once
        self.load_turns = 0  # event-loop turns the last load gave (a test checks that a big one did)
        self.metrics = metrics
        self.combiner = combiner
        self.kv, self.ks, self.ownership, self.store, self.ledger = kv, ks, ownership, store, ledger
        self.dispatcher, self.s, self.clock, self.node_id = dispatcher, settings, clock, node_id
        self.rpc_timeout, self.disable_fencing = rpc_timeout, disable_fencing
        self.fence_stats = fence_stats or FenceStats()
        self.stats = PlannerStats()
        # The node's totals over all its partition loops, past ones too (scheduler_planner_rounds_total).
        self.node_stats = node_stats or PlannerStats()
        # Ids of runs created by a catch-up: a run that was late by design is no overlap for the runs
        # planned while it waited (they queue behind it instead of being skipped).
        self._catchup: set[str] = set()
        self.m = Materializer(partition, settings, clock, self._catchup)  # what is owed, and what to write
        self.schedules = self.m.schedules
        self.pending = PendingIndex(settings.overlap_settle_ms, self._pool_of,  # unfinished executions here
                                    settings.start_ahead_ms)
        # Pre-written runs to withdraw (schedule id -> (planned after, reason)): a pause or delete
        # withdraws every scheduled one, a spec change those after it that the new spec does not plan.
        self._withdraw: dict[str, Withdrawal] = {}
        # Start ahead: runs a withdrawal found handed out early (judged as waiting, `_waiting_view`) and withdrew:
        # id -> (attempt, skip reason), written once the run is back unstarted (its disarm's not-started result).
        self._armed_withdrawn: dict[str, tuple[int, str]] = {}
        # ... and the records of runs disarmed by a change of their schedule, as they were then: judged so by the
        # change's withdrawal even if they are back (their not-started result written) before it is applied.
        self._disarmed: dict[str, Execution] = {}
        # Overlap skips and cancels are decided only on records confirmed in flight after the due time
        # of the run they would skip: id -> (mod_revision, wall ms the confirming read was sent).
        self._confirmed: dict[str, tuple[int, int]] = {}
        self._confirm: set[str] = set()  # ids to re-read at the start of the next round
        # The schedule revision this loop has taken in (load, then each watch event): what a checkpoint
        # written after planning says its writer knew. Events during load() wait in `_loading`.
        self.sched_rev = 0
        self._loading: list[Callable[[], None]] | None = None
        self._listing_rev = 0  # the revision the load's ledger listing was read at
        self.reload = False  # the node's schedule watch lost events (compaction): reload from etcd
        self.ck = Checkpoint(partition, 0, 0)
        self.wake = asyncio.Event()
        self.max_ops = max_ops
        # Due work is waiting for worker capacity: the node wakes this loop when credits arrive,
        # instead of letting it wait out `loop_interval`.
        self.starved = False
        self.starved_pools: set[str] = set()  # pools whose whole capacity the last round used
        self._pools: frozenset[str] | None = None  # worker pools of the schedules (cache)
        self._stone_deletes: dict[bytes, int] = {}  # handled tombstones to delete (key -> its revision)
        # What the previous owners recorded after the checkpoint's replan margin, as the claim read it: planned
        # times with an execution record (Ledger.list_for_claim) and skip ranges, per schedule. Until this
        # owner's writes are past them, it writes no skip over the one and no run under the other: a planned
        # time has one record (`_one_record_per_time`).
        self._recorded: dict[str, list[int]] = {}
        self._known_skips: dict[str, list[tuple[int, int]]] = {}
        self._guard_until = 0
        # schedules whose runs planned at or before their creation (an earlier schedule of the id's) are withdrawn
        # in the next round (set at a claim): schedule id -> its created_ms
        self._stale: dict[str, int] = {}
        self._late_held: set[str] = set()  # schedules a claim read a saturated pool's hold of (their runs run late)
        # Notices of records others changed (API operations, results recorded elsewhere): key ->
        # (notice, its mod_revision). `_rescan`: list the partition's notices from etcd next round.
        self._notices: dict[bytes, tuple[Notice, int]] = {}
        self._rescan = False
        self.history = History()  # what retention needs to list (planner/retention.py)
        # Attempts whose worker stream was lost (execution id -> attempt): timed out by the next round.
        self._lost: dict[str, int] = {}

    # ---- snapshot ---------------------------------------------------------------------------------

    async def load(self) -> int:
        """Read checkpoint, schedules and unfinished executions; returns the revision to watch from.

        Schedule changes the node's watch routes here while the reads and the planning are under way are
        held and applied afterwards (each is ignored if the listing already has its version): the work is
        sliced into bounded stretches between event-loop turns (a claim of tens of thousands of schedules
        in one go starved the lease keep-alive), and a change applied halfway would be overwritten by the
        listing's older version. At most `load_gate` partitions of the node load at once: every loading
        partition takes one slice per loop turn, so many at once would make each turn long again."""
        return (await self._claim(decide=False)).revision

    async def _claim(self, *, decide: bool) -> _Claimed:
        """load(), and with `decide` the claim's missed-run decisions (Materializer.catch_up) too, sliced
        the same way and before the held watch events are applied: a change seen during the claim is
        taken in as a change after the listing's snapshot, as if it had arrived just after the claim."""
        self._loading = []
        pacer = Pacer()
        decided: tuple[list[Execution], list[tuple[str, SkipRange]]] = ([], [])
        missed: list[tuple[Execution, Execution]] = []
        now = 0
        try:
            # No full collection in the middle of a load; what it loaded is frozen (loop_lag.LoadHeap).
            async with self.load_gate or contextlib.nullcontext():
                with LOAD_HEAP.loading():
                    started = self.clock.monotonic()
                    rev = await self._load(pacer)
                    if decide:
                        now = self.clock.wall_ms()  # the catch-up horizon; the first checkpoint is written at it
                        # Where each schedule with waiting runs was handled up to, before the catch-up moves it.
                        owed = {sid: sch.owed_from for sid in self.pending.schedule_ids()
                                if (sch := self.schedules.get(sid)) is not None}
                        steps = self.m.catch_up_steps(now)
                        while True:
                            try:
                                next(steps)
                            except StopIteration as done:
                                decided = done.value
                                break
                            await pacer.pace()
                        missed = inherited_missed(list(self.pending.values()), self.pending.ended, self.schedules,
                                                  owed, decided[0],
                                                  now - self.s.late_grace_ms,
                                                  {*self._withdraw, *self._late_held}, decided[1])
                    LOAD_HEAP.loaded(len(self.schedules))
        finally:
            held, self._loading = self._loading, None
        for apply in held:
            apply()
        self.load_turns = pacer.turns
        # How long a claim takes to be ready, and how big it is (bench/bench_scale.py reads these lines).
        log.info("partition loaded", extra={
            "event": "partition_loaded", "partition": self.p, "schedules": len(self.schedules),
            "unfinished": len(self.pending), "seconds": round(self.clock.monotonic() - started, 3),
            "turns": pacer.turns})
        return _Claimed(rev, decided[0], decided[1], now, missed)

    async def _load(self, pacer: Pacer) -> int:
        ck = await read_checkpoint(self.kv, self.ks, self.p, timeout=self.rpc_timeout)
        stored, rev = await self.store.list_partition(self.p, pacer=pacer)
        listing = await self.ledger.list_for_claim(self.kv, self.p, timeout=self.rpc_timeout, pacer=pacer,
                                                   recorded_after=ck.watermark_ms - self.m.replan_ms)
        holds = await self.kv.range(self.ks.holds(self.p), prefix=True, timeout=self.rpc_timeout)
        margin = ck.watermark_ms - self.m.replan_ms
        known_skips: dict[str, list[tuple[int, int]]] = {}
        async for kvs, _ in range_pages(self.kv, self.ks.skips(self.p), keys_only=True, timeout=self.rpc_timeout):
            for x in kvs:
                sid, after, through = self.ks.skip_of(x.key)
                if through > margin:
                    known_skips.setdefault(sid, []).append((after, through))
            await pacer.pace()
        stones = await self.kv.range(self.ks.tombstones(self.p), prefix=True, timeout=self.rpc_timeout)
        self.ck = ck
        self.sched_rev = max(rev, ck.sched_rev)
        self._recorded, self._known_skips = listing.recorded, known_skips
        self._guard_until = max([t for ts in listing.recorded.values() for t in ts]
                                + [b for rs in known_skips.values() for _, b in rs], default=0)
        self._listing_rev = listing.revision
        self.pending.clear()
        for e in listing.unfinished:
            self.pending.put(e)
        for e in listing.ended:  # after the waiting runs: each is kept only if one of them may need it
            self.pending.recall_ended(e)
        self.m.clear()
        self._withdraw.clear()
        self._armed_withdrawn.clear()
        self._disarmed.clear()
        self._confirmed.clear()
        self._pools = None
        held_from: dict[str, int] = {}
        held_late: set[str] = set()  # held while their pool was saturated: late, not missed
        self._late_held = held_late
        for kv in holds.kvs:
            sid = self.ks.last_segment(kv.key)
            hold = json.loads(kv.value)
            held_from[sid] = int(hold["from"])
            if hold.get("late"):
                held_late.add(sid)
            self.m.hold_writes[sid] = None  # planned again from `from`: deleted (start() keeps it one round)
        # A hold from before a schedule's creation was an earlier schedule's of the same id (deleted and created
        # again before an owner handled the delete): its tombstone decides those times (`_bury`), not the new
        # schedule's policies (the stateful twin: the new one ran the old one's held times before its creation).
        # One from the creation's instant on is the new schedule's (it covers only times after it, all the new
        # one's): created at x.999 on a whole-second spec, its first time held made `from` equal the creation, and
        # the claim took the hold for the earlier schedule's, owed nothing from it and lost the held times (the
        # stateful twin, session 29: six planned times with no record).
        ours = {st.schedule.id: f for st in stored if (f := held_from.get(st.schedule.id)) is not None
                and f >= st.meta.created_ms}
        for st in stored:
            await pacer.pace()
            owed = self.m.owed_from_checkpoint(st, ck)
            if st.schedule.id in ours and st.schedule.id not in held_late:
                owed = max(st.activated_ms, min(owed, ours[st.schedule.id]))  # not materialized: owed
            self.m.track(st, owed)
            earlier = owed_activations(st, ck)
            hold_at = ours.get(st.schedule.id)
            if hold_at is not None and hold_at < st.activated_ms:
                # Held under an earlier activation, which ended (a change while no owner was there): its held
                # planned times up to the change are decided as missed by its policy (run late if the hold was
                # only a saturated pool's). Each activation since the hold decides its own stretch, ended as the
                # next one ends it (the stateful twin: held, paused, resumed and changed while nobody owned the
                # partition; the claim took the whole stretch for the pause's and recorded the times after the
                # resume `paused`).
                pieces = segments_between(st, hold_at, st.activated_ms)
                for i, seg in enumerate(pieces):
                    nxt = pieces[i + 1].schedule if i + 1 < len(pieces) else st.schedule
                    with contextlib.suppress(Exception):  # a stored spec a newer engine refuses: nothing to plan
                        self.m.held[st.schedule.id] = seg.after_ms
                        self.m.held_dirty = True
                        if st.schedule.id in held_late:
                            self.m.held_late.add(st.schedule.id)  # its times run late (`settle_hold`)
                        self.m.settle_hold(Tracked(replace(st, schedule=seg.schedule), seg.schedule.plan(), 0,
                                                   seg.after_ms), seg.until_ms,
                                           SkipReason.PAUSED if nxt.state is ScheduleState.PAUSED
                                           else SkipReason.SCHEDULE_CHANGED)
            elif hold_at is None:
                self._settle_earlier(st, earlier, ck)
            elif st.schedule.id in held_late and (sch := self.m.schedules.get(st.schedule.id)) is not None:
                # The dead owner held these times only because every worker of the pool was busy: they run late,
                # as they would have under it (`_release_held`), up to the watermark; after it, this claim's
                # catch-up decides them as any outage's. (The stateful twin: the catch-up took the held times
                # for missed, and s3@8 was recorded `policy_skip` though its pool was only saturated.)
                if st.schedule.state is ScheduleState.PAUSED:
                    self.m.settle(sch, hold_at, owed)  # recorded as paused
                else:
                    self.m.rewrite(sch, hold_at, owed)
            if st.schedule.state is ScheduleState.PAUSED:
                self._withdraw[st.schedule.id] = Withdrawal(SkipReason.PAUSED)
            elif ck.sched_rev and st.activation_rev > ck.sched_rev:
                # Changes the checkpoint's writer had not seen: its pre-written runs they do not plan, and those
                # planned while a pause it knew was in force, or a spec it knew does not plan. Whatever the
                # watermark: the writer may have written runs ahead of it (a paused schedule holds it back while
                # the others are written ahead).
                tracked = self.schedules.get(st.schedule.id)  # absent: a spec this engine cannot plan
                seen = earlier.seen
                after = (seen.after_ms if seen is not None
                         else earlier.first_change_ms if earlier.first_change_ms is not None else st.activated_ms)
                if tracked is not None:
                    self._withdraw[st.schedule.id] = Withdrawal(
                        SkipReason.SCHEDULE_CHANGED, after_ms=after, rule=withdrawal_rule(earlier, tracked.plan),
                        ahead_ms=self._written_ahead(st.schedule.id))
        with_runs = {e.schedule_id for e in listing.unfinished}
        for sid in with_runs - self.schedules.keys():
            self._withdraw[sid] = Withdrawal(SkipReason.SCHEDULE_DELETED)
        # Runs written under an earlier pool follow the schedule's pool here too: an update's retarget is in
        # the owner's memory only (written with the run's next transition), so a new owner read them in the
        # old pool, where nobody took them (the stateful twin: a pool fixed from `nobody` to `b`, then two
        # handovers). Only schedules with unfinished runs: not a look per held schedule at every claim.
        for sid in with_runs & self.schedules.keys():
            self._retarget(sid, self.schedules[sid].stored.schedule.worker_pool)
            if sid not in self._withdraw and self._unplanned_ahead(self.schedules[sid]):
                # Runs written ahead under an earlier spec that the current one does not plan after its
                # change: their writer, which saw the change, withdraws them only once due, and may have died
                # first (the stateful twin: a change at 0.70 s, the owner killed at 0.75 s, the old spec's
                # run at 0.88 s ran under the next owner). Judged the same way here.
                st = self.schedules[sid].stored
                self._withdraw[sid] = Withdrawal(SkipReason.SCHEDULE_CHANGED, after_ms=st.activated_ms,
                                                 ahead_ms=self._written_ahead(sid))
        # Runs of an earlier schedule of the same id, deleted and created again while nobody owned the partition
        # (or before its owner applied the delete): withdrawn in the first round, whatever their pool (the
        # stateful twin: one moved to the new schedule's pool, without workers, stayed scheduled for good).
        self._stale = {sid: created for sid in with_runs & self.schedules.keys()
                       if (created := self.schedules[sid].stored.meta.created_ms)}
        # The records were just read: notices left from before (no owner, a crash) are cleared in the
        # first round, after re-reading what they name (cheap, and correct whatever their age).
        self._rescan = True
        self._stone_deletes = {}
        for x in stones.kvs:
            self._bury(self.ks.last_segment(x.key), x.value, x.mod_revision, held_from)
            await pacer.pace()
        self._recall_catchups([*listing.unfinished, *listing.ended], {st.schedule.id: st for st in stored})
        return rev

    def _recall_catchups(self, records: list[Execution], stored: dict[str, StoredSchedule]) -> None:
        """Which loaded runs a catch-up made (the overlap rule exempts them, docs/time.md): a catch-up run
        is due when its owner created it, later than its planned time plus the schedule's jitter, which
        no other scheduled run is. Without this, a takeover mid-catch-up judged the catch-up's runs, all
        due at the same instant, as late runs overlapping each other (a smoke drill: 1 of 5 ran)."""
        for e in records:
            if e.trigger is not Trigger.SCHEDULED or e.overlap is not None or e.run_trigger is not None:
                continue
            st = stored.get(e.schedule_id)
            jitter = st.schedule.policies.jitter_ms if st is not None else 0
            if e.due_ms > e.planned_ms + jitter:
                self._catchup.add(e.id)

    def _settle_earlier(self, st: StoredSchedule, earlier: Owed, ck: Checkpoint) -> None:
        """The planned times of earlier activations the checkpoint's writer did not finish: the one it
        knew from the watermark, each it never saw from its own instant (runs it may have written ahead
        under the one it knew stand when the later activation plans them too)."""
        w = ck.watermark_ms
        if earlier.seen is not None:
            seg = earlier.seen
            self.m.settle(Tracked(replace(st, schedule=seg.schedule), seg.schedule.plan(), 0, 0),
                          max(w, seg.after_ms), seg.until_ms)
        for seg in earlier.unseen:
            tr = Tracked(replace(st, schedule=seg.schedule), seg.schedule.plan(), 0, 0)
            lo = max(seg.after_ms, w - self.m.replan_ms)
            if seg.paused:
                self.m.settle(tr, lo, seg.until_ms)
            else:
                self.m.rewrite(tr, lo, min(w, seg.until_ms))
                self.m.settle(tr, max(w, lo), seg.until_ms)

    def _bury(self, sid: str, stone: bytes, revision: int, held_from: dict[str, int]) -> None:
        """A deleted schedule's tombstone: its planned times owed up to the delete that no owner handled
        (the delete landed while this partition had no owner, or before its owner planned them) are
        recorded as skipped (`schedule_deleted`); the tombstone goes with the next write."""
        self._stone_deletes[self.ks.tombstone(self.p, sid)] = revision
        try:
            d = json.loads(stone)
            # Earlier schedules of this id deleted before any owner handled their delete (a create and a delete
            # again while the partition had no owner), oldest first: ScheduleStore.delete keeps them.
            parts = [*d.get("earlier", ()), d]
        except Exception:  # a tombstone we cannot read: nothing to record from it
            log.warning("unreadable tombstone", extra={"partition": self.p, "schedule_id": sid})
            return
        for i, one in enumerate(parts):
            # A hold was written by an owner for the schedule it knew: the oldest one not handled.
            self._bury_one(sid, one, held_from if i == 0 else {})

    def _bury_one(self, sid: str, d: dict[str, Any], held_from: dict[str, int]) -> None:
        try:
            value = json.dumps(d["schedule"]).encode()
            st = StoredSchedule(*decode_schedule(value, int(d.get("rev", 0))), self.p, decode_schedule_meta(value))
            deleted_ms = int(d.get("deleted_ms", 0))
        except Exception:  # a tombstone we cannot read: nothing to record from it
            log.warning("unreadable tombstone", extra={"partition": self.p, "schedule_id": sid})
            return
        current = self.schedules.get(sid)
        if deleted_ms <= 0:
            # A tombstone that does not say when the delete was (a writer that left its instant out):
            # recording nothing would lose the planned times owed up to the delete without a trace. The
            # delete was no later than now, and before any schedule of this id there is now was created;
            # the times after it that this range covers too were not owed, so a skip of them is harmless.
            deleted_ms = self.clock.wall_ms() if current is None else current.stored.meta.created_ms
            log.warning("tombstone without its delete's instant: recorded as deleted up to %d", deleted_ms,
                        extra={"partition": self.p, "schedule_id": sid})
        elif current is not None and current.stored.activated_ms < deleted_ms:
            return  # the listing already has a schedule of this id from before the delete: not this one
        after = self.m.owed_from_checkpoint(st, self.ck)
        why = SkipReason.PAUSED if st.schedule.state is ScheduleState.PAUSED else SkipReason.SCHEDULE_DELETED
        ck, earlier = self.ck, owed_activations(st, self.ck)
        if earlier.seen is not None:
            after, why = min(after, max(ck.watermark_ms, earlier.seen.after_ms)), SkipReason.SCHEDULE_DELETED
        if earlier.unseen:
            # Also after one it knew (as `_settle_earlier`): it planned up to the watermark under that one,
            # so the times of each later activation it never saw, before the watermark, were never written.
            first = max(earlier.unseen[0].after_ms, ck.watermark_ms - self.m.replan_ms)
            after, why = min(after, first), SkipReason.SCHEDULE_DELETED
        if sid in held_from:  # held (its pool had no worker) since then, and deleted before it was served
            after, why = min(after, held_from[sid]), SkipReason.SCHEDULE_DELETED
        # One range: whatever the activation, these planned times were not run because of the delete.
        if deleted_ms > after:
            # Not stamped with a plan: the range may span activations of different specs; listed unexpanded.
            self.m.settled.append((sid, SkipRange(why, after, deleted_ms)))

    def on_schedule_put(self, st: StoredSchedule) -> None:
        """A create or update seen by watch. A new activation (create, pause, resume, spec change) is
        planned from its instant, even when the checkpoint is past it; any other change (policies,
        pool, payload, labels) keeps the plan."""
        if self._loading is not None:
            self._loading.append(lambda: self.on_schedule_put(st))
            return
        self.sched_rev = max(self.sched_rev, st.schedule.version)
        sid = st.schedule.id
        old = self.schedules.get(sid)
        if old is not None and old.stored.schedule.version >= st.schedule.version:
            return
        self._disarm_schedule(sid)
        if old is not None and old.stored.schedule.policies.overlap != st.schedule.policies.overlap:
            # Runs parked behind a run in flight were parked by the old policy: decided again by the new.
            # Left parked, a run behind one in flight waits until no run of its schedule is in flight, which
            # under allow_all may never be (the game day: a skip schedule made allow_all with one run
            # parked; that run stayed unstarted to the end while the later ones ran).
            self.pending.release_all_behind(sid)
        if old is not None and old.stored.activation_rev == st.activation_rev:
            if old.stored.schedule.worker_pool != st.schedule.worker_pool:
                self._pools = None
                self.m.held_dirty = True  # a held schedule's pool: released or not by the new one
            old.stored = st
            self._retarget(sid, st.schedule.worker_pool)
            self.wake.set()
            return
        # Never earlier than the margin behind the checkpoint: records there may have been swept. A
        # resume seen late leaves the planned times already recorded as paused to that record.
        was_paused = old is not None and old.stored.schedule.state is ScheduleState.PAUSED
        owed = max(st.activated_ms, self.ck.watermark_ms - self.m.replan_ms,
                   old.handled if old and was_paused else 0)
        if old is not None and sid not in self.m.held:  # the old activation's times up to the new one
            self.m.settle(old, max(old.owed_from, old.handled), st.activated_ms)
        self.m.track(st, owed)
        self._pools = None
        w = self._withdraw.get(sid)
        if old is None and w is not None and w.reason is SkipReason.SCHEDULE_DELETED and not w.before_rev:
            # Created again before the delete's withdrawal was applied (both seen in one round): the delete
            # withdraws only the deleted schedule's runs, not the new one's, and keeps those of the new one's
            # own planned times (same ids; the twin: a delete and a create at one instant skipped the new
            # schedule's first run as `schedule_deleted`).
            self._withdraw[sid] = replace(w, until_ms=st.activated_ms, before_rev=st.schedule.version)
        if st.schedule.state is ScheduleState.PAUSED:
            self._withdraw[sid] = Withdrawal(SkipReason.PAUSED)
        else:
            if old is not None:
                if old.stored.schedule.state is ScheduleState.PAUSED:
                    self.pending.unpark(sid)  # retries held while paused continue
                    w = self._withdraw.get(sid)
                    if w is not None and w.reason is SkipReason.PAUSED and w.until_ms is None:
                        # A pause not applied yet: it withdraws only what was planned before this resume.
                        self._withdraw[sid] = replace(w, until_ms=st.activated_ms)
                elif (cur := self.schedules.get(sid)) is not None:
                    self._withdraw[sid] = after_change(self._withdraw.get(sid), old.plan, cur.plan, st.activated_ms,
                                                       max(old.handled, self._written_ahead(sid)))
            self._retarget(sid, st.schedule.worker_pool)
        self.wake.set()

    def _may_arm(self, x: Execution) -> bool:
        """Start ahead: x may be handed out before its due time. Its schedule's current activation owes it (it
        plans x, after its activation) and no withdrawal is pending for the schedule (a pause, a delete or a spec
        change that decides the runs written ahead once they are due: a run it withdraws must not be armed in
        the meantime; the stateful twin armed a run of the old spec again after its disarm), and nothing else
        of the schedule is unfinished here (`PendingIndex.may_arm`)."""
        sid = x.schedule_id
        sch = self.schedules.get(sid)
        return (sch is not None and sid not in self._withdraw and sid not in self._stale
                and x.id not in self._armed_withdrawn
                and x.planned_ms > sch.stored.activated_ms and sch.plan.next_after_ms(x.planned_ms - 1) == x.planned_ms
                and self.pending.may_arm(x) and self.dispatcher.may_arm(x.pool))

    def _disarm_schedule(self, sid: str) -> None:
        """Start ahead: any change of a schedule (a pause, an update, a delete) disarms its runs armed on workers
        for their due time; each comes back as a new run (its not-started result) and is decided again under
        the schedule as it is now: withdrawn as paused, changed or deleted once due, or armed again."""
        if not self.s.start_ahead_ms:
            return
        now = self.clock.wall_ms()
        for x in self.pending.of_schedule(sid):
            if armed(x, now):
                self.dispatcher.disarm(x)
                self._disarmed[x.id] = replace(x, state=ExecState.SCHEDULED)

    def _own_waiting(self, sid: str) -> list[int]:
        """Planned times of the schedule's own runs written and not dispatched yet (or handed out early: start
        ahead)."""
        return [x.planned_ms for x in self.pending.of_schedule(sid)
                if (x.state is ExecState.SCHEDULED or _handed_out_early(x)) and x.trigger is Trigger.SCHEDULED]

    def _unplanned_ahead(self, sch: Tracked) -> bool:
        """A run of the schedule's own waiting, planned after its activation, that its plan does not plan."""
        return any(t > sch.stored.activated_ms and sch.plan.next_after_ms(t - 1) != t
                   for t in self._own_waiting(sch.stored.schedule.id))

    def _written_ahead(self, sid: str) -> int:
        """The last planned time of a run of the schedule's own written ahead and waiting (0: none)."""
        return max(self._own_waiting(sid), default=0)

    def _pool_of(self, sid: str) -> str | None:
        sch = self.schedules.get(sid)
        return sch.stored.schedule.worker_pool if sch is not None else None

    def _retarget(self, sid: str, pool: str) -> None:
        """Runs waiting for a worker follow their schedule's pool (an update fixing a mistyped pool
        must not leave the runs written meanwhile waiting for the wrong pool for ever)."""
        for x in self.pending.of_schedule(sid):
            if x.pool != pool and x.state in (ExecState.SCHEDULED, ExecState.RETRY_WAIT):
                self.pending.put(replace(x, pool=pool))

    def on_schedule_delete(self, schedule_id: str, revision: int = 0) -> None:
        if self._loading is not None:
            self._loading.append(lambda: self.on_schedule_delete(schedule_id, revision))
            return
        self.sched_rev = max(self.sched_rev, revision)
        old = self.schedules.pop(schedule_id, None)
        self._disarm_schedule(schedule_id)
        self.m.held_dirty = True
        held = schedule_id in self.m.held  # (settle_hold ends the hold: read before, or both would record)
        if old is not None and held:
            self.m.settle_hold(old, self.clock.wall_ms(), SkipReason.SCHEDULE_DELETED)
        self._pools = None
        self._withdraw[schedule_id] = Withdrawal(SkipReason.SCHEDULE_DELETED)
        if old is not None and not held:
            # Its planned times up to the delete this owner has not handled yet (none, normally).
            self.m.settle_deleted(old, self.clock.wall_ms())
        if revision:  # the tombstone written with the delete (same revision): handled, so it goes
            self._stone_deletes[self.ks.tombstone(self.p, schedule_id)] = revision
        self.wake.set()

    # ---- decide + act ---------------------------------------------------------------------------

    async def _fenced(self, fence: Fence, ops: Sequence[Op], compares: Sequence[Compare] = ()) -> list[TxnResult]:
        dup = duplicate_write(ops)
        if dup is not None:  # etcd would refuse the whole txn: stop before sending, loudly (a bug)
            raise Malformed(f"partition {self.p}: one batch writes {dup.decode(errors='replace')!r} twice")
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

    def update_blocked(self, now_ms: int) -> None:
        """Which pools are blocked (see `blocked_pools`): due work older than `backlog_ms` waits for them,
        and their workers have no capacity left (none at all, or the last round used all of it)."""
        late = now_ms - self.s.backlog_ms
        blocked = set()
        for pool in {*self.pending.pools(), *self.m.blocked_pools}:
            oldest = self.pending.oldest_ready(pool)
            if oldest is not None and oldest < late and (pool in self.starved_pools
                                                         or self.dispatcher.capacity(pool) <= 0):
                blocked.add(pool)
        self.m.blocked_pools = blocked
        self.m.starved_pools = self.starved_pools

    def _one_record_per_time(self, execs: list[Execution], skips: list[tuple[str, SkipRange]]
                             ) -> tuple[list[Execution], list[tuple[str, SkipRange]]]:
        """What the previous owners recorded stands, and nothing is written over it: a skip range goes around
        the planned times that have an execution record (a run the previous owner wrote ahead of its watermark)
        and around the skip ranges recorded already, and a run of a planned time a skip range already covers is
        not created. A claim plans the activations
        its predecessor's checkpoint did not know again from the replan margin, and a predecessor that died
        after its claim's first write had decided some of those times already (the stateful twin: a `policy_skip`
        range, then the same time created as a run by the next claim, and run)."""
        known = self._known_skips
        if known:
            execs = [e for e in execs
                     if not (e.trigger is Trigger.SCHEDULED and e.run_trigger is None and e.schedule_id in known
                             and any(a < e.planned_ms <= b for a, b in known[e.schedule_id]))]
            skips = [(sid, piece) for sid, r in skips
                     for piece in (cut_out(r, known[sid]) if sid in known else (r,))]
        rec = self._recorded
        if rec:
            skips = [(sid, piece) for sid, r in skips
                     for piece in (split_around(r, rec[sid]) if sid in rec else (r,))]
        return execs, skips

    def _around_pending(self, skips: list[tuple[str, SkipRange]]) -> list[tuple[str, SkipRange]]:
        """A skip range goes around the planned times this owner holds a record of: a run written ahead that a
        later plan of the same instant decides again, e.g. a spec change whose new spec has the instant too (the
        run is kept, not withdrawn) followed by the catch-up of a hold (the stateful twin: `@every 1s` changed to
        every second on a workerless pool, then moved to one with workers; s3@11 ran, and was recorded as
        `outside_catchup_window` too). Skips are few (a catch-up's ranges): the lookup is per range."""
        out: list[tuple[str, SkipRange]] = []
        for sid, r in skips:
            times = [e.planned_ms for e in self.pending.of_schedule(sid) if r.after_ms < e.planned_ms <= r.through_ms]
            out.extend((sid, piece) for piece in split_around(r, times)) if times else out.append((sid, r))
        return out

    async def _around_records(self, skips: list[tuple[str, SkipRange]]) -> list[tuple[str, SkipRange]]:
        """The skip ranges of schedules with ranges decided over a hold (`Materializer.verify`) go around the
        planned times etcd holds a record of: one that ran and ended is no longer among this owner's pending."""
        check = list(dict.fromkeys((sid, r.after_ms, r.through_ms) for sid, r in skips if sid in self.m.verify))
        if not check:
            return skips
        found = dict(zip(check, await self.ledger.planned_in(self.kv, self.p, check, timeout=self.rpc_timeout),
                         strict=True))
        self.m.verify.difference_update(sid for sid, _, _ in check)
        out: list[tuple[str, SkipRange]] = []
        for sid, r in skips:
            times = found.get((sid, r.after_ms, r.through_ms))
            out.extend((sid, piece) for piece in split_around(r, times)) if times else out.append((sid, r))
        return out

    async def write_planned(
        self, execs: list[Execution], skips: list[tuple[str, SkipRange]], watermark_ms: int, sched_rev: int
    ) -> None:
        """Creates, skips and the checkpoint in ONE fenced txn when they fit (the common case); a larger
        batch goes in chunks with the checkpoint last. An idle partition writes its checkpoint only
        every `checkpoint_interval_ms`, so hundreds of idle partitions do not flood etcd.

        `sched_rev`: the schedule revision the planning was done at (every activation at or before
        it had all its planned times up to the watermark handled), recorded with the checkpoint."""
        if self._guard_until:
            execs, skips = self._one_record_per_time(execs, skips)
            if watermark_ms > self._guard_until:  # past everything the claim read: nothing left to guard
                self._recorded, self._known_skips, self._guard_until = {}, {}, 0
        if skips and len(self.pending):
            skips = self._around_pending(skips)
        if skips and self.m.verify:
            skips = await self._around_records(skips)
        if self.pacer is not None and execs:
            execs = list(self.pacer.pace(execs))  # over-quota runs: a later due time, recorded (never dropped)
        stone_ops: list[Op] = []
        if self._stone_deletes:  # handled tombstones, unless a newer delete wrote them again
            stones, self._stone_deletes = self._stone_deletes, {}
            stone_ops = [txn([Compare.mod_revision(k, "==", rev)], [delete(k)]) for k, rev in stones.items()]
        if len({e.id for e in execs}) < len(execs):  # never two creates of one record in a txn
            execs = list({e.id: e for e in reversed(execs)}.values())[::-1]
        if execs and self.s.reserve_first_attempt and (mine := self.ownership.fence(self.p)) is not None:
            # The first dispatch goes with the create (`execution.reserve`): under a token that is not the
            # owner's any more the fence below refuses the txn, and a record read back later under a newer
            # claim is not this owner's to hand out (`may_hand_out`).
            token = mine.fencing_token
            execs = [reserve(e, token) for e in execs]
        ops: list[Op] = list(self.ledger.create_ops(execs))
        ops += list({(sid, r.after_ms, r.through_ms): self.ledger.skip_op(self.p, sid, r) for sid, r in skips}.values())
        ops += stone_ops
        lag = watermark_ms - self.ck.watermark_ms
        holds = self.m.take_hold_writes()
        write_ck = lag > 0 and (bool(ops) or bool(holds) or lag >= self.s.checkpoint_interval_ms)
        # Holds go with the other ops, which are committed before the checkpoint (in its txn when they fit,
        # in chunks before it otherwise: thousands of schedules of a pool may be held in one round), so
        # the checkpoint never passes a held time without its hold.
        # `late`: held while the pool's workers were all busy, not absent (a new owner runs the held times late
        # rather than deciding them as missed).
        ops += [put(self.ks.hold(self.p, sid), json.dumps(
                    {"from": t, "late": True} if sid in self.m.held_late else {"from": t}).encode())
                if t is not None else delete(self.ks.hold(self.p, sid)) for sid, t in holds.items()]
        if not ops and not write_ck:
            return
        async with self.ownership.writing(self.p) as fence:
            if not write_ck:
                rs = await self._fenced(fence, ops)
            else:
                compares, ck_ops, new = advance(self.ks, self.ck, watermark_ms, self.node_id, fence.token,
                                                max(sched_rev, self.ck.sched_rev))
                if len(ops) + len(ck_ops) <= self.max_ops:
                    rs = await self._fenced(fence, [*ops, *ck_ops], compares)
                else:
                    rs = await self._fenced(fence, ops) if ops else []
                    rs += await self._fenced(fence, ck_ops, compares)
                self.ck = replace(new, mod_revision=rs[-1].revision)
        results = [(ok, r.revision) for r in rs for ok in self.ledger.cas_results(r)][: len(execs)]
        created = 0
        for e, (ok, rev) in zip(execs, results, strict=False):
            if ok:
                created += 1
                self.pending.put(as_created(e, rev))  # the next CAS compares against it
                self.history.created(e.schedule_id, e.planned_ms)
        if created < len(execs):
            # Records that already existed (an earlier owner's lookahead): read them back, so track their
            # real state instead of reloading the whole partition (read after the create: at least as new).
            wanted = {e.id: e for e in execs}
            there = [e for e, (ok, _) in zip(execs, results, strict=False) if not ok]
            revive: list[tuple[Execution, Execution]] = []
            for x in await self.ledger.read(self.kv, there, timeout=self.rpc_timeout):
                known = self.pending.get(x.id)
                if known is not None and known.mod_revision > x.mod_revision:
                    continue  # our own dispatcher recorded something newer while we read
                self.pending.put(x)
                sch = self.schedules.get(x.schedule_id)
                if sch is not None:  # read back as written ahead, maybe under an earlier pool: follows it
                    self._retarget(x.schedule_id, sch.stored.schedule.worker_pool)
                if (x.state is ExecState.SKIPPED and not x.attempts and x.id in wanted
                        and (x.skip_reason in (SkipReason.SCHEDULE_CHANGED.value, SkipReason.PAUSED.value)
                             or (x.skip_reason == SkipReason.SCHEDULE_DELETED.value and sch is not None
                                 and x.planned_ms > sch.stored.activated_ms))):
                    # Withdrawn before it ever ran by a change since undone (a spec changed back, a
                    # resume, a delete followed by a create of the same id, whose own planned time it is):
                    # owed again, so it comes back, at the record's revision. (An audit: a schedule deleted
                    # and created again had its first planned times within the lookahead skipped as
                    # `schedule_deleted`, the old schedule's runs written ahead.)
                    revive.append((x, wanted[x.id]))
            if revive:
                await self._revive(revive)
        for _, span in skips:
            self.history.skipped(span.through_ms)
        self.stats.created += created
        self.stats.skipped_ranges += len(skips)

    async def _revive(self, pairs: list[tuple[Execution, Execution]]) -> None:
        """Withdrawn records owed again, CASed back to scheduled at once, in the round that found them: a pause,
        delete or change seen since is then applied to them as to any run waiting (withdrawn by the next pass).
        Applied in a later dispatch pass, a revive came after a withdrawal that had passed the record by while
        it was still skipped: a run revived for a schedule deleted meanwhile, or for a time paused meanwhile,
        was left scheduled for good (the stateful twin)."""
        await self._transition_all(pairs, "a revive")

    async def _transition_all(self, pairs: list[tuple[Execution, Execution]], what: str) -> None:
        """Commit (record, its next state) pairs, fenced, all or a reload: a lost CAS means someone else changed
        a record since it was read (an operator's rerun or cancel), and the truth is read again."""
        ok = await self._commit([self.ledger.cas_op(new, old.mod_revision, now_ms=self.clock.wall_ms(),
                                                    old_state=old.state) for old, new in pairs])
        for (_old, new), (applied, rev) in zip(pairs, ok, strict=False):
            if not applied:
                raise Restart(f"{what} compare-and-swap lost: someone else changed the record")
            self.pending.put(with_revision(new, rev))

    def _withdrawals(self, now_ms: int) -> dict[str, tuple[Execution, Execution]]:
        """Pause, delete and spec changes take effect at once, with the reason. A delete withdraws every
        run not yet started and cancels its retries; a spec change withdraws the old spec's pre-written
        runs the new one does not plan; a pause withdraws the runs planned up to now (or up to a resume
        seen meanwhile), holds its retries back (parked until the resume), and leaves those written
        ahead to the dispatch round, which skips them as paused when they come due: a resume before
        then runs them, as it is owed to."""
        out: dict[str, tuple[Execution, Execution]] = {}
        for eid, (n, reason) in list(self._armed_withdrawn.items()):
            x = self.pending.get(eid)
            if x is not None and x.attempt == n and x.state is ExecState.SCHEDULED:
                out[eid] = (x, skip(x, reason))  # back unstarted: withdrawn as it was judged when it was out
            elif x is not None and x.attempt == n and x.state in IN_FLIGHT:
                continue  # still out: disarmed, or begun (then it ran: started before the change)
            del self._armed_withdrawn[eid]
        early: set[str] = set()  # handed out early, judged below as waiting (start ahead)
        for sid, created in self._stale.items():
            for x in map(lambda r: self._waiting_view(r, early), self.pending.of_schedule(sid)):
                if x.trigger is Trigger.SCHEDULED and x.run_trigger is None and x.planned_ms <= created:
                    if x.state is ExecState.SCHEDULED:
                        out[x.id] = (x, skip(x, SkipReason.SCHEDULE_DELETED.value))
                    elif x.state is ExecState.RETRY_WAIT:
                        out[x.id] = (x, cancel(x, SkipReason.SCHEDULE_DELETED.value))
        self._stale = {}
        again: dict[str, Withdrawal] = {}
        for sid, w in self._withdraw.items():
            sch = self.schedules.get(sid)
            why = w.reason
            for x in map(lambda r: self._waiting_view(r, early), self.pending.of_schedule(sid)):
                if x.id in out:
                    continue
                if why is SkipReason.SCHEDULE_CHANGED:
                    if (sch is None or x.state is not ExecState.SCHEDULED or x.trigger is not Trigger.SCHEDULED
                            or x.planned_ms <= w.after_ms):
                        continue  # planned before the change, or an operator's run
                    if x.planned_ms > now_ms:
                        # Judged once due, as a pause's are: a change back before then (a spec changed and
                        # restored) owes it again, and the materializer does not bring it back while its
                        # pool has no worker (the stateful twin: withdrawn at 4.75 s, owed again at 4.76 s,
                        # left skipped `schedule_changed` under a hold for good). Runs written after the
                        # change (beyond `ahead_ms`) were planned by the current spec: nothing to keep for.
                        if x.planned_ms <= w.ahead_ms:
                            again[sid] = w
                        continue
                    because = (w.rule(x.planned_ms) if w.rule is not None
                               else None if sch.plan.next_after_ms(x.planned_ms - 1) == x.planned_ms else why)
                    if because is None:
                        continue  # the spec in effect at its planned time plans it too
                    out[x.id] = (x, skip(x, because.value))
                elif why is SkipReason.SCHEDULE_DELETED and w.until_ms is not None and not _of_the_deleted(x, w, sch):
                    continue  # the new schedule's own, or owed again by it (`Withdrawal.until_ms`, `before_rev`)
                elif x.state is ExecState.SCHEDULED:
                    if why is SkipReason.PAUSED and x.planned_ms > (now_ms if w.until_ms is None else w.until_ms):
                        if w.until_ms is None:
                            again[sid] = w  # still paused: withdrawn in a later round, once due
                        elif (sch is not None and x.trigger is Trigger.SCHEDULED
                              and sch.plan.next_after_ms(x.planned_ms - 1) != x.planned_ms):
                            # After the resume, a run written ahead stands only if the resumed spec plans it:
                            # the spec may have changed while paused (the stateful twin: pause, change to
                            # every 2 s, resume, all in one round; the old spec's run at 1 s ran).
                            out[x.id] = (x, skip(x, SkipReason.SCHEDULE_CHANGED.value))
                        continue
                    out[x.id] = (x, skip(x, why.value))
                elif x.state is ExecState.RETRY_WAIT:
                    if why is SkipReason.SCHEDULE_DELETED:
                        out[x.id] = (x, cancel(x, why.value))
                    elif sch is not None and sch.stored.schedule.state is ScheduleState.PAUSED:
                        self.pending.park(x)
        # Kept until every run written ahead of the pause has come due (the dispatch round does not see
        # the runs of a pool without workers).
        self._withdraw = again
        # Runs out on a worker ahead of their time are withdrawn as if they had been waiting, once they come back
        # (the owner disarmed them on the change): judged now, with the records as they were when handed out (the
        # stateful twin: a delete and a create of the same id with another spec, at the instant a run of the old
        # one waited armed; back after the withdrawal was applied, it ran under the new spec, which does not plan
        # it). One that began (its disarm came too late) ran, as any run started before the change.
        for eid in early & out.keys():
            x, gone = out.pop(eid)
            cur = self.pending.get(eid)
            if gone.state is not ExecState.SKIPPED or cur is None:
                continue
            if cur.state is ExecState.SCHEDULED:
                out[eid] = (cur, skip(cur, gone.skip_reason))  # back already: the record as it is now
            else:
                self._armed_withdrawn[eid] = (x.attempt, gone.skip_reason)
        for eid in [i for i, v in self._disarmed.items() if (c := self.pending.get(i)) is None or c.attempt != v.attempt
                    or not (c.state is ExecState.SCHEDULED or _handed_out_early(c))]:
            del self._disarmed[eid]
        return out

    def _waiting_view(self, x: Execution, early: set[str]) -> Execution:
        """x as a withdrawal judges it (start ahead): a run handed out early as the new run it was, and one disarmed
        by a change of its schedule as it was when disarmed, though it may be back by now (noted in `early`)."""
        v = self._disarmed.get(x.id)
        if v is not None and v.attempt == x.attempt and (x.state is ExecState.SCHEDULED or _handed_out_early(x)):
            early.add(x.id)
            return v
        if not _handed_out_early(x):
            return x
        early.add(x.id)
        return replace(x, state=ExecState.SCHEDULED)

    async def _confirm_in_flight(self) -> None:
        """Re-read records an overlap skip or cancel would rest on. A view from a load, or one a result
        recorded elsewhere has not reached yet, must not cost a run."""
        # Every id taken leaves the set, also one whose record has left `pending` since it was asked for
        # (its result landed during the round's commit): kept, it made every round ask for another at
        # once, and a drill found partitions spinning at 2,600 rounds a second, a core of CPU.
        taken = list(itertools.islice(self._confirm, 64))
        self._confirm.difference_update(taken)
        if len(self._confirmed) > 4 * max(64, len(self.pending)):
            self._confirmed = {k: v for k, v in self._confirmed.items() if k in self.pending}
        records = [x for eid in taken if (x := self.pending.get(eid)) is not None]
        if not records:
            return
        sent = self.clock.wall_ms()
        got = await self.kv.txn([], [get(self.ledger.key(x)) for x in records], timeout=self.rpc_timeout)
        for x, r in zip(records, got.responses, strict=True):
            kvs = getattr(r, "kvs", ())
            if not kvs:
                self.pending.remove(x.id)
                continue
            e = decode_execution(kvs[0].value, kvs[0].mod_revision)
            self._refresh(e)
            # What the snapshot holds now: the record read, or this owner's unwritten hand-out of it at the
            # same revision (in flight all the same: nothing was recorded for it elsewhere).
            held = self.pending.get(e.id)
            if held is not None and held.mod_revision == e.mod_revision and held.state in HOLDING:
                self._confirmed[e.id] = (e.mod_revision, sent)
        self.wake.set()

    async def dispatch_due(self, now_ms: int) -> None:
        reserved: dict[str, int] = {}
        try:
            # A pass takes from each pool only as many runs as its workers can start; those the overlap rule
            # puts aside (behind a run in flight, parked) leave the heap, so another pass takes the next
            # ones. With one pass, a backfill's buffered runs, due before everyone else's, took the free
            # slot round after round while the pool's other schedules waited (the stateful twin: 16 rounds).
            for n in range(DISPATCH_PASSES):
                if not await self._dispatch_due(now_ms, reserved, first=n == 0):
                    break
            self.starved = bool(self.starved_pools)
        finally:
            for pool, n in reserved.items():
                self.dispatcher.release(pool, n)

    async def _dispatch_due(self, now_ms: int, reserved: dict[str, int], *, first: bool = True) -> bool:
        """One dispatch pass; returns whether another may start more (runs were put aside, capacity is left).
        Confirmation reads and withdrawals are the first pass's work (the next round's for what it adds)."""
        if first:  # the passes of one round add up
            self.starved_pools = set()
        if self._confirm and first:
            await self._confirm_in_flight()
        withdrawn = self._withdrawals(now_ms) if first else {}
        # Per pool, only what its workers can take now: a pool without capacity keeps its due work
        # waiting in its own heap, where it stands in front of nobody else's. Bounded like
        # materialization: one round is one uninterrupted stretch of the event loop, and lease
        # keep-alives wait behind every stretch of every partition.
        limits: dict[str, int] = {}
        for pool in self.pending.pools():
            cap = self.dispatcher.capacity(pool)
            if cap > 0:
                limits[pool] = min(cap, self.s.max_planned_per_round)
            elif first and self.dispatcher.served(pool) and self.pending.has_ready(now_ms, pool):
                # Workers there, all busy: saturated, not workerless (a hold made now runs late, nothing is
                # missed). Counted only from the runs a round could take, this went unseen while every slot was
                # busy at the round's start, and a busy pool's held times were decided as missed.
                self.starved_pools.add(pool)
        if not limits and not withdrawn:
            return False
        fence = self.ownership.fence(self.p)
        if fence is None:
            return False
        due = self.pending.ready(now_ms, limits) if limits else {}
        views = {sid: ScheduleView(sch.stored.schedule.policies.overlap,
                                   sch.stored.schedule.state is ScheduleState.PAUSED, sch.stored.meta.created_ms)
                 for sid in due if (sch := self.schedules.get(sid)) is not None}
        # A run waiting for its retry is the same run, not over (docs/time.md): it holds its schedule as a
        # run in flight does.
        in_flight = {sid: [r for r in self.pending.of_schedule(sid) if r.state in HOLDING] for sid in due}
        # Start ahead: runs that came up before their due time and may be handed out now.
        armable = ({x.id for xs in due.values() for x in xs if x.due_ms > now_ms and self._may_arm(x)}
                   if self.s.start_ahead_ms else frozenset())
        plan = plan_dispatch(RoundInput(
            now_ms=now_ms, due=due, schedules=views, in_flight=in_flight, budget=limits, catchup=self._catchup,
            ahead_ms=self.s.start_ahead_ms, armable=armable,
            confirmed=self._confirmed, node_id=self.node_id, token=fence.fencing_token,
            start_timeout_ms=self.s.start_timeout_ms, overlap_settle_ms=self.s.overlap_settle_ms,
            transitions=withdrawn, behind={sid: w for sid in due if (w := self.pending.behind(sid))},
            ended={sid: gone for sid in due if (gone := self.pending.ended(sid))},
            newest_due={sid: p for sid, v in views.items() if v.overlap is Overlap.CANCEL_OTHER
                        and (p := self.pending.newest_due(sid, now_ms, withdrawn)) is not None}))
        for x in plan.defer:
            self.pending.defer(x)
        for b in plan.behind:
            self.pending.wait_behind(b.x, b.by_policy, b.until_ms, ordered=b.ordered, after_retry=b.after_retry)
        for x in plan.park:
            self.pending.park(x)
        for x in plan.not_yet:
            self.pending.not_before(x, x.due_ms)
        for r in plan.disarm:
            self.dispatcher.disarm(r)
        self._confirm |= plan.confirm
        for pool, n in plan.started.items():
            self.dispatcher.reserve(pool, n)
            reserved[pool] = reserved.get(pool, 0) + n
        self.starved_pools |= {p for p in plan.starved_pools if self.pending.has_ready(now_ms, p)}
        self.starved = bool(self.starved_pools)
        # Runs put aside, or skipped (a cancel_other backlog superseded by its newest run), took none of their
        # pool's capacity: another pass takes the next ones (the newest run waited 1.25 s behind ten superseded).
        aside = ({b.x.pool for b in plan.behind} | {x.pool for x in plan.park}
                 | {new.pool for _, new in plan.transitions.values() if new.state is ExecState.SKIPPED})
        again = any(self.dispatcher.capacity(p) > 0 and self.pending.has_ready(now_ms, p) for p in aside)
        cas = plan.transitions
        if not cas:
            return again
        # A reserved attempt handed out (`execution.hand_out`) is not written: the worker's start CAS, from the
        # record's creation and fenced by this owner's token, is its first write.
        pairs = [(old, new) for old, new in cas.values() if not _unwritten(old, new)]
        ok = await self._commit([self.ledger.cas_op(new, old.mod_revision, now_ms=now_ms, old_state=old.state)
                                  for old, new in pairs]) if pairs else []
        if len(pairs) < len(cas):
            handed = [(old, new) for old, new in cas.values() if _unwritten(old, new)]
            pairs += handed
            ok += [(True, new.mod_revision) for _, new in handed]
        lost = False
        sent: list[Execution] = []
        debug = log.isEnabledFor(logging.DEBUG)  # per-execution lines only when asked for: hot path
        for (_old, new), (applied, rev) in zip(pairs, ok, strict=False):
            if not applied:
                lost = True
                continue
            new = with_revision(new, rev)
            self.pending.put(new)
            if new.state is ExecState.DISPATCHED:
                cur = new.current
                assert cur is not None  # a dispatched record carries its attempt
                self.dispatcher.submit(new, self._payload(new), cur.token)
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
        for r, why in plan.stop:  # only once the cancel is recorded: a lost CAS stops nothing
            now_rec = self.pending.get(r.id)
            if now_rec is None or now_rec.state in (ExecState.CANCELLED, ExecState.CANCELLING):
                self.dispatcher.cancel(r, why)
        if sent and self.metrics is not None:
            self.metrics.dispatched(sent, now_ms)
        if lost:
            raise Restart("a dispatch compare-and-swap lost: someone else changed the record")
        return again

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
        # No start confirmed by start-by: ended never-started, also when its deadline or its worker's loss is
        # due as well. The record proves no handler ever ran (a worker runs one only after its start CAS), and
        # a timeout would say it ran until its deadline: with no owner at start-by (kills, claims that died),
        # a lost dispatch timed out 25 s later held its `skip` schedule's runs due meanwhile as overlapped
        # (the stateful twin: 14 runs skipped while nothing ran), and cost a retry it never used.
        unstarted = starts.unstarted_cas(self.pending, now_ms)
        if unstarted:
            gone = {old.id for old, _ in unstarted}
            late = [e for e in late if e.id not in gone]
            lost = [e for e in lost if e.id not in gone]
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
                # Made by another (a trigger, a backfill), or already counted: counting twice is safe.
                self.history.created(e.schedule_id, e.planned_ms)
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
        # (Written before a pool change this owner has already applied, a trigger and an update fixing the pool
        # at one instant, it waits in the schedule's pool: PendingIndex.put.)
        sch = self.schedules[e.schedule_id]
        if sch.stored.schedule.state is ScheduleState.PAUSED:
            # A run written as the pause landed is withdrawn too.
            self._withdraw.setdefault(e.schedule_id, Withdrawal(SkipReason.PAUSED))

    def _payload(self, e: Execution) -> bytes:
        """What the execution runs with: its own payload (a replay) or its schedule's current one."""
        if e.payload is not None:
            return e.payload
        sch = self.schedules.get(e.schedule_id)
        return sch.stored.schedule.payload if sch else b""

    def _token(self) -> FencingToken | None:
        """This owner's fencing token, for log lines about executions no attempt has carried yet."""
        fence = self.ownership.fence(self.p)
        return fence.fencing_token if fence is not None else None

    def _dead_payload(self, e: Execution) -> bytes:
        """A dead letter keeps the payload it ran with for a replay (as dispatch/results.record_result does):
        its own (a replayed run) or the schedule's."""
        return self._payload(e) if e.state is ExecState.DEAD_LETTER else b""

    def record_transition(self, e: Execution) -> None:
        """A result recorded by this node's dispatcher: keep the snapshot current."""
        self._take(e, wake=True)

    def record_started(self, e: Execution) -> None:
        """A start recorded by this node's dispatcher (no wake: nothing for the round to do, and starts come
        thousands a second)."""
        self._take(e, wake=False)

    def _take(self, e: Execution, *, wake: bool) -> None:
        if self._loading is not None:
            self._loading.append(lambda: self._take_if_newer(e, wake=wake))
            return
        self.pending.put(e)
        if wake:
            self.wake.set()

    def _take_if_newer(self, e: Execution, *, wake: bool) -> None:
        """A start or result this node recorded while the partition was being read, taken in after the load.
        The load clears the snapshot after its reads and fills it from the listing, which may have read the
        record before the write: taken in at once, the write was lost, and the owner held a run that had
        ended as still running (game day, session 30: every3-006@22 succeeded during a reload; its buffered
        successor waited 8.3 s, until the worker's heartbeats showed the run gone). Unless the listing read
        the write or something newer (its revision, or the version now held, is at least the write's)."""
        old = self.pending.get(e.id)
        if (old.mod_revision if old is not None else self._listing_rev) >= e.mod_revision:
            return
        self.pending.put(e)
        if wake:
            self.wake.set()

    async def sweep(self, now_ms: int) -> int:
        """Retention (planner/retention.py), fenced like every owner write. Returns how many were deleted."""
        recent = self.ck.watermark_ms - self.m.replan_ms
        # Runs that ended but may still be judged as overlap (PendingIndex.ended) stay known as catch-ups.
        if self._catchup:  # (a set of every pending id, built each sweep, was 5% of a planner 60 s ahead)
            ended = self.pending.ended_ids()
            self._catchup.intersection_update([eid for eid in self._catchup if eid in self.pending or eid in ended])

        def keep_after(schedule_id: str) -> int | None:
            # Never a record a new owner may plan again (materialize.REPLAN_MARGIN_MS): created anew, it runs twice.
            sch = self.schedules.get(schedule_id)
            return sch.stored.activated_ms if sch is not None and sch.stored.activated_ms >= recent else None

        doomed = await retention_deletes(self.kv, self.ks, self.p, now_ms, self.s, keep_after=keep_after,
                                         unfinished=lambda eid: eid in self.pending, timeout=self.rpc_timeout,
                                         history=self.history)
        await self._commit(doomed)
        self._rescan = True  # leftover notices (a lost watch event) are cleared with each sweep
        return len(doomed)

    # ---- the loop -----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Claim-time work: read the partition and apply every schedule's missed-run policy."""
        claimed = await self._claim(decide=True)
        runs, skips, now = claimed.runs, claimed.skips, claimed.now_ms
        if claimed.missed:
            # Before the catch-up's write: a death between the two then leaves the next claim these records
            # skipped and the catch-up to decide again (one run under `latest`), never the catch-up's run made
            # beside an inherited one still waiting, which the next claim would judge without it.
            await self._skip_missed(claimed.missed)
        # Started attempts the previous owner had out: their workers may be gone with it (start
        # confirmation covers the ones not started; the execution deadline would be minutes away).
        self.dispatcher.expect([(e.id, e.attempt) for e in self.pending.values()
                                if e.state in (ExecState.RUNNING, ExecState.CANCELLING)])
        # What the load settled of earlier activations goes in this write, with the catch-up's decisions and
        # before the checkpoint moves: the one the checkpoint's writer knew is owed from the old watermark, and
        # the next owner takes it up from the new one. Left for the first round, those planned times were lost
        # when this owner died or froze between the two writes (a game day: two runs of a schedule whose pause
        # landed during a quorum loss, before the watermark, missed silently).
        settled_runs, settled = self.m.take_settled()
        # The previous owner may have written runs ahead of its watermark (a paused schedule holds it back
        # while the others are written up to the lookahead): those planned times have their own record,
        # which stands as any run written ahead does, so the catch-up's skips go around them. Covered, a
        # run that ran also had a skip record (the stateful twin: a pause, then a planner kill).
        # A hold read at the claim stays until the first round has planned what follows the catch-up (its
        # `from` moved to where this write decides): deleted here, a death between the two writes lost those
        # planned times (the checkpoint is already past them).
        for sid, hold in list(self.m.hold_writes.items()):
            sch = self.schedules.get(sid)
            if hold is None and sch is not None:
                self.m.hold_writes[sid] = sch.owed_from
                self.m.unhold_next.add(sid)
        # (write_planned keeps one record per planned time: `_one_record_per_time`.)
        # The checkpoint keeps its writer's sched_rev: activations it did not know may still have
        # planned times between the catch-up horizon and the watermark, which the first round writes.
        await self.write_planned([*runs, *settled_runs], [*skips, *settled],
                                 max(self.ck.watermark_ms, now - self.s.late_grace_ms), self.ck.sched_rev)

    async def _skip_missed(self, pairs: list[tuple[Execution, Execution]]) -> None:
        await self._transition_all(pairs, "a missed run's skip")
        log.info("inherited runs missed", extra={
            "event": "inherited_missed", "partition": self.p, "skipped": len(pairs),
            "reasons": dict(Counter(new.skip_reason for _, new in pairs))})

    async def step(self, now: int) -> bool:
        """One round at wall time `now` (timeouts, notices, dispatch, then bounded materialization).
        Returns whether another round should follow at once (more to materialize, notices waiting)."""
        # Work that is due first (timeouts, dispatch), then materialization, bounded per round:
        # under overload the loop keeps handing out work instead of only writing it down.
        if self.reload:
            raise Restart("the schedule watch lost events (compacted): reload the partition")
        await self.time_out(now)
        await self.apply_notices()  # records others changed: taken in before deciding on dispatch
        await self.dispatch_due(now)
        self.update_blocked(now)
        rev = self.sched_rev  # taken before planning: what the planned state reflects
        execs, skips, reached = self.m.plan_round(now, now + self.s.lookahead_ms, self.s.max_planned_per_round)
        await self.write_planned(execs, skips, reached, rev)
        again = self.m.more_due(now + self.s.lookahead_ms)  # the round's limit left planned times for the next
        self.stats.rounds += 1
        self.node_stats.rounds += 1
        return again or bool(self._notices) or bool(self._confirm)

    async def run(self) -> None:
        await self.start()
        # Partitions sweep at staggered times (first sweep after 0.5-1x the interval), so that the
        # listings of all partitions a node claimed together do not land in the same instant.
        next_sweep = self.clock.monotonic() + self.s.retention_interval * (0.5 + (self.p % 16) / 32)
        while True:
            now = self.clock.wall_ms()
            if self.clock.monotonic() >= next_sweep:
                await self.sweep(now)
                next_sweep = self.clock.monotonic() + self.s.retention_interval
            again = await self.step(now)
            self.wake.clear()
            if again:  # the next round starts at once (after the others had a turn)
                self.wake.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self.s.loop_interval)


def _handed_out_early(x: Execution) -> bool:
    """Start ahead: x's current attempt was handed out before x was due and has not ended. Until its worker begins it
    at its due time (or reports it not started, after a disarm), a withdrawal judges it as a run waiting."""
    cur = x.current
    return (x.state in (ExecState.DISPATCHED, ExecState.RUNNING) and cur is not None and cur.dispatched_ms < x.due_ms
            and not cur.finished_ms)


def _unwritten(old: Execution, new: Execution) -> bool:
    """A hand-out of the reserved attempt (the round's rule, `may_hand_out`, for the token it dispatched under)."""
    cur = new.current
    return new.state is ExecState.DISPATCHED and cur is not None and may_hand_out(old, cur.token)


def _of_the_deleted(x: Execution, w: Withdrawal, sch: Tracked | None) -> bool:
    """Under a delete's withdrawal followed by a create of the same id at `w.until_ms`: whether x is a run of the
    deleted schedule, to withdraw. One of the id's own planned times at or before the create is (a schedule
    never plans a time before its creation). With `w.before_rev` (the create's revision, known when the owner
    saw it) a record written before it is too, unless it is one of the new schedule's own planned times, which
    is owed again (same id); without it (found at a claim), only the first kind is known to be."""
    own = x.trigger is Trigger.SCHEDULED and x.run_trigger is None
    if own and x.planned_ms <= (w.until_ms or 0):
        return True
    if not w.before_rev or x.mod_revision >= w.before_rev:
        return False
    return not (own and x.state is ExecState.SCHEDULED and sch is not None
                and sch.plan.next_after_ms(x.planned_ms - 1) == x.planned_ms)
