"""Which planned times a partition owes, and which of them the next round writes: the partition's
schedules with their activations and timer heaps, holds of blocked pools, and the planned times of
activations that ended before they were handled (docs/architecture.md, "The partition loop").

Pure bookkeeping: no I/O. The partition loop (planner/partition.py) feeds it what it read and saw
(schedules, checkpoint, watch events, which pools are blocked) and writes what `plan_round` and
`catch_up` return, with the hold records of `take_hold_writes`, in its fenced batches.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Generator, Iterable
from dataclasses import dataclass, replace

from scheduler.clock import Clock
from scheduler.execution import Execution, Trigger, new_execution
from scheduler.ids import execution_id
from scheduler.model import Schedule, ScheduleState
from scheduler.planner.settings import PlannerSettings
from scheduler.store.checkpoint import Checkpoint
from scheduler.store.schedules import StoredSchedule
from scheduler.timeplan import Plan, SkipReason, jitter_ms
from scheduler.timeplan.missed import PlannedBy, SkipRange, decide_missed

log = logging.getLogger(__name__)

# When an activation was not known to the checkpoint's writer, its planned times are owed from the
# activation, but never from further back than the lookahead plus this margin behind the checkpoint
# (an activation is unknown to the writer only while the writer's watch lags it: milliseconds, or seconds
# under load). The sweep keeps the records of activations that recent (planner/retention.py): one
# deleted and created again would run twice.
REPLAN_MARGIN_MS = 10_000



def planned_by(s: Schedule) -> PlannedBy:
    """What a skip range of `s` is expanded with (stored with it: docs/keyspace.md, `skips/`)."""
    p = s.policies
    return PlannedBy(s.spec, s.time_zone, p.dst_gap.value if p.dst_gap else "",
                     p.dst_overlap.value if p.dst_overlap else "")


def stamped(sid: str, s: Schedule, ranges: Iterable[SkipRange]) -> list[tuple[str, SkipRange]]:
    by = planned_by(s)
    return [(sid, replace(r, by=by)) for r in ranges]

@dataclass(slots=True)
class Tracked:
    stored: StoredSchedule
    plan: Plan
    gen: int  # re-plans bump it: timer heap entries of an older generation are stale
    owed_from: int  # planned times after this are owed by this owner (activation or watermark)
    handled: int = 0  # the last planned time handled under this activation (materialized, or skipped)


class Materializer:
    def __init__(self, partition: int, settings: PlannerSettings, clock: Clock, catchup: set[str]) -> None:
        self.p, self.s, self.clock = partition, settings, clock
        self.schedules: dict[str, Tracked] = {}
        # (next planned ms, schedule id, generation) of active schedules, and of paused ones (whose
        # planned times are recorded as skipped once due, not ahead); stale entries are skipped.
        self.heap: list[tuple[int, str, int]] = []
        self.paused_heap: list[tuple[int, str, int]] = []
        self._gen = itertools.count(1)
        # Ids of runs created by a catch-up (shared with the dispatch round, which never counts them as
        # overlap: a run late by design queues the later ones behind it).
        self.catchup = catchup
        self.replan_ms = settings.lookahead_ms + REPLAN_MARGIN_MS
        # Backpressure per pool: a pool whose due work waits longer than `backlog_ms` for a worker is
        # blocked (the partition loop says which), and its schedules are held (not materialized) from
        # their next planned time on, with a hold record in etcd; when the pool is served again they
        # catch up by their missed-run policy, or, if the pool was only saturated, run late.
        self.blocked_pools: set[str] = set()
        self.starved_pools: set[str] = set()
        self.held: dict[str, int] = {}  # schedule id -> planned times after this are not materialized
        self.held_late: set[str] = set()  # held while their pool was saturated, not workerless
        self.hold_writes: dict[str, int | None] = {}  # hold records to put (from) or delete (None)
        # `_release_held` looks at every held schedule only when something it decides on may have changed: the
        # blocked or starved pools, a hold made since, or a schedule (set by `track` and by the partition on a
        # pool change or a delete). A burst of 100,000 one-shot schedules held behind a saturated pool spent 8%
        # of a planner's CPU on rounds finding nothing to release (bench_burst, py-spy).
        self.held_dirty = True
        self._held_seen: tuple[frozenset[str], frozenset[str]] | None = None
        # Holds a claim read: kept by the claim's write (up to where its catch-up decided), deleted by the first
        # round's, which plans what follows: with the delete in the claim's write, an owner that died between the
        # two left those planned times with no record at all (the stateful twin: a `[gap]`).
        self.unhold_next: set[str] = set()
        # Planned times of an activation that ended before they were handled (a hold, or heap entries not
        # yet materialized, when the next activation came): written by the next round.
        self.settled: list[tuple[str, SkipRange]] = []
        self.settled_runs: list[Execution] = []
        # Schedules with skip ranges decided over a hold's planned times (released, or ended by a change, a pause,
        # a delete), not written yet. A hold starts at the first planned time not materialized, and that time
        # may have a record all the same (a previous owner's lookahead, an operator's trigger) that ran and left
        # this owner's pending runs since: the write splits their ranges around the records etcd holds (the
        # stateful twin: s1@20, written ahead by a killed owner, ran at the claim, and a pause 3 s later recorded
        # (19.876, 23.193] `paused` over it). Rare (blocked pools), so a keys-only read each is cheap.
        self.verify: set[str] = set()

    def clear(self) -> None:
        self.schedules.clear()
        self.heap.clear()
        self.paused_heap.clear()
        self.catchup.clear()
        self.held.clear()
        self.held_late.clear()
        self.held_dirty = True
        self.hold_writes.clear()
        self.unhold_next.clear()
        self.settled.clear()
        self.settled_runs.clear()
        self.verify.clear()

    def take_hold_writes(self) -> dict[str, int | None]:
        out, self.hold_writes = self.hold_writes, {}
        return out

    def owed_from_checkpoint(self, st: StoredSchedule, ck: Checkpoint) -> int:
        """Where a schedule's owed planned times start for an owner resuming from the checkpoint."""
        w, a = ck.watermark_ms, st.activated_ms
        if st.activation_rev <= ck.sched_rev or not ck.sched_rev:
            # The writer knew this activation: it handled every planned time up to w. (A checkpoint
            # without sched_rev, from an older version, is taken as knowing all, as that version did.)
            return max(w, a)
        if a < w - self.replan_ms:
            log.warning("activation far behind the checkpoint and unknown to its writer: owed from the margin",
                        extra={"event": "replan_clamped", "partition": self.p, "schedule_id": st.schedule.id})
        return max(a, w - self.replan_ms)

    def track(self, st: StoredSchedule, owed_from: int) -> None:
        """Track `st` and plan it afresh: its planned times after `owed_from` (older heap entries go stale)."""
        try:
            plan = st.schedule.plan()
        except Exception:  # stored specs were validated; a newer engine refusing one must not stop the loop
            log.exception("cannot plan schedule", extra={"schedule_id": st.schedule.id, "partition": self.p})
            self.schedules.pop(st.schedule.id, None)
            return
        self.held_dirty = True
        old = self.schedules.get(st.schedule.id)
        if old is not None and st.schedule.id in self.held:  # a new activation ends the hold
            paused = st.schedule.state is ScheduleState.PAUSED
            self.settle_hold(old, max(owed_from, old.owed_from),
                             SkipReason.PAUSED if paused else SkipReason.SCHEDULE_CHANGED)
        sch = Tracked(st, plan, next(self._gen), owed_from)
        self.schedules[st.schedule.id] = sch
        self.push_next(sch, owed_from)

    def push_next(self, sch: Tracked, after_ms: int) -> None:
        nxt = sch.plan.next_after_ms(after_ms)
        if nxt is not None:
            heap = self.paused_heap if sch.stored.schedule.state is ScheduleState.PAUSED else self.heap
            heapq.heappush(heap, (nxt, sch.stored.schedule.id, sch.gen))

    def new_execution(self, sch: Tracked, planned_ms: int, due_ms: int) -> Execution:
        s = sch.stored.schedule
        return new_execution(
            id=execution_id(s.id, planned_ms), schedule_id=s.id, tenant=s.tenant, pool=s.worker_pool,
            task_type=s.task_type, planned_ms=planned_ms, due_ms=due_ms, trigger=Trigger.SCHEDULED,
            retry=s.policies.retry, timeout_ms=s.policies.execution_timeout_ms,
        )

    def catch_up(self, now_ms: int) -> tuple[list[Execution], list[tuple[str, SkipRange]]]:
        """Missed-run decisions for every schedule owed planned times older than the grace."""
        steps = self.catch_up_steps(now_ms)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                result: tuple[list[Execution], list[tuple[str, SkipRange]]] = done.value
                return result

    def catch_up_steps(self, now_ms: int) -> Generator[None, None, tuple[list[Execution], list[tuple[str, SkipRange]]]]:
        """`catch_up` one schedule per step, so that a caller with thousands can give the event loop turns
        between steps (PartitionPlanner.start). The caller must not change the tracked schedules between
        steps (the planner holds watch events until the decision is complete)."""
        runs: list[Execution] = []
        skips: list[tuple[str, SkipRange]] = []
        horizon = now_ms - self.s.late_grace_ms
        for sid, sch in self.schedules.items():
            yield
            s = sch.stored.schedule
            owed_from = sch.owed_from
            if horizon <= owed_from:
                continue
            if s.state is ScheduleState.PAUSED:
                if sch.plan.any_between_ms(owed_from, horizon):
                    skips.append((sid, SkipRange(SkipReason.PAUSED, owed_from, horizon, planned_by(s))))
                continue
            p = s.policies
            d = decide_missed(sch.plan, owed_from, horizon, p.missed_runs, p.catchup_window_ms, p.catchup_cap)
            for t in d.run:
                e = self.new_execution(sch, t, now_ms)
                runs.append(e)
                self.catchup.add(e.id)
            skips += stamped(sid, s, d.skipped)
        # The timer heaps restart after the catch-up horizon for everyone.
        self.heap, self.paused_heap = [], []
        for sch in self.schedules.values():
            yield
            sch.owed_from = max(sch.owed_from, horizon)
            self.push_next(sch, sch.owed_from)
        return runs, skips

    def more_due(self, horizon_ms: int) -> bool:
        """Whether planned times at or before the horizon are left for the next round (the last round hit
        its limit). Not whether its watermark reached the horizon: a paused schedule holds the watermark
        before its next planned time until that time is due, and a loop that took that for more work ran
        its next round at once, thousands a second while anything was paused (a drill found it)."""
        return bool(self.heap) and self.heap[0][0] <= horizon_ms

    def take_settled(self) -> tuple[list[Execution], list[tuple[str, SkipRange]]]:
        """The runs and skips of ended activations (`settle`, `rewrite`, `settle_deleted`, `settle_hold`) not
        written yet, taken out for the next write. A run of an ended activation waits for the pool its schedule
        has now."""
        runs: list[Execution] = []
        for e in self.settled_runs:
            cur = self.schedules.get(e.schedule_id)
            pool = cur.stored.schedule.worker_pool if cur is not None else e.pool
            runs.append(e if e.pool == pool else replace(e, pool=pool))
        skips, self.settled, self.settled_runs = self.settled, [], []
        return runs, skips

    def plan_round(
        self, now_ms: int, horizon_ms: int, limit: int | None = None
    ) -> tuple[list[Execution], list[tuple[str, SkipRange]], int]:
        """Planned times up to the horizon: executions for active schedules; for paused ones, skips of
        the planned times that are due (a paused schedule's later ones wait in its heap: a resume
        before then runs them, and the watermark stays before them).

        At most `limit` of them per round, so that an overloaded planner keeps dispatching between
        rounds instead of spending itself on materialization (backpressure). Returns the watermark
        the round reached: the horizon, or just before the first planned time it left for a later
        round (every planned time at or before the watermark was handled)."""
        execs: list[Execution] = []
        skips: list[tuple[str, SkipRange]] = []
        for sid in self.unhold_next:
            if sid not in self.held:  # held again since (its pool still blocked): that hold is written instead
                self.hold_writes.setdefault(sid, None)
        self.unhold_next.clear()
        if self.held:
            self._release_held(now_ms, execs, skips)
        settled_runs, settled = self.take_settled()
        execs += settled_runs
        skips += settled
        reached = horizon_ms
        paused = self.paused_heap
        while paused and paused[0][0] <= min(now_ms, horizon_ms):
            t, sid, gen = heapq.heappop(paused)
            sch = self.schedules.get(sid)
            if sch is None or sch.gen != gen:
                continue  # deleted or re-planned since
            skips.append((sid, SkipRange(SkipReason.PAUSED, t - 1, t, planned_by(sch.stored.schedule))))
            sch.handled = t
            self.push_next(sch, t)
        while paused:  # drop stale tops, so they do not hold the watermark back
            sch = self.schedules.get(paused[0][1])
            if sch is not None and sch.gen == paused[0][2]:
                reached = min(reached, paused[0][0] - 1)
                break
            heapq.heappop(paused)
        heap = self.heap
        while heap and heap[0][0] <= horizon_ms:
            if limit is not None and len(execs) + len(skips) >= limit:
                return execs, skips, min(reached, heap[0][0] - 1)
            t, sid, gen = heapq.heappop(heap)
            sch = self.schedules.get(sid)
            if sch is None or sch.gen != gen:
                continue  # deleted or re-planned since
            s = sch.stored.schedule
            if s.worker_pool in self.blocked_pools:
                self.held[sid] = self.hold_writes[sid] = t - 1  # no next entry until released
                # Looked at by the next round's `_release_held` even if the pools are then as at its last look
                # (a pool blocked for one round only: the holds of that round were never released, 1,077 runs
                # of a 100,000 burst started only at the planners' shutdown).
                self.held_dirty = True
                if s.worker_pool in self.starved_pools:
                    self.held_late.add(sid)
                continue
            due = t + jitter_ms(s.id, t, s.policies.jitter_ms)
            execs.append(self.new_execution(sch, t, due))
            sch.handled = t
            self.push_next(sch, t)
        return execs, skips, reached

    def _release_held(self, now_ms: int, execs: list[Execution], skips: list[tuple[str, SkipRange]]) -> None:
        """Held schedules whose pool is served again: their planned times since the hold go through the
        missed-run policy (they are as missed as after an outage), then they are planned as usual."""
        seen = (frozenset(self.blocked_pools), frozenset(self.starved_pools))
        if not self.held_dirty and seen == self._held_seen:
            return
        self.held_dirty, self._held_seen = False, seen
        for sid, after in list(self.held.items()):
            sch = self.schedules.get(sid)
            if sch is not None and sch.stored.schedule.worker_pool in self.blocked_pools:
                if sch.stored.schedule.worker_pool in self.starved_pools and sid not in self.held_late:
                    # Held while its pool had no worker; its pool has workers now, all busy (the schedule moved to
                    # a busy pool, or the workers came back busy): the times held until now are missed as at a
                    # release, and from here it waits as a saturated pool's, late, not missed (the stateful twin:
                    # s1 moved from a workerless pool to a saturated one at 6.8 s, and its run of 7 s was recorded
                    # policy_skip when the pool freed up at 12.5 s).
                    self.held[sid] = self.hold_writes[sid] = self._decide_held(sch, after, now_ms, execs, skips)
                    self.held_late.add(sid)
                continue
            del self.held[sid]
            self.hold_writes[sid] = None
            if sch is None:
                continue
            if sid in self.held_late:
                # Held while its pool was saturated (workers there, all busy): its planned times run late,
                # in order, as they would have without backpressure; nothing was missed.
                self.held_late.discard(sid)
                self.push_next(sch, after)
                continue
            sch.owed_from = self._decide_held(sch, after, now_ms, execs, skips)
            self.push_next(sch, sch.owed_from)

    def _decide_held(self, sch: Tracked, after: int, now_ms: int, execs: list[Execution],
                     skips: list[tuple[str, SkipRange]]) -> int:
        """A hold's planned times older than the late grace, decided by the missed-run policy; returns where
        the schedule's times are owed from after that."""
        horizon = now_ms - self.s.late_grace_ms
        if after < horizon:
            p = sch.stored.schedule.policies
            d = decide_missed(sch.plan, after, horizon, p.missed_runs, p.catchup_window_ms, p.catchup_cap)
            for t in d.run:
                e = self.new_execution(sch, t, now_ms)
                execs.append(e)
                self.catchup.add(e.id)
            sid = sch.stored.schedule.id
            skips += stamped(sid, sch.stored.schedule, d.skipped)
            if d.skipped:
                self.verify.add(sid)
        return max(after, horizon)

    def settle(self, sch: Tracked, after_ms: int, until_ms: int) -> None:
        """Planned times in (after, until] of an activation that ended before this owner handled them:
        a paused one's are recorded as paused, an active one's are owed as runs (late ones by the
        missed-run policy, like any catch-up)."""
        if after_ms >= until_ms or not sch.plan.any_between_ms(after_ms, until_ms):
            return
        s = sch.stored.schedule
        sid = s.id
        if s.state is ScheduleState.PAUSED:
            self.settled.append((sid, SkipRange(SkipReason.PAUSED, after_ms, until_ms, planned_by(s))))
            return
        now = self.clock.wall_ms()
        horizon = now - self.s.late_grace_ms
        if after_ms < horizon:
            p = s.policies
            end = min(until_ms, horizon)
            # The window counts back from now (docs/time.md), not from the activation's end: an
            # activation that ended longer ago than the window has all its times outside it.
            window = p.catchup_window_ms - (horizon - end)
            if window < 0:
                self.settled.append((sid, SkipRange(SkipReason.OUTSIDE_CATCHUP_WINDOW, after_ms, end, planned_by(s))))
                after_ms, window = horizon, 0
            d = decide_missed(sch.plan, after_ms, end, p.missed_runs, window, p.catchup_cap)
            for t in d.run:
                e = self.new_execution(sch, t, now)
                self.settled_runs.append(e)
                self.catchup.add(e.id)
            self.settled += stamped(sid, s, d.skipped)
            after_ms = horizon
        for t in itertools.islice(sch.plan.between_ms(after_ms, until_ms), 1_000):
            self.settled_runs.append(self.new_execution(sch, t, t + jitter_ms(sid, t, s.policies.jitter_ms)))

    def rewrite(self, sch: Tracked, after_ms: int, until_ms: int) -> None:
        """Planned times in (after, until] of an activation nobody saw, where the checkpoint's writer may
        have written runs ahead under the activation it knew: each is created if absent (a run written
        ahead at the same time stands: same id), whatever its lateness, as the current activation's are."""
        if after_ms >= until_ms or sch.stored.schedule.state is ScheduleState.PAUSED:
            return
        sid, jitter = sch.stored.schedule.id, sch.stored.schedule.policies.jitter_ms
        for t in itertools.islice(sch.plan.between_ms(after_ms, until_ms), 1_000):
            self.settled_runs.append(self.new_execution(sch, t, t + jitter_ms(sid, t, jitter)))

    def settle_deleted(self, sch: Tracked, deleted_ms: int) -> None:
        """A deleted schedule's planned times up to the delete not handled yet: skipped (the delete ends them)."""
        after = max(sch.owed_from, sch.handled)
        if deleted_ms > after and sch.plan.any_between_ms(after, deleted_ms):
            paused = sch.stored.schedule.state is ScheduleState.PAUSED
            why = SkipReason.PAUSED if paused else SkipReason.SCHEDULE_DELETED
            self.settled.append((sch.stored.schedule.id, SkipRange(why, after, deleted_ms,
                                                                   planned_by(sch.stored.schedule))))

    def settle_hold(self, sch: Tracked, until_ms: int, ended_by: SkipReason) -> None:
        """A held schedule changed (new activation) or was deleted before its pool was served again: its held
        planned times up to the change are decided now. After a spec change they are those of an ended
        activation (`settle`: missed by its policy beyond the late grace, late runs within it; the runs follow
        the schedule's pool, which the change may have fixed), or, held only because its pool was saturated,
        late runs all; a pause or a delete ends them (recorded as paused or schedule_deleted)."""
        sid = sch.stored.schedule.id
        after = self.held.pop(sid)
        late = sid in self.held_late
        self.held_late.discard(sid)
        self.hold_writes[sid] = None
        if after >= until_ms:
            return
        n = len(self.settled)
        self._settle_hold(sch, after, until_ms, ended_by, late)
        if len(self.settled) > n:
            self.verify.add(sid)

    def _settle_hold(self, sch: Tracked, after: int, until_ms: int, ended_by: SkipReason, late: bool) -> None:
        sid = sch.stored.schedule.id
        # After a spec change they are those of an ended activation (`settle`: missed beyond the late grace, as
        # when a hold is released, late runs within it). A pause or a delete ends them all, one range, as a
        # claim records a held schedule's tombstone (`PartitionPlanner._bury`): they were not run because of it.
        # (The stateful twin: a pause 1.8 s after a hold began recorded the held times `policy_skip`; a delete
        # recorded them `policy_skip` and `schedule_deleted` both.)
        if ended_by is SkipReason.SCHEDULE_CHANGED:
            if late:
                # Held only because every worker of its pool was busy: owed and not missed, they run late, as
                # `_release_held` runs them (a spec change withdraws no time already due). The stateful twin: a
                # saturated pool's hold ended by a change while nobody owned the partition, and the claim recorded
                # s3@23 `outside_catchup_window`.
                self.rewrite(sch, after, until_ms)
            else:
                self.settle(sch, after, until_ms)
            return
        if sch.plan.any_between_ms(after, until_ms):  # (after < until_ms: returned above otherwise)
            self.settled.append((sid, SkipRange(ended_by, after, until_ms, planned_by(sch.stored.schedule))))

