"""One dispatch round as a pure function: a snapshot of what is due goes in, a `DispatchPlan` comes out.

The partition planner builds the snapshot (due executions per schedule, the runs in flight, worker
capacity per pool, which records were confirmed in flight and when), calls `plan_dispatch`, and then
applies the plan: it commits every transition in one fenced batch *before* it submits a dispatch or
tells a worker to stop (a cancel whose CAS lost must not reach a worker). Tests assert on the plan.

Overlap (docs/time.md, "What counts as overlap"): a run R counts against a due run X only if R was
really in progress at X's due time: dispatched at or before it and not finished (a catch-up run too:
it overlaps the runs that come due while it runs, never the missed times due before it began). A
run that started after X's due time queues X behind it instead. A lossy decision (skip, cancel)
rests only on records re-read after X's due time; until then X waits and the plan asks for the read
(`confirm`).

A run that has left flight since is judged on its final record instead (`RoundInput.ended`,
`overlapped_by_ended`): it counts against x if it started at or before x's due time and its record
proves it still ran after it. That record was read from etcd or written by this owner, so it needs no
settle time; but its recorded end is when the result was recorded, which a result in transit delays,
so the proof is the worker's own measure of the run (dispatch + the time its handler ran) or the record
having stayed in flight `overlap_settle_ms` past x's due time, never the recorded end alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field

from scheduler.execution import (
    IN_FLIGHT,
    Attempt,
    ExecState,
    Execution,
    Trigger,
    armed,
    cancel,
    dispatch,
    hand_out,
    may_hand_out,
    skip,
)
from scheduler.ids import ExecutionId, FencingToken
from scheduler.timeplan import Overlap, SkipReason
from scheduler.timeplan.overlap import OverlapAction, decide_overlap

# The policies that never run two of a schedule's runs at once.
HOLDS = frozenset({Overlap.SKIP, Overlap.BUFFER_ONE, Overlap.BUFFER_ALL})


@dataclass(frozen=True)
class ScheduleView:
    """What the round needs of a schedule that still exists."""

    overlap: Overlap
    paused: bool
    # When this schedule (this incarnation of its id) was created: a run of one of the id's own planned times
    # at or before it was planned by an earlier schedule of the same id, since deleted (0: not known).
    created_ms: int = 0


@dataclass(frozen=True)
class RoundInput:
    now_ms: int
    due: Mapping[str, Sequence[Execution]]  # schedule id -> due executions, oldest planned time first
    schedules: Mapping[str, ScheduleView]  # absent: deleted
    in_flight: Mapping[str, Sequence[Execution]]  # schedule id -> its runs with an attempt out
    budget: Mapping[str, int]  # pool -> assignments its workers can take now
    catchup: Set[str]  # ids of runs a catch-up created
    confirmed: Mapping[str, tuple[int, int]]  # id -> (mod_revision, wall ms the confirming read was sent)
    node_id: str
    token: FencingToken  # of this owner
    transitions: Mapping[str, tuple[Execution, Execution]] = field(default_factory=dict)  # withdrawals
    start_timeout_ms: int = 0  # start confirmation: each dispatch's start-by (planner/starts.py); 0: none
    overlap_settle_ms: int = 0  # an overlap skip waits this long after the skipped run's due time
    # schedule id -> ids of its runs parked behind a run in flight (DispatchPlan.behind), not in `due`;
    # those the policy buffered (True) count for BUFFER_ONE, and later runs wait behind all of them.
    behind: Mapping[str, Mapping[str, bool]] = field(default_factory=dict)
    # schedule id -> final records of its runs that left flight while some of its due runs waited
    # (PendingIndex.ended): a run decided after the one before it landed is judged on that one's history.
    ended: Mapping[str, Sequence[Execution]] = field(default_factory=dict)
    # cancel_other schedule id -> the newest planned time of its own new runs due, wherever they wait (parked
    # behind a run in flight, deferred for capacity, or in `due`): they supersede older ones all the same (else
    # a backlog that waited behind a stopping run came back one run at a time, each started in turn, instead
    # of the newest winning).
    newest_due: Mapping[str, int] = field(default_factory=dict)
    # Start ahead (docs/workers.md): runs in `due` not due yet came up early; those named here may be handed out
    # now with their start at their due time (PendingIndex.may_arm), the others wait until then.
    ahead_ms: int = 0
    armable: Set[str] = frozenset()


@dataclass(frozen=True)
class Behind:
    """A run that waits for a run of its own schedule to leave flight (to land, or to stop if cancelled)."""

    x: Execution
    by_policy: bool  # buffered by BUFFER_ONE / BUFFER_ALL (counted by BUFFER_ONE)
    until_ms: int | None = None  # decided again at this instant even if the run is still in flight
    # It waits in order behind the runs before it (buffered, or queued behind a late run): when nothing
    # is in flight any more only the earliest such comes back. Otherwise (a skip waiting for the settle
    # time, a start waiting for a cancelled run's stop) it is decided again as soon as nothing is.
    ordered: bool = True
    # It waits for an earlier run of its schedule waiting for its retry (`_plan_schedule`): it stays parked
    # while that run is still waiting, though nothing of the schedule is in flight.
    after_retry: bool = False


@dataclass
class DispatchPlan:
    transitions: dict[str, tuple[Execution, Execution]]  # id -> (old, new): skips, cancels, dispatches
    defer: list[Execution] = field(default_factory=list)  # back to the ready heap (no capacity, a decision pending)
    # Waiting for a run of their own schedule to leave flight (buffered behind it, or behind a late one):
    # parked out of the ready heap until then, so that they do not take, round after round, the places
    # of other schedules' due work in their pool's heap.
    behind: list[Behind] = field(default_factory=list)
    park: list[Execution] = field(default_factory=list)  # retries of paused schedules: until the resume
    confirm: set[str] = field(default_factory=set)  # in-flight records to re-read before deciding
    stop: list[tuple[Execution, str]] = field(default_factory=list)  # running attempts to stop, once committed
    starved_pools: set[str] = field(default_factory=set)  # pools with due work beyond their capacity
    started: dict[str, int] = field(default_factory=dict)  # pool -> dispatches planned (capacity to reserve)
    not_yet: list[Execution] = field(default_factory=list)  # came up early, not armed: back at their due time
    disarm: list[Execution] = field(default_factory=list)  # armed runs their workers should not start after all


def came_due_ms(x: Execution, catchup: Set[str]) -> int:
    """The instant overlap is judged at for x: its due time; for a catch-up run, which is due when the new
    owner created it, the planned time it was owed at (docs/time.md: nothing a new owner starts as it
    takes over overlaps a missed time, and such a run would otherwise count for having started "by" it)."""
    return x.planned_ms if x.id in catchup else x.due_ms


def overlapping(in_flight: Sequence[Execution], x: Execution, catchup: Set[str],
                confirmed: Mapping[str, tuple[int, int]], read_after_ms: int,
                settle_ms: int) -> tuple[list[Execution], list[str]]:
    """The runs really in progress at x's due time, and which of them are not yet confirmed in flight
    by a read sent at or after `read_after_ms`.

    A run with its own overlap policy (a backfill or trigger: an operator's request, due when it was
    made) counts every run in flight, as Temporal's BackfillRequest does: a backfill of a range with
    `skip` runs one of it, not all of it one after another."""
    real: list[Execution] = []
    unconfirmed: list[str] = []
    explicit = x.overlap is not None
    at = came_due_ms(x, catchup)
    for r in in_flight:
        cur = r.current
        if r.state is ExecState.RETRY_WAIT:
            # Waiting for its retry (no attempt out): the caller passes it only if one of its attempts was in
            # progress at x's due time (`attempt_spans`); a run due in the backoff gap is not overlapped.
            real.append(r)
            c = confirmed.get(r.id)
            if c is None or c[0] != r.mod_revision or c[1] < read_after_ms:
                unconfirmed.append(r.id)
            continue
        # A catch-up run counts like any other, by when it started: it overlaps nothing that was due
        # before it began (the other missed times of its catch-up queue behind it, in order), but it does
        # overlap a run that comes due while it is running (a drill found on-time runs queued behind
        # catch-ups for ever when the work took longer than the period, 147 s behind after 4 minutes).
        if cur is None or (not explicit and (cur.started_ms or cur.dispatched_ms) > at
                           and not _earlier_attempt_spans(r, at, settle_ms)):
            continue
        real.append(r)
        c = confirmed.get(r.id)
        if c is None or c[0] != r.mod_revision or c[1] < read_after_ms:
            unconfirmed.append(r.id)
    return real, unconfirmed


def attempt_spans(r: Execution, at: int, settle_ms: int) -> bool:
    """An attempt of r's current run, its last one included, was in progress at `at`: begun by then, and
    still running after it by what its record proves (`_attempt_ran_until`), not by its recorded end, which a
    result in transit delays (the stateful twin: an attempt that failed after 0.1 s, its result recorded by
    the next owner 1.5 s later, made the run due in between an overlap skip though nothing ran then). An
    attempt still out (no end recorded) is in progress."""
    return _spans(r, at, settle_ms, last=True)


def _spans(r: Execution, at: int, settle_ms: int, *, last: bool) -> bool:
    """`attempt_spans` (last: the current attempt counts too) and `_earlier_attempt_spans` (it does not)."""
    for a in r.attempts:
        if a.attempt <= r.attempt_base or (not last and a is r.current):
            continue
        begun = a.started_ms or a.dispatched_ms
        if begun and begun <= at and (not a.finished_ms or at < _attempt_ran_until(a, settle_ms)):
            return True
    return False


def _attempt_ran_until(a: Attempt, settle_ms: int) -> int:
    """Until when an ended attempt is proved to have run (0: it proves nothing): `ran_until_ms` for one attempt."""
    if not a.finished_ms or a.never_started:
        return 0
    by_worker = a.dispatched_ms + a.ran_ms if a.ran_ms else 0
    return min(a.finished_ms, max(by_worker, a.finished_ms - settle_ms))


def _earlier_attempt_spans(r: Execution, at: int, settle_ms: int) -> bool:
    """An earlier attempt of r's current run was in progress at `at`: begun by then, and not recorded as
    ended before it. A run that is on its retry is the same run (Temporal's view of a workflow run with
    retries), so a run that came due while its first attempt held the schedule overlaps it though the
    retry began later. A drill (smoke11) found a `skip` schedule running two at once: a worker was killed
    mid-run, the attempt timed out 11 s later and was retried, and the runs that had come due meanwhile
    were judged against the retry's start, so one of them started next to the retry. Still running at `at`
    by what the record proves, as `attempt_spans` judges."""
    return _spans(r, at, settle_ms, last=False)


def ran_until_ms(r: Execution, settle_ms: int) -> int:
    """Until when the final record `r` proves its last attempt was still running (0: it proves nothing).

    Not its recorded end (`finished_ms`): that is when its result was recorded, and a result in transit (a
    worker reconnecting, a result re-sent through another planner) lands long after the work stopped.
    Either the worker's own measure (the handler ran `ran_ms`, and cannot have started before its
    dispatch), or the record having stayed in flight up to `settle_ms` before its end: the margin the
    in-flight rule gives a result in transit, so that a run that ended is judged as one still in flight
    would have been. Never later than the recorded end."""
    cur = r.current
    return 0 if cur is None else _attempt_ran_until(cur, settle_ms)


def first_start_ms(r: Execution) -> int:
    """When the run first began, as the overlap rule counts it (`overlapping`: started, else dispatched):
    its first attempt of this run, not of an earlier rerun; 0: never dispatched."""
    first = next((a for a in r.attempts if a.attempt > r.attempt_base), None)
    return 0 if first is None else first.started_ms or first.dispatched_ms


def late_overlap(r: Execution, x: Execution, catchup: Set[str]) -> bool:
    """Run r started late, after x came due, though it was due before: had it started on time, would it
    still have been running at x's due time (its own due time plus what its handler ran, by its worker's
    measure)? A late run is judged as if it had run on time, so that lateness alone (a takeover, a result
    in transit) never turns a policy that does not queue into a queue. Without this, the runs that came due
    while a late run waited ran one after the other behind it, and with work longer than the period the
    queue never drained: a drill saw a `skip` schedule of 2.5 s runs every second still 6.2 s behind after
    a 6 s partition had healed. Catch-up runs are exempt on either side (the missed-run policy chose them,
    and they are due at their planned times: docs/time.md), as are operators' runs: triggers (with their own
    overlap policy or the schedule's), backfills, reruns and replays. None is a run an on-time schedule would
    have run, and a trigger's due time is when it was asked for, not a planned time (game day gd-s17a: a
    manual trigger that waited out a takeover was judged as if it had started at its request, and the
    buffer_one run due 0.1 s later was skipped though nothing was in progress then). The checkers
    (chaos/context.py, tests/invariant.py) count only scheduled runs as late runs too."""
    # Its first attempt, not its current one: on time, that is the attempt that would have begun at its due
    # time (the stateful twin: a late run's first attempt failed after 0.1 s and its retry ran 12 s; judged on
    # the retry's 12 s from its due time, the run due 2 s later was skipped though nothing ran then). The
    # checkers judge on the first start too.
    first = next((a for a in r.attempts if a.attempt > r.attempt_base), None)
    if (first is None or not first.ran_ms or first.never_started or r.id == x.id or x.id in catchup
            or r.id in catchup or r.overlap is not None or r.trigger is not Trigger.SCHEDULED
            or r.run_trigger is not None or r.planned_ms >= x.planned_ms):
        return False
    return r.due_ms <= x.due_ms < (first.started_ms or first.dispatched_ms) and x.due_ms < r.due_ms + first.ran_ms


def overlapped_by_ended(ended: Sequence[Execution], x: Execution, catchup: Set[str], settle_ms: int) -> list[Execution]:
    """The runs that left flight and were really in progress at x's due time, by their final records:
    started (dispatched) at or before it, still running after it (`ran_until_ms`), catch-up runs too; and
    the late ones that would have been, had they started on time (`late_overlap`). None for a run with its
    own overlap policy: it counts the runs in flight when it comes up."""
    if x.overlap is not None:
        return []
    out = []
    at = came_due_ms(x, catchup)
    for r in ended:
        cur = r.current
        if cur is None or r.id == x.id:
            continue
        if (cur.started_ms or cur.dispatched_ms) <= at < ran_until_ms(r, settle_ms) or late_overlap(r, x, catchup):
            out.append(r)
    return out


def _own_run(x: Execution) -> bool:
    """A run of one of the schedule's own planned times: not an operator's trigger, backfill, rerun or replay
    (each asked for by somebody, with its own overlap policy or none)."""
    return x.overlap is None and x.trigger is Trigger.SCHEDULED and x.run_trigger is None


def _earlier_incarnation(x: Execution, view: ScheduleView) -> bool:
    """x is a run (new, or waiting for its retry) of an earlier, deleted schedule of the same id: one of its own
    planned times at or before the current schedule's creation (`ScheduleView.created_ms`)."""
    return (_own_run(x) and x.state in (ExecState.SCHEDULED, ExecState.RETRY_WAIT)
            and x.planned_ms <= view.created_ms)


