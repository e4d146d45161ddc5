"""The partition planner's view of its unfinished executions, indexed so that each round touches only
what is due: a heap of ready times per worker pool (due for scheduled, next attempt for retry-wait), a
heap of deadlines for in-flight attempts, and the executions of each schedule (for overlap decisions).

Ready heaps are per pool so that a pool without capacity (no worker, or one slow worker) never stands
in front of another pool's due work: a round takes from each pool only what that pool can start.
Executions that wait for something other than time (a retry of a paused schedule: until the resume; a
run buffered behind a run of its own schedule in flight: until none is) are parked outside the heaps,
so that no round picks them up and puts them back for ever, in front of the rest of their pool.

Runs that left flight are kept (their final records) only while a run of their schedule waits that
they may have overlapped (`ended`): a waiting run decided after the run before it landed can still be
skipped on that run's recorded history (dispatch_round.overlapped_by_ended). Nothing else is kept per
schedule once its runs are finished.

Heaps hold (time, seq, id) and are cleaned lazily: an entry is acted on only if the execution is still
in the state and at the time that put it there.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace

from scheduler.execution import IN_FLIGHT, ExecState, Execution, Trigger
from scheduler.planner.dispatch_round import attempt_spans, first_start_ms, supersedes

_WAITING = (ExecState.SCHEDULED, ExecState.RETRY_WAIT)  # waiting for a worker of their pool


def _ready_ms(e: Execution, ahead_ms: int = 0) -> int | None:
    if e.state is ExecState.SCHEDULED:
        if ahead_ms and armable_kind(e):
            return e.due_ms - ahead_ms
        return e.due_ms
    if e.state is ExecState.RETRY_WAIT:
        return e.next_attempt_ms
    return None


def armable_kind(e: Execution) -> bool:
    """A new run of one of its schedule's own planned times, the only kind handed out ahead of its time (start
    ahead): not a retry (its backoff is the time it waits), nor an operator's trigger, backfill, rerun or
    replay (each due when it was asked for)."""
    return e.trigger is Trigger.SCHEDULED and e.overlap is None and e.run_trigger is None


class PendingIndex:
    def __init__(self, overlap_settle_ms: int = 0, pool_of: Callable[[str], str | None] | None = None,
                 ahead_ms: int = 0) -> None:
        self.overlap_settle_ms = overlap_settle_ms  # as the dispatch round judges a run waiting for its retry
        # Start ahead: new runs of a schedule's own planned times come up this long before they are due; the
        # round hands out those it may arm, and sends the others back until they are due (`not_before`).
        self.ahead_ms = ahead_ms
        # Schedule id -> its pool now (None: not known). A run waiting for a worker (new, or for its retry)
        # waits in its schedule's pool, whatever pool its record was written in: a record that comes back
        # to wait after a pool change (an attempt dispatched before it failed) would otherwise wait for
        # the old pool (the stateful twin: a retry waited for pool a, which had no capacity, for good).
        self._pool_of = pool_of
        self._by_id: dict[str, Execution] = {}
        self._by_schedule: dict[str, dict[str, Execution]] = {}
        self._ready: dict[str, list[tuple[int, int, str]]] = {}  # pool -> heap
        self._parked: dict[str, dict[str, Execution]] = {}  # schedule id -> executions waiting for a resume
        # schedule id -> {id: buffered by the policy} of runs waiting until no run of it is in flight
        self._behind: dict[str, dict[str, bool]] = {}
        # id -> instant a run waiting behind is decided again regardless (its heap entry has this time)
        self._wake: dict[str, int] = {}
        self._ordered: set[str] = set()  # ids waiting in order behind the runs before them (DispatchPlan)
        self._after_retry: set[str] = set()  # ... of which behind an earlier run waiting for its retry
        # Start ahead: schedule id -> ids of its runs that came up early and could not be armed (`not_before`):
        # offered again as soon as a run of the schedule is done (what kept them from it may be gone). Not on
        # every change of state: a run dispatched, then started, keeps them back all the same, and offering
        # them at each cost 10-13% more planner CPU per execution near saturation (bench/README.md).
        self._not_yet: dict[str, set[str]] = {}
        # schedule id -> {(id, attempt): final record} of runs that left flight, while a scheduled run of
        # the schedule waits that came due between their start and their recorded end (see `ended`)
        self._ended: dict[str, dict[tuple[str, int], Execution]] = {}
        self._deadlines: list[tuple[int, int, str]] = []
        self._start_bys: list[tuple[int, int, str]] = []  # dispatched attempts waiting for their start
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, execution_id: str) -> bool:
        return execution_id in self._by_id

    def get(self, execution_id: str) -> Execution | None:
        return self._by_id.get(execution_id)

    def values(self) -> Iterator[Execution]:
        return iter(list(self._by_id.values()))

    def schedule_ids(self) -> list[str]:
        """The schedules with unfinished runs here."""
        return [sid for sid, xs in self._by_schedule.items() if xs]

    def of_schedule(self, schedule_id: str) -> list[Execution]:
        return sorted(self._by_schedule.get(schedule_id, {}).values(), key=lambda e: e.planned_ms)

    def running(self, schedule_id: str) -> tuple[str, ...]:
        return tuple(e.id for e in self.of_schedule(schedule_id) if e.state in IN_FLIGHT)

    def put(self, e: Execution) -> None:
        old = self._by_id.get(e.id)
        if (old is not None and old.mod_revision == e.mod_revision and old.state is ExecState.DISPATCHED
                and e.state is ExecState.SCHEDULED):
            # A read of a record this owner handed out unwritten (`execution.hand_out`): the same revision,
            # older news. Taken in, it would be dispatched again (written, retiring the number handed out).
            return
        if e.terminal:
            self.remove(e.id)
        else:
            self._put(e)
        if old is not None and old.state in IN_FLIGHT and e.state not in IN_FLIGHT:
            self._keep_ended(e)

    def _put(self, e: Execution) -> None:
        if self._pool_of is not None and e.state in _WAITING and (pool := self._pool_of(e.schedule_id)) \
                and pool != e.pool:
            e = replace(e, pool=pool)
        self._by_id[e.id] = e
        self._by_schedule.setdefault(e.schedule_id, {})[e.id] = e
        if e.state not in _WAITING:
            self._wake.pop(e.id, None)  # under way: a wake-up set while it waited stands for nothing now
        ready = _ready_ms(e, self.ahead_ms)
        if ready is not None:
            heapq.heappush(self._ready.setdefault(e.pool, []), (ready, next(self._seq), e.id))
        cur = e.current
        if e.state in IN_FLIGHT and cur is not None:
            heapq.heappush(self._deadlines, (cur.deadline_ms, next(self._seq), e.id))
            if e.state is ExecState.DISPATCHED and cur.start_by_ms:
                heapq.heappush(self._start_bys, (cur.start_by_ms, next(self._seq), e.id))
        elif e.schedule_id in self._behind:
            self._release_behind(e.schedule_id)
        if e.schedule_id in self._ended:
            self._prune_ended(e.schedule_id)

    def remove(self, execution_id: str) -> None:
        e = self._by_id.pop(execution_id, None)
        if e is not None:
            sched = self._by_schedule.get(e.schedule_id)
            if sched is not None:
                sched.pop(execution_id, None)
                if not sched:
                    del self._by_schedule[e.schedule_id]
            parked = self._parked.get(e.schedule_id)
            if parked is not None:
                parked.pop(execution_id, None)
            self._wake.pop(execution_id, None)
            self._ordered.discard(execution_id)
            self._after_retry.discard(execution_id)
            behind = self._behind.get(e.schedule_id)
            if behind is not None:
                behind.pop(execution_id, None)
                self._release_behind(e.schedule_id)
            if e.schedule_id in self._ended:
                self._prune_ended(e.schedule_id)
            if e.schedule_id in self._not_yet:
                self._offer_again(e.schedule_id)

    def clear(self) -> None:
        self._by_id.clear()
        self._by_schedule.clear()
        self._ready.clear()
        self._parked.clear()
        self._behind.clear()
        self._wake.clear()
        self._ordered.clear()
        self._after_retry.clear()
        self._ended.clear()
        self._not_yet.clear()
        self._deadlines.clear()
        self._start_bys.clear()

    def pools(self) -> list[str]:
        """Pools that have (possibly stale) ready entries."""
        return [p for p, h in self._ready.items() if h]

    def ready(self, now_ms: int, limits: dict[str, int]) -> dict[str, list[Execution]]:
        """Executions whose time has come, at most `limits[pool]` of each pool (earliest first; pools
        not named: none), by schedule, oldest planned time first. Callers that do not act on one
        (buffered, no worker capacity) hand it back with `defer()`; asking only for what can be
        dispatched keeps a backlog from being re-sorted every round."""
        out: dict[str, list[Execution]] = {}
        seen: set[str] = set()
        for pool, limit in limits.items():
            heap = self._ready.get(pool)
            taken = 0
            while heap and heap[0][0] <= now_ms and taken < limit:
                t, _, eid = heapq.heappop(heap)
                e = self._by_id.get(eid)
                if e is None or eid in seen or not self._live(e, pool, t):
                    continue  # finished, or moved on (another time, another pool) since this entry was pushed
                if self._wake.pop(eid, None) is not None:  # its wake-up came before the run it waited for landed
                    self._ordered.discard(eid)
                    self._after_retry.discard(eid)
                    behind = self._behind.get(e.schedule_id)
                    if behind is not None:
                        behind.pop(eid, None)
                        if not behind:
                            del self._behind[e.schedule_id]
                elif eid in self._behind.get(e.schedule_id, ()) or eid in self._parked.get(e.schedule_id, ()):
                    # Parked (behind a run in flight, or until a resume): an entry pushed before it was (each put
                    # of its record pushes one), not its turn. Taken, it counted against the pool's share and was
                    # only parked again: the stateful twin had a backfill's buffered runs take all eight passes
                    # of a round this way, round after round, while a one-slot pool's on-time run waited.
                    continue
                seen.add(eid)
                taken += 1
                out.setdefault(e.schedule_id, []).append(e)
        for es in out.values():
            es.sort(key=lambda e: e.planned_ms)
        return out

    def _live(self, e: Execution, pool: str, t: int) -> bool:
        """Whether a heap entry (t, pool) still stands for `e`: its ready time, or its wake-up while it
        waits behind a run in flight."""
        return e.pool == pool and (_ready_ms(e, self.ahead_ms) == t
                                   or (self._wake.get(e.id) == t and e.state in _WAITING))

    def has_ready(self, now_ms: int, pool: str | None = None) -> bool:
        """Whether something may be ready (the earliest entry may be stale: a cheap over-estimate)."""
        heaps = self._ready.values() if pool is None else [self._ready.get(pool, [])]
        return any(h and h[0][0] <= now_ms for h in heaps)

    def oldest_ready(self, pool: str | None = None) -> int | None:
        """The earliest ready time (due or next attempt) of a waiting execution (of one pool, or of
        any), or None. Drops stale heap entries from the tops, as `ready()` would."""
        best: int | None = None
        for p, heap in self._ready.items():
            if pool is not None and p != pool:
                continue
            while heap:
                t, _, eid = heap[0]
                e = self._by_id.get(eid)
                if e is not None and self._live(e, p, t):
                    best = t if best is None else min(best, t)
                    break
                heapq.heappop(heap)
        return best

    def defer(self, e: Execution) -> None:
        ready = _ready_ms(e, self.ahead_ms)
        if ready is not None and e.id in self._by_id:
            heapq.heappush(self._ready.setdefault(e.pool, []), (ready, next(self._seq), e.id))

    def not_before(self, e: Execution, at_ms: int) -> None:
        """Start ahead: a run that came up early and may not be armed comes up again at `at_ms` (its due time),
        not before; any put of its record may bring it up early once more (it is judged again then)."""
        if e.id in self._by_id:
            self._wake[e.id] = at_ms
            heapq.heappush(self._ready.setdefault(e.pool, []), (at_ms, next(self._seq), e.id))
            self._not_yet.setdefault(e.schedule_id, set()).add(e.id)

    def _offer_again(self, schedule_id: str) -> None:
        """Runs of the schedule sent back until their due time come up again now (at their early ready time): a
        run of it is done, and what kept them from being armed (a run in flight, an earlier one waiting) may be
        gone. Those still not armable are sent back again, once per such change."""
        for eid in self._not_yet.pop(schedule_id, ()):
            e = self._by_id.get(eid)
            ready = None if e is None else _ready_ms(e, self.ahead_ms)
            if e is not None and ready is not None:
                heapq.heappush(self._ready.setdefault(e.pool, []), (ready, next(self._seq), eid))

    def may_arm(self, x: Execution) -> bool:
        """Whether x may be handed out ahead of its time (start ahead): every other unfinished run of its
        schedule here is a new run planned after it (written ahead), and x is neither waiting behind a run nor
        parked. A run in flight, waiting for its retry, or due before x (deferred for capacity, parked) could
        overlap it, or should go first: x then waits for its due time and the ordinary rules."""
        sid = x.schedule_id
        if x.id in self._behind.get(sid, ()) or x.id in self._parked.get(sid, ()):
            return False
        return all(r.id == x.id or (r.state is ExecState.SCHEDULED and r.planned_ms > x.planned_ms)
                   for r in self._by_schedule.get(sid, {}).values())

    def park(self, e: Execution) -> None:
        """Hold `e` out of the ready heaps until `unpark()` (its schedule is paused)."""
        if e.id in self._by_id:
            self._parked.setdefault(e.schedule_id, {})[e.id] = e

    def wait_behind(self, e: Execution, by_policy: bool, until_ms: int | None = None, *, ordered: bool = True,
                    after_retry: bool = False) -> None:
        """Hold `e` out of the ready heaps until no run of its schedule is in flight, or until `until_ms`
        if given, whichever comes first (`DispatchPlan.behind`); `after_retry`: nor an earlier one waits for
        its retry."""
        if e.id not in self._by_id:
            return
        self._behind.setdefault(e.schedule_id, {})[e.id] = by_policy
        if ordered:
            self._ordered.add(e.id)
        else:
            self._ordered.discard(e.id)
        if after_retry:
            self._after_retry.add(e.id)
        else:
            self._after_retry.discard(e.id)
        if until_ms is not None:
            self._wake[e.id] = until_ms
            heapq.heappush(self._ready.setdefault(e.pool, []), (until_ms, next(self._seq), e.id))
        self._release_behind(e.schedule_id)  # nothing in flight any more: straight back

    def recall_ended(self, r: Execution) -> None:
        """A final record read at a claim (`Ledger.list_for_claim`): kept, as a run that left flight under
        this owner is, while a waiting run of its schedule may have come due while it ran. A takeover must
        not change what the overlap rule decides."""
        if r.terminal and r.id not in self._by_id:
            self._keep_ended(r)

    def ended(self, schedule_id: str) -> list[Execution]:
        """Final records of the schedule's runs that left flight while one of its scheduled runs waits that
        came due after they started and before their result was recorded: what the dispatch round needs
        to tell whether they overlapped it (`RoundInput.ended`). Dropped as soon as no such run waits."""
        return list(self._ended.get(schedule_id, {}).values())

    def ended_ids(self) -> set[str]:
        return {eid for runs in self._ended.values() for eid, _ in runs}

    @staticmethod
    def _overlaps(r: Execution, x: Execution) -> bool:
        """Whether waiting run `x` may have come due while `r`'s last attempt was out, or while `r`, due
        before it, still waited to start (dispatch_round.late_overlap): an over-estimate of the round's
        rules (which judge at x's due time, or a catch-up's planned time, end no later than the recorded
        end, and count a late run only for as long as it ran)."""
        cur = r.current
        if cur is None or x.id == r.id or x.state is not ExecState.SCHEDULED:
            return False
        if (cur.started_ms or cur.dispatched_ms) <= x.due_ms and x.planned_ms < cur.finished_ms:
            return True
        return r.planned_ms < x.planned_ms and r.due_ms <= x.due_ms < first_start_ms(r)

    def _keep_ended(self, r: Execution) -> None:
        cur = r.current
        if cur is None or not cur.finished_ms or cur.never_started:
            return  # no attempt ran: it overlapped nothing
        if any(self._overlaps(r, x) for x in self._by_schedule.get(r.schedule_id, {}).values()):
            self._ended.setdefault(r.schedule_id, {})[(r.id, cur.attempt)] = r

    def _prune_ended(self, schedule_id: str) -> None:
        runs = self._ended[schedule_id]
        waiting = [x for x in self._by_schedule.get(schedule_id, {}).values() if x.state is ExecState.SCHEDULED]
        for key in [k for k, r in runs.items() if not any(self._overlaps(r, x) for x in waiting)]:
            del runs[key]
        if not runs:
            del self._ended[schedule_id]

    def behind(self, schedule_id: str) -> dict[str, bool]:
        """The runs of a schedule waiting behind one in flight: {id: buffered by the policy}."""
        return self._behind.get(schedule_id, {})

    def newest_due(self, schedule_id: str, now_ms: int, leaving: Mapping[str, object]) -> int | None:
        """The newest planned time of the schedule's own runs (new, or waiting for a retry) planned by now_ms
        and not `leaving` (withdrawn this round), wherever they wait: handed to this round, parked behind a run
        in flight, deferred for capacity. Under cancel_other the newest wins over all of them
        (RoundInput.newest_due)."""
        return max((x.planned_ms for x in self._by_schedule.get(schedule_id, {}).values()
                    if (x.state is ExecState.RETRY_WAIT or x.due_ms <= now_ms) and x.id not in leaving
                    and supersedes(x)), default=None)

    def _release_behind(self, schedule_id: str) -> None:
        """Nothing of the schedule in flight: the runs waiting to be decided again (a skip's settle, a
        cancelled run's stop) go back to the heap, and of those waiting in order only the earliest. The
        others would wait behind it again (it starts, or is skipped, and then the next comes back), and
        putting a long backlog back at once would have it taken and parked again, a few per round, in
        front of the pool's other work and of the schedule's own retries."""
        runs = self._by_schedule.get(schedule_id, {}).values()
        if any(x.state in IN_FLIGHT for x in runs):
            return
        behind = self._behind.get(schedule_id)
        if not behind:
            return
        # A run waiting for its retry holds the runs that came due while one of its attempts was out (a run on
        # its retry is the same run): they would only be parked again, round after round, until it is back.
        # Not a retry parked here itself (behind a run that has ended now): it comes back first, in order.
        retrying = [r for r in runs if r.state is ExecState.RETRY_WAIT and r.id not in behind]
        if retrying and any(attempt_spans(r, b.due_ms, self.overlap_settle_ms) for r in retrying
                            for b in (self._by_id.get(i) for i in behind) if b is not None):
            return
        ordered = [i for i in behind if i in self._ordered and i in self._by_id]
        first = min(ordered, key=lambda i: self._by_id[i].planned_ms) if ordered else None
        if first is not None and first in self._after_retry and any(
                r.planned_ms < self._by_id[first].planned_ms for r in retrying):
            first = None  # in order behind an earlier run's retry: it comes back once that has ended
        for eid in [i for i in behind if i not in self._ordered or i == first or i not in self._by_id]:
            del behind[eid]
            self._back_from_behind(eid)
        if not behind:
            del self._behind[schedule_id]

    def _back_from_behind(self, eid: str) -> None:
        """A run no longer waiting behind another goes back to the ready heap."""
        self._wake.pop(eid, None)
        self._ordered.discard(eid)
        self._after_retry.discard(eid)
        cur = self._by_id.get(eid)
        if cur is not None:
            self.defer(cur)

    def release_all_behind(self, schedule_id: str) -> None:
        """Every run of the schedule waiting behind one in flight goes back to the heap, to be decided again
        (its overlap policy changed: what held it back may not any more)."""
        for eid in list(self._behind.pop(schedule_id, {})):
            self._back_from_behind(eid)

    def unpark(self, schedule_id: str) -> None:
        for e in self._parked.pop(schedule_id, {}).values():
            cur = self._by_id.get(e.id)
            if cur is not None:
                self.defer(cur)

    def expired(self, now_ms: int) -> list[Execution]:
        """In-flight attempts whose recorded deadline has passed, each once. (A record put again with the same
        attempt, e.g. DISPATCHED then RUNNING, leaves two heap entries with its deadline: both are live, and
        returning it twice put one key twice in the timeout txn, which etcd refuses: a smoke drill's planners
        reloaded three partitions for it.)"""
        out: dict[str, Execution] = {}
        while self._deadlines and self._deadlines[0][0] <= now_ms:
            t, _, eid = heapq.heappop(self._deadlines)
            e = self._by_id.get(eid)
            cur = None if e is None else e.current
            if e is not None and e.state in IN_FLIGHT and cur is not None and cur.deadline_ms == t:
                out[eid] = e
        return list(out.values())

    def awaiting_start(self, now_ms: int) -> bool:
        """Whether a dispatched attempt still waits for its start, its start-by not yet passed."""
        for t, _, eid in self._start_bys:
            e = self._by_id.get(eid)
            cur = None if e is None else e.current
            if t > now_ms and e is not None and e.state is ExecState.DISPATCHED and cur is not None \
                    and cur.start_by_ms == t:
                return True
        return False

    def unstarted(self, now_ms: int) -> list[Execution]:
        """Dispatched attempts whose start-by instant has passed with no start recorded, each once (as
        `expired`)."""
        out: dict[str, Execution] = {}
        while self._start_bys and self._start_bys[0][0] <= now_ms:
            t, _, eid = heapq.heappop(self._start_bys)
            e = self._by_id.get(eid)
            cur = None if e is None else e.current
            if e is not None and e.state is ExecState.DISPATCHED and cur is not None and cur.start_by_ms == t:
                out[eid] = e
        return list(out.values())