def _scheduled_run(x: Execution) -> bool:
    """A new run of one of the schedule's own planned times (`_own_run`, and not a retry)."""
    return x.state is ExecState.SCHEDULED and _own_run(x)


def supersedes(x: Execution) -> bool:
    """x can supersede older runs under cancel_other: a run of one of the schedule's own planned times, new or
    waiting for its retry (the same run, begun already: an older one started after it would only run beside
    its retry; the stateful twin saw s8@51 started while s8@52 waited 0.4 s for its retry, which then began
    beside it)."""
    return x.state in (ExecState.SCHEDULED, ExecState.RETRY_WAIT) and _own_run(x)


def _newest_cancel_other(waiting: Sequence[Execution], view: ScheduleView,
                         cas: Mapping[str, object], elsewhere: int | None) -> int | None:
    """The planned time of the newest due new run of the schedule's own planned times (waiting, or due
    `elsewhere`: parked or deferred), under a `cancel_other` schedule; None if there is none. (Only such a
    one supersedes: the skip record is justified by a later planned time of the schedule being due, which an
    audit can recompute.)"""
    if view.overlap is not Overlap.CANCEL_OTHER:
        return None
    out = elsewhere
    for y in waiting:
        if y.id not in cas and supersedes(y):
            out = y.planned_ms if out is None else max(out, y.planned_ms)
    return out


def _superseded(x: Execution, view: ScheduleView) -> bool:
    """Under `cancel_other`, a due run x that a later due run supersedes is skipped (`superseded`) instead of
    started and cancelled at once: it could only ever run until the newer one cancelled it. Temporal keeps
    only the newest buffered start under CANCEL_OTHER for the same reason. Without it each run of a backlog
    was started, then cancelled by the next, each waiting for the stop of the one before: with a stop
    slower than the period the backlog grew for ever (a game day saw one 340 s behind at its end); and with
    the older one held only until then (a run was required to be in progress at its due time), a schedule
    that once fell behind stayed one run behind for good, each run starting as the next came due (the half
    game day's slow-006, 2.2 s late every run after its faults). Only a new run of the schedule's own
    policy (`cancel_other`), not a retry, nor a trigger's or backfill's run (an operator asked for that one)."""
    return _scheduled_run(x) and view.overlap is Overlap.CANCEL_OTHER


def plan_dispatch(inp: RoundInput) -> DispatchPlan:
    plan = DispatchPlan(dict(inp.transitions))
    cas = plan.transitions
    budget = dict(inp.budget)
    for sid, waiting in inp.due.items():
        view = inp.schedules.get(sid)
        if view is not None and view.paused and any(x.due_ms > inp.now_ms for x in waiting):
            # Not due yet: a pause records its runs as paused once they are due (a resume before then runs them).
            plan.not_yet.extend(x for x in waiting if x.due_ms > inp.now_ms)
            waiting = [x for x in waiting if x.due_ms <= inp.now_ms]
        if view is None or view.paused:
            why = SkipReason.PAUSED if view is not None else SkipReason.SCHEDULE_DELETED
            for x in waiting:
                if x.id in cas:
                    continue
                if x.state is ExecState.SCHEDULED:
                    cas[x.id] = (x, skip(x, why.value))
                elif view is None:
                    cas[x.id] = (x, cancel(x, why.value))
                else:
                    plan.park.append(x)  # a retry of a paused schedule waits for the resume
            continue
        if view.created_ms and any(_earlier_incarnation(x, view) for x in waiting):
            # The schedule was deleted and created again: the deleted one's runs still waiting (written ahead,
            # or left by an owner that died before the delete's withdrawal) were withdrawn by the delete. A new
            # incarnation never plans a time at or before its creation, so these are not its own, and running
            # them ran what the operator had deleted (its planned times are owed to nobody).
            for x in waiting:
                if x.id not in cas and _earlier_incarnation(x, view):
                    cas[x.id] = (x, skip(x, SkipReason.SCHEDULE_DELETED.value) if x.state is ExecState.SCHEDULED
                                 else cancel(x, SkipReason.SCHEDULE_DELETED.value))
            waiting = [x for x in waiting if x.id not in cas]
        in_flight = list(inp.in_flight.get(sid, ()))
        early = [x for x in waiting if x.due_ms > inp.now_ms and x.id not in cas]
        if early:
            waiting = [x for x in waiting if x.due_ms <= inp.now_ms]
        waiting = _disarm_for(inp, plan, view, in_flight, waiting)
        _plan_schedule(inp, plan, budget, view, in_flight, waiting, inp.behind.get(sid, {}),
                       inp.ended.get(sid, ()), inp.newest_due.get(sid))
        for x in early:
            _arm(inp, plan, budget, x)
    for pool, left in budget.items():
        if left <= 0:
            plan.starved_pools.add(pool)
    return plan


def _disarm_for(inp: RoundInput, plan: DispatchPlan, view: ScheduleView, in_flight: Sequence[Execution],
                waiting: Sequence[Execution]) -> list[Execution]:
    """A run of the schedule came up (an operator's run, or a retry) while a later one waits armed on a worker for
    its due time (start ahead): that one is disarmed, and the run that came up waits until it has been (its
    not-started result recorded) or has started, then is decided as if the armed run had not been handed out
    early. The armed run was not in progress when this one came up, and its own start is judged at its due time
    against what runs then: started at its time beside this one, it would have run two at once where a policy
    allows one, or not cancelled an older run under cancel_other (the stateful twin: an operator's rerun, which
    runs beside anything, started under a cancel_other schedule 0.1 s before its armed run began beside it).
    Only when both allow it (the schedule's policy and this run's are allow_all) does nothing wait."""
    now_armed = [r for r in in_flight if armed(r, inp.now_ms)]
    if not now_armed:
        return list(waiting)
    keep: list[Execution] = []
    for x in waiting:
        if x.id in plan.transitions or (view.overlap is Overlap.ALLOW_ALL
                                        and (x.overlap or view.overlap) is Overlap.ALLOW_ALL):
            keep.append(x)
        else:
            plan.behind.append(Behind(x, False, ordered=False))
    if len(keep) < len(waiting):
        plan.disarm.extend(r for r in now_armed if r not in plan.disarm)
    return keep


def _arm(inp: RoundInput, plan: DispatchPlan, budget: dict[str, int], x: Execution) -> None:
    """Start ahead: x came up before its due time. Handed out now (its worker runs it at its due time) if nothing
    else of its schedule is unfinished (`RoundInput.armable`) and its pool has a free slot, else back at its due
    time, to be decided then by the ordinary rules. Never a skip, a cancel or an overlap decision ahead of time."""
    if x.id not in inp.armable or budget.get(x.pool, 0) <= 0 or x.state is not ExecState.SCHEDULED:
        plan.not_yet.append(x)
        return
    budget[x.pool] -= 1
    plan.started[x.pool] = plan.started.get(x.pool, 0) + 1
    new = (hand_out if may_hand_out(x, inp.token) else dispatch)(
        x, worker="", planner=inp.node_id, token=inp.token, now_ms=inp.now_ms,
        start_timeout_ms=inp.start_timeout_ms, ahead_ms=inp.ahead_ms)
    plan.transitions[x.id] = (x, new)


def _waiting_at(x: Execution, in_flight: Sequence[Execution], ended: Sequence[Execution], catchup: Set[str]) -> bool:
    """An earlier run of x's schedule was still waiting (not yet dispatched) when x came due: BUFFER_ONE's
    one place was taken then. (A drill found buffer_one runs dispatched ever later, 7 s behind and growing,
    because the earlier one had started by the time x was decided.) Not a late run judged as if it had run
    on time (`late_overlap`): on time it would have been running, not waiting, and x the one that waits."""
    for r in (*in_flight, *ended):
        cur = r.current
        if (r.id != x.id and r.planned_ms < x.planned_ms and cur is not None and cur.dispatched_ms > x.due_ms
                and not late_overlap(r, x, catchup)):
            return True
    return False


def _plan_schedule(inp: RoundInput, plan: DispatchPlan, budget: dict[str, int], view: ScheduleView,
                   in_flight: list[Execution], waiting: Sequence[Execution], parked: Mapping[str, bool],
                   ended: Sequence[Execution] = (), newest_due: int | None = None) -> None:
    cas = plan.transitions
    # Parked runs earlier than x wait for a run in flight: x waits behind them, in order. (Later ones
    # are parked behind x's predecessors and come back one by one: they hold nothing back.)
    parked_first = min((ExecutionId.parse(eid).planned_ms for eid in parked), default=None)
    held = held_behind = False  # an earlier run of this schedule waits (for a run in flight): later ones too
    # held by the policy behind a run really in progress (BUFFER_ONE counts them)
    buffered: list[str] = [eid for eid, by_policy in parked.items() if by_policy]
    waited: list[int] = []  # BUFFER_ONE: planned times of runs that waited behind a run that has left flight
    newest = _newest_cancel_other(waiting, view, cas, newest_due)
    for x in waiting:
        if x.id in cas:
            continue
        if newest is not None and x.planned_ms < newest and _superseded(x, view):
            # cancel_other, newest wins: x would start only to be cancelled by a later run that is due too.
            # Its own reason, not overlap_skip: nothing need have been running at x's due time.
            cas[x.id] = (x, skip(x, SkipReason.SUPERSEDED.value))
            continue
        if parked_first is not None and parked_first < x.planned_ms:
            held = held_behind = True
        policy = x.overlap or view.overlap  # a trigger/backfill may carry its own; rerun/replay: ALLOW_ALL
        # Runs waiting for their retry count only for the runs due while one of their attempts was out (a run
        # due in the backoff gap is not overlapped: it waits for the retry, below; docs/time.md).
        live = [r for r in in_flight
                if r.state is not ExecState.RETRY_WAIT
                or attempt_spans(r, came_due_ms(x, inp.catchup), inp.overlap_settle_ms)]
        # An earlier run waiting for its retry holds x under the policies that never run two at once, though
        # nothing of it was in progress at x's due time: x queues behind it (in order, as behind a late run),
        # and is never skipped for it. Started in the backoff gap, x had the retry start beside it ("a retry
        # is the same run": game day gd-s21b, a skip schedule's late run timed out into retry_wait, the run
        # queued behind it started, and the retry 0.1 s later).
        live_ids = {r.id for r in live}
        retrying = policy in HOLDS and x.state is ExecState.SCHEDULED and any(
            r.state is ExecState.RETRY_WAIT and r.planned_ms < x.planned_ms and r.id not in cas
            and r.id not in live_ids for r in in_flight)
        real: list[Execution] = []
        retry_behind = False  # x is a retry that waits for a run of its schedule in flight
        behind = False  # a BUFFER that waits for a run of this schedule in flight
        until: int | None = None  # ... or until this instant, whichever comes first
        if x.state is ExecState.RETRY_WAIT and policy is Overlap.CANCEL_OTHER and (older := [
                r for r in in_flight if r.id not in cas and r.planned_ms < x.planned_ms
                and (r.state in IN_FLIGHT or r.state is ExecState.CANCELLING)]):
            # Newest wins for a retry too: older runs started meanwhile (an operator's backfill run, say) are
            # cancelled and the retry starts once they have stopped (the stateful twin: a backfill's run of
            # 14 s started while the run of 36 s waited for its retry, which then began beside it).
            action, real = OverlapAction.CANCEL_THEN_START, older
        elif x.state is ExecState.RETRY_WAIT and policy in HOLDS and any(
                r.id != x.id and r.state in IN_FLIGHT for r in in_flight):
            # A retry is the same run, never skipped; but under these policies it does not start beside another
            # run of its schedule either. That run began after x's earlier attempt (else it would be waiting
            # behind x): under allow_all before a policy change, or an earlier run late behind x (the stateful
            # twin, twice: the retries of s5@37 and @38 began 50 ms after the change to buffer_all beside @39
            # and @40; after a takeover's backlog s7@57 started late in the round s7@58's retry began). x waits,
            # in order, until it has ended.
            action, behind = OverlapAction.BUFFER, True
            retry_behind = True
        elif x.state is ExecState.RETRY_WAIT or policy is Overlap.ALLOW_ALL:
            action = OverlapAction.START  # a retry is the same run, not a new one
        else:
            # A skip loses x: it rests on a run still in flight `overlap_settle_ms` after x's due time (a
            # result in transit, from a reconnecting worker or through another planner, is no overlap).
            # A cancel loses nothing that is not running: it rests on a read sent after x's due time.
            skip_after = x.due_ms + inp.overlap_settle_ms
            real, unconfirmed = overlapping(live, x, inp.catchup, inp.confirmed, x.due_ms, inp.overlap_settle_ms)
            # Runs that have left flight and were in progress at x's due time, on their final records.
            # Only skip and buffer_one lose a run to them; for the others x starts (in order) as it would
            # have once they ended, so they change nothing.
            gone = (overlapped_by_ended(ended, x, inp.catchup, inp.overlap_settle_ms)
                    if ended and policy in (Overlap.SKIP, Overlap.BUFFER_ONE) else [])
            if gone and (policy is Overlap.SKIP or (waited and waited[0] < x.planned_ms)
                         or any(ExecutionId.parse(b).planned_ms < x.planned_ms for b in buffered)
                         or _waiting_at(x, live, ended, inp.catchup)):
                # Skip: a run was really in progress at x's due time. Buffer one: and an earlier one was
                # waiting then (buffered behind a run, or itself waiting behind the one that ended, or one
                # that has started since: it was not yet dispatched when x came due).
                action = OverlapAction.SKIP
            elif real:  # parked runs count as buffered only behind a run in progress at x's due time
                action = decide_overlap(policy, tuple(r.id for r in real), tuple(buffered)).action
                if action is OverlapAction.SKIP and real:
                    if inp.now_ms < skip_after:
                        # Not yet: decided once the settle time has passed. A view that is merely stale (a
                        # result recorded elsewhere) is corrected by one read now, so x need not wait.
                        plan.confirm.update(unconfirmed)
                        action = OverlapAction.BUFFER
                        behind, until = True, skip_after
                    else:
                        _, unsettled = overlapping(live, x, inp.catchup, inp.confirmed, skip_after,
                                                   inp.overlap_settle_ms)
                        if len(unsettled) == len(real):
                            plan.confirm.update(unsettled)  # decided next round, on records read after then
                            action = OverlapAction.BUFFER
                elif action is OverlapAction.CANCEL_THEN_START and real and unconfirmed:
                    plan.confirm.update(unconfirmed)  # decided next round, on records read after x's due time
                    action = OverlapAction.BUFFER
                elif action is OverlapAction.BUFFER:
                    buffered.append(x.id)
                    behind = True
            elif live or held or retrying:
                action = OverlapAction.BUFFER  # behind a late run: nothing was in progress at x's due time
                behind = bool(live) or held_behind or retrying
            else:
                action = OverlapAction.START
            if gone and action is not OverlapAction.SKIP:
                waited.append(x.planned_ms)  # buffer one: x is the one run that waited behind the one that ended
        if action is OverlapAction.SKIP:
            cas[x.id] = (x, skip(x, SkipReason.OVERLAP_SKIP.value))
            continue
        if action is OverlapAction.BUFFER:
            if behind and (live or retrying or retry_behind):
                plan.behind.append(Behind(x, x.id in buffered, until, ordered=until is None, after_retry=retrying))
                held_behind = True
            elif behind and parked_first is not None and parked_first < x.planned_ms:
                # In order behind a parked earlier run of its schedule, with nothing of it live at x's time: x
                # waits parked too (it comes back in order once that one has). Deferred to the ready heap, it
                # stood in front of the schedule's own retry, due later, which the parked run waits for: with
                # the pool's share taken by such runs every pass, the retry never came up (the stateful twin:
                # a buffer_one schedule wedged for good after one worker crash).
                plan.behind.append(Behind(x, False, ordered=True))
            else:
                plan.defer.append(x)
            held = True
            continue
        # cancel_other, newest wins between a run's retry and a newer run too (the stateful twin, twice: a newer
        # run started while an older one waited for its retry, from a start decided without an overlap, and the
        # retry then began beside it). A retry of the schedule's own run that a newer run supersedes is cancelled
        # (nothing is out); a starting run cancels the older runs waiting for a retry (below).
        if (policy is Overlap.CANCEL_OTHER and x.state is ExecState.RETRY_WAIT and _own_run(x)
                and ((newest is not None and newest > x.planned_ms) or any(
                    r.planned_ms > x.planned_ms and r.state in IN_FLIGHT and r.id not in cas for r in in_flight))):
            cas[x.id] = (x, cancel(x, "overlap", inp.now_ms))
            in_flight = [r for r in in_flight if r.id != x.id]
            continue
        if budget.get(x.pool, 0) <= 0:
            plan.defer.append(x)  # waits for worker capacity
            plan.starved_pools.add(x.pool)
            held = True
            continue
        if policy is Overlap.CANCEL_OTHER and any(
                r.id in cas and cas[r.id][1] is r and r.planned_ms < x.planned_ms for r in in_flight):
            # An older run dispatched in this very round (an operator's replay or rerun, say) would run beside x
            # (a new run or a retry), and its dispatch is not written yet to be cancelled: x waits for the next
            # round, which cancels it as any older run started since (the stateful twin, twice: a replay of s5@3
            # and s5@6 started together; a rerun of s4@2 and the retry of s4@17).
            plan.defer.append(x)
            held = True
            continue
        if policy is Overlap.CANCEL_OTHER and x.state is not ExecState.RETRY_WAIT:
            for r in in_flight:  # x starts (now, or once what it cancels has stopped): older retries end here
                if r.id not in cas and r.state is ExecState.RETRY_WAIT and r.planned_ms < x.planned_ms:
                    cas[r.id] = (r, cancel(r, "overlap", inp.now_ms))
            in_flight = [r for r in in_flight if r.id not in cas]
            # ... and so do older runs started since x came due, which its overlap decision (on what was in
            # progress at its due time) did not see: x would start beside them (the stateful twin: a backfill
            # run's retry began 70 ms after s11@40 came due, and s11@40 started beside it).
            seen = {r.id for r in real}
            since = [r for r in in_flight if r.id not in cas and r.id not in seen and r.planned_ms < x.planned_ms
                     and r.state in IN_FLIGHT]
            if since:
                action, real = OverlapAction.CANCEL_THEN_START, [*real, *since]
        if action is OverlapAction.CANCEL_THEN_START:
            # Cancel is recorded before the work stops (CANCELLING until the worker confirms the stop or
            # the kill deadline passes): x starts only once every run it cancelled has really stopped.
            stopping = False
            for r in real:
                if r.state is ExecState.CANCELLING:
                    stopping = True  # cancelled in an earlier round, still stopping
                elif r.id not in cas and r.state in IN_FLIGHT:
                    stop = cancel(r, "overlap", inp.now_ms)
                    cas[r.id] = (r, stop)
                    plan.stop.append((r, "overlap"))
                    stopping = stopping or stop.state is ExecState.CANCELLING
                elif r.id not in cas and r.state is ExecState.RETRY_WAIT:
                    cas[r.id] = (r, cancel(r, "overlap", inp.now_ms))  # nothing out: cancelled at once
            in_flight = [r for r in in_flight if r.id not in cas]  # (older runs waiting for a retry: above)
            if stopping:
                plan.behind.append(Behind(x, False, ordered=False))  # until the cancelled runs' stop is recorded
                held = held_behind = True
                continue
        budget[x.pool] -= 1
        plan.started[x.pool] = plan.started.get(x.pool, 0) + 1
        # Its reserved attempt, unwritten (the partition skips the CAS), when the record is as this owner created it.
        new = (hand_out if may_hand_out(x, inp.token) else dispatch)(
            x, worker="", planner=inp.node_id, token=inp.token, now_ms=inp.now_ms,
            start_timeout_ms=inp.start_timeout_ms)
        cas[x.id] = (x, new)
        in_flight = [r for r in in_flight if r.id != x.id]  # a retry dispatched: its waiting record is gone
        in_flight.append(new)
