"""Execution records and their state machine: pure functions from (record, event, now) to a new record.

Every transition is a compare-and-swap in etcd keyed on the record's mod_revision and checked here on
the attempt number, so any planner may record a result and a stale attempt never overwrites a newer
one (DESIGN.md, Execution identity and the ledger). The record carries the schedule's retry policy,
so whichever planner receives a result can decide the next state without loading the schedule.

States: scheduled -> dispatched(attempt n) -> running -> succeeded | retry_wait -> dispatched(n+1)...
        | dead_letter (retries exhausted or a permanent error; replay -> scheduled, discard -> failed);
        plus skipped(reason) and cancelled. `failed` is terminal only after a discarded dead letter.
        An operator's rerun takes a terminal record back to scheduled (same id, next attempt).

Attempt numbers only grow: a rerun or replay starts a fresh retry budget at `attempt_base` (the
attempt number reached before it), so attempt n of the first run and attempt n+1 of the rerun can
never be mistaken for each other by a worker, a sink or the CAS.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from enum import StrEnum
from typing import Any, TypeVar

from scheduler.errors import SchedError
from scheduler.ids import FencingToken
from scheduler.model import RetryPolicy
from scheduler.timeplan.hashing import stable_u64
from scheduler.timeplan.policy import Overlap


class ExecState(StrEnum):
    SCHEDULED = "scheduled"
    DISPATCHED = "dispatched"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    RETRY_WAIT = "retry_wait"
    DEAD_LETTER = "dead_letter"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"
    # A cancel recorded while an attempt was out: it becomes CANCELLED when the worker confirms the
    # stop (any result of that attempt) or when the attempt's (kill) deadline passes. Until then the
    # attempt may still be running, so it counts as in flight everywhere (overlap, rerun, timeouts).
    CANCELLING = "cancelling"


TERMINAL = frozenset({ExecState.SUCCEEDED, ExecState.FAILED, ExecState.SKIPPED, ExecState.CANCELLED})
# An attempt may be out on a worker in these states.
IN_FLIGHT = frozenset({ExecState.DISPATCHED, ExecState.RUNNING, ExecState.CANCELLING})
# A run in these states holds its schedule for the overlap rule: an attempt is out, or the run waits for its
# retry (a run on its retry is the same run: a buffered run must not start beside the retry).
HOLDING = IN_FLIGHT | {ExecState.RETRY_WAIT}

# After a cancel of an attempt that is out, how long the worker has to confirm the stop before the
# execution is taken as stopped anyway: the worker's cancel_grace (5 s) + the shell executor's
# SIGTERM->SIGKILL grace (2 s) + a margin for the result to travel.
KILL_AFTER_MS = 10_000


class Trigger(StrEnum):
    SCHEDULED = "scheduled"
    MANUAL = "manual"
    RERUN = "rerun"
    BACKFILL = "backfill"
    REPLAY = "replay"


class ErrorClass(StrEnum):
    TRANSIENT = "transient"  # timeouts, 429, 5xx, connection errors: backoff and retry
    PERMANENT = "permanent"  # bad payload, other 4xx: never retried
    UNKNOWN = "unknown"  # anything else: retried a bounded number of times
    TIMEOUT = "timeout"  # the attempt's deadline passed or its heartbeats stopped: like transient


class Disposition(StrEnum):
    RECORDED = "recorded"
    DUPLICATE = "duplicate"  # this attempt's result is already recorded
    STALE = "stale"  # a newer attempt exists, or the execution is cancelled/terminal


class TransitionError(SchedError):
    """The event does not apply to the record's current state."""


_T = TypeVar("_T")


_FIELDS: dict[type, frozenset[str]] = {}


def _evolve(obj: _T, **changes: Any) -> _T:
    """`dataclasses.replace` for these plain frozen records (no __post_init__, no slots, no
    InitVar), without its per-call field introspection: it is on the path of every transition.
    A misspelt field name still fails loudly, as with replace()."""
    cls = type(obj)
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = frozenset(f.name for f in fields(cls))  # type: ignore[arg-type]
    if not names.issuperset(changes):
        raise TypeError(f"{cls.__name__} has no field(s) {sorted(set(changes) - names)}")
    new = object.__new__(cls)
    d = new.__dict__
    d.update(obj.__dict__)
    d.update(changes)
    return new


def with_revision(e: Execution, revision: int) -> Execution:
    return _evolve(e, mod_revision=revision)


def as_read(e: Execution, create_revision: int) -> Execution:
    """A record as read, with the create revision the read carried."""
    return _evolve(e, create_revision=create_revision)


def as_created(e: Execution, revision: int) -> Execution:
    """The record as its create wrote it at `revision` (its mod and create revision)."""
    return _evolve(e, mod_revision=revision, create_revision=revision)


@dataclass(frozen=True)
class Attempt:
    attempt: int
    worker: str
    planner: str
    token: FencingToken  # of the dispatching owner
    dispatched_ms: int
    deadline_ms: int
    started_ms: int = 0
    finished_ms: int = 0
    error_class: ErrorClass | None = None
    message: str = ""
    succeeded: bool = False
    trigger: Trigger | None = None  # the run it belongs to when an operator started one again (rerun, replay)
    # Start confirmation (docs/workers.md, "Start confirmation"): the worker must have the start
    # recorded (RUNNING) by this planner wall time, or the owner re-dispatches; 0: not confirmed.
    start_by_ms: int = 0
    never_started: bool = False  # ended without its handler running: not counted by the retry policy
    stdout_tail: str = ""  # last bytes of the handler's output, as the executor reported them
    stderr_tail: str = ""
    exit_code: int | None = None
    stop_requested_ms: int = 0  # when a cancel of this attempt was recorded (CANCELLING)
    # How long the handler ran by the worker's own clock (its result's finished_at - started_at; 0: not
    # reported). `finished_ms` is when the result was recorded, which a result in transit delays; the
    # handler cannot have started before `dispatched_ms`, so it surely ran until dispatched_ms + ran_ms
    # (docs/time.md, "What counts as overlap").
    ran_ms: int = 0


@dataclass(frozen=True)
class Execution:
    id: str
    schedule_id: str
    tenant: str
    pool: str
    task_type: str
    planned_ms: int
    due_ms: int  # planned + deterministic jitter
    trigger: Trigger
    retry: RetryPolicy
    timeout_ms: int
    state: ExecState = ExecState.SCHEDULED
    attempt: int = 0  # number of the latest dispatched attempt (0: never dispatched)
    attempts: tuple[Attempt, ...] = ()
    next_attempt_ms: int = 0  # retry_wait: not before this
    skip_reason: str = ""
    # Per-run overrides set by operator operations (trigger, backfill, rerun, replay); None: the
    # schedule's own overlap policy and current payload.
    overlap: Overlap | None = None
    payload: bytes | None = None  # a replayed dead letter runs with the payload it died with
    attempt_base: int = 0  # attempts up to this one belong to earlier runs (rerun/replay budget)
    # `trigger` says how the execution was created and never changes; a run an operator started again
    # is RERUN or REPLAY here, and its attempts carry it.
    run_trigger: Trigger | None = None
    # Why it entered DEAD_LETTER, written by that transition (`result`) and kept after a discard; a
    # replay clears it. Recorded, not recomputed on read: the policy and attempt base may change.
    dead_reason: str = ""
    # How long the tenant's executions-per-second quota pushed the start back (due_ms is already the later
    # time; due_ms - quota_deferred_ms is when it would have been due): written by the planner that
    # materialized it, so that a deferral is in the ledger, not only in one planner's metrics.
    quota_deferred_ms: int = 0
    # The first dispatch written with the creation (docs/keyspace.md, "Reserved first attempt"): attempt
    # `attempt + 1` is reserved for the owner holding this token, which may hand it to a worker without
    # writing a dispatch (`hand_out`); the worker's start CAS is then its first write. Any other dispatch
    # of the record ends the reserved attempt never-started first (`dispatch`), so its number is never
    # given to a second dispatch.
    reserved: FencingToken | None = None
    mod_revision: int = field(default=0, compare=False)  # etcd's, for the next CAS; not stored
    # etcd's create_revision when known (this owner's create, or a read that carried it); 0: not known.
    # Not stored. A hand-out needs the record untouched since its creation (`may_hand_out`).
    create_revision: int = field(default=0, compare=False)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def current(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    @property
    def current_trigger(self) -> Trigger:
        """The trigger of the run under way: what a worker is told (ExecutionContext.trigger)."""
        return self.run_trigger or self.trigger


# Every defaulted field, taken from the dataclass itself: a field added later cannot be left out.
_NEW_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(Execution) if f.default is not MISSING}
assert not [f for f in fields(Execution) if f.default_factory is not MISSING], "new_execution needs plain defaults"


def new_execution(
    *, id: str, schedule_id: str, tenant: str, pool: str, task_type: str, planned_ms: int, due_ms: int,
    trigger: Trigger, retry: RetryPolicy, timeout_ms: int,
) -> Execution:
    """A fresh SCHEDULED execution, equal to `Execution(...)` with the same arguments, built without
    the frozen dataclass __init__ (an object.__setattr__ per field): materialization makes thousands
    a second."""
    e = object.__new__(Execution)
    d = e.__dict__
    d.update(_NEW_DEFAULTS)
    d.update(id=id, schedule_id=schedule_id, tenant=tenant, pool=pool, task_type=task_type, planned_ms=planned_ms,
             due_ms=due_ms, trigger=trigger, retry=retry, timeout_ms=timeout_ms)
    return e


def deadline_slack_ms(timeout_ms: int) -> int:
    """The recorded deadline trails the worker's own timeout (counted from when it received the
    assignment) by this much, so that a slow network cannot let the planner start attempt n+1 while
    attempt n is still allowed to run: the worker gives up first, then the planner times it out."""
    return min(max(2_000, timeout_ms // 10), 30_000)


def dispatchable(e: Execution, now_ms: int) -> bool:
    if e.state is ExecState.SCHEDULED:
        return e.due_ms <= now_ms
    if e.state is ExecState.RETRY_WAIT:
        return e.next_attempt_ms <= now_ms
    return False


RESERVED_MESSAGE = "reserved for the owner that created the record, not handed out by it: dispatched again"


def reserve(e: Execution, token: FencingToken) -> Execution:
    """A new record's first attempt reserved for the creating owner (`token`): written with the create."""
    return _evolve(e, reserved=token)


def may_hand_out(e: Execution, token: FencingToken) -> bool:
    """Whether the owner holding `token` may hand `e` out without writing a dispatch: its own reservation,
    on the record exactly as created (any write since, a cancel, a rerun, a skip and its revival, moved its
    revision: from then on only a written dispatch, which retires the reserved number). The owner hands a
    record out once: its snapshot then holds it DISPATCHED at that revision (PendingIndex.put keeps it so
    against a read of the unchanged record)."""
    return (e.reserved == token and e.state is ExecState.SCHEDULED and e.create_revision > 0
            and e.mod_revision == e.create_revision)


def hand_out(e: Execution, *, worker: str, planner: str, token: FencingToken, now_ms: int,
             start_timeout_ms: int = 0, ahead_ms: int = 0) -> Execution:
    """The reserved attempt handed to a worker, in memory only: the record in etcd stays as created, and
    the worker's start CAS (from the creation revision, fenced by `token`) writes the attempt with RUNNING.
    `mod_revision` is kept: every later CAS from this snapshot compares against the creation."""
    if not may_hand_out(e, token):
        raise TransitionError(f"{e.id}: attempt {e.attempt + 1} is not reserved for {token} on this record")
    return dispatch(_evolve(e, reserved=None), worker=worker, planner=planner, token=token, now_ms=now_ms,
                    start_timeout_ms=start_timeout_ms, ahead_ms=ahead_ms)


def retire_reserved(e: Execution, now_ms: int, *, worker: str = "", message: str = RESERVED_MESSAGE) -> Execution:
    """The reserved attempt recorded as never started (not counted by the retry policy), so that no other
    dispatch takes its number: its owner may have handed it to a worker, which can still ask to start it
    (refused: the record has moved) and report it not started (stale: a later attempt is current).
    `worker`, `message`: the worker's own not-started report of it (`result`), when that is what retires it."""
    if e.reserved is None:
        return e
    n = e.attempt + 1
    gone = Attempt(n, worker, "", e.reserved, 0, 0, finished_ms=now_ms, error_class=ErrorClass.TRANSIENT,
                   message=message, never_started=True)
    return _evolve(e, reserved=None, attempt=n, attempts=(*e.attempts, gone))


def dispatch(e: Execution, *, worker: str, planner: str, token: FencingToken, now_ms: int,
             start_timeout_ms: int = 0, ahead_ms: int = 0) -> Execution:
    """Hand attempt n+1 to a worker. The deadline is recorded so a new owner waits for it; so is the
    start-by instant (`start_timeout_ms` > 0), after which an attempt no worker started is re-dispatched.
    A reserved attempt not handed out by this call is retired first (`retire_reserved`).

    `ahead_ms`: a new run may be handed out up to this long before it is due (start ahead); its worker runs
    it at its due time, so its deadline counts from then (`armed`)."""
    if not dispatchable(e, now_ms + ahead_ms):
        raise TransitionError(f"{e.id}: cannot dispatch in state {e.state} (due {e.due_ms}, now {now_ms})")
    e = retire_reserved(e, now_ms)
    n = e.attempt + 1
    begins = max(now_ms, e.due_ms) if e.state is ExecState.SCHEDULED else now_ms
    a = Attempt(n, worker, planner, token, now_ms, begins + e.timeout_ms + deadline_slack_ms(e.timeout_ms),
                trigger=e.run_trigger, start_by_ms=now_ms + start_timeout_ms if start_timeout_ms > 0 else 0)
    return _evolve(e, state=ExecState.DISPATCHED, attempt=n, attempts=(*e.attempts, a), next_attempt_ms=0)


def armed(e: Execution, now_ms: int) -> bool:
    """e's current attempt was handed out before the run was due (start ahead) and the run is not due yet at
    `now_ms`: its worker holds it until then, and the owner may still disarm it (wpb.Disarm). A dispatch at
    or after the due time (every other) is never armed."""
    cur = e.current
    return (e.state in (ExecState.DISPATCHED, ExecState.RUNNING) and cur is not None
            and cur.dispatched_ms < e.due_ms and now_ms < e.due_ms)


def start_refusal(e: Execution, attempt: int) -> str:
    """Why attempt `attempt` may not start now ("" if it may): only a dispatched attempt that is still
    the current one can. A CAS from the record's revision then makes it RUNNING, and the owner's
    re-dispatch after start-by is a CAS from the same revision: exactly one of them wins."""
    if e.attempt != attempt or e.state is not ExecState.DISPATCHED:
        return f"execution is {e.state.value} at attempt {e.attempt}"
    return ""


def started(e: Execution, attempt: int, now_ms: int, worker: str = "") -> Execution:
    """DISPATCHED(n) -> RUNNING(n): the worker's start request, recorded before its handler runs."""
    why = start_refusal(e, attempt)
    if why:
        raise TransitionError(f"{e.id}: attempt {attempt} cannot start: {why}")
    cur = e.current
    assert cur is not None
    # Handed out ahead of its time: the worker runs it at its due time, not when the start is recorded.
    at = max(now_ms, e.due_ms) if cur.dispatched_ms < e.due_ms else now_ms
    return _evolve(e, state=ExecState.RUNNING,
                   attempts=(*e.attempts[:-1], _evolve(cur, started_ms=at, worker=worker or cur.worker)))


def backoff_ms(e: Execution, attempt: int) -> int:
    """Exponential backoff with full jitter, the jitter derived from (execution, attempt) so that a
    replayed decision is the same wherever it is made."""
    r = e.retry
    cap = min(r.max_backoff_ms, int(r.initial_backoff_ms * r.multiplier ** (attempt - 1)))
    frac = stable_u64(f"{e.id}\x00R\x00{attempt}") / 2**64
    return int(cap * frac)


def _should_retry(e: Execution, error_class: ErrorClass) -> bool:
    if error_class is ErrorClass.PERMANENT:
        return False
    used = e.attempt - e.attempt_base - sum(1 for a in e.attempts if a.never_started and a.attempt > e.attempt_base)
    if used >= e.retry.max_attempts:
        return False
    if error_class is ErrorClass.UNKNOWN:
        unknown = sum(1 for a in e.attempts if a.attempt > e.attempt_base and a.error_class is ErrorClass.UNKNOWN)
        return unknown < e.retry.max_unknown_attempts
    return True


def result(
    e: Execution,
    attempt: int,
    *,
    succeeded: bool,
    error_class: ErrorClass | None,
    message: str,
    now_ms: int,
    retry_after_ms: int = 0,
    worker: str = "",
    started_ms: int = 0,
    not_started: bool = False,
    cancelled: bool = False,
    output: tuple[str, str, int | None] | None = None,
    ran_ms: int = 0,
    token: FencingToken | None = None,
) -> tuple[Execution, Disposition]:
    """Record attempt `attempt`'s outcome; a late or repeated report changes nothing. `worker` (the id of the
    worker that reported it) fills the attempt's worker, unknown when it was dispatched: the record is
    marked dispatched before a worker is picked, so the result's write is the one that can say who ran it.

    `started_ms`: the worker's handler start, kept if no start was recorded. `not_started`: the handler
    never ran (start refused or unconfirmed, handed back): re-dispatched at once, not counted by the retry
    policy. `cancelled`: the worker stopped it on a Cancel (outcome CANCELLED: no error class).
    `output`: (stdout tail, stderr tail, exit code) from the executor. `ran_ms`: how long the handler ran,
    as the worker measured it (kept for overlap decisions on the final record). A result of a CANCELLING attempt
    is the worker's stop confirmation: the execution ends CANCELLED (SUCCEEDED if it finished anyway).

    `token` (the worker's echo of its assignment's): a result under another token is another dispatch's,
    stale. So is a not-started report from a worker other than the one whose start was recorded. Written
    dispatches give every (id, attempt) one token and one worker; a reserved attempt handed out without a
    write leaves only these checks between a handed-out copy that never ran and the attempt that did."""
    if not_started and e.state is ExecState.SCHEDULED and e.reserved is not None and attempt == e.attempt + 1 \
            and token in (None, e.reserved):
        # The reserved attempt, handed out unwritten, never started, as read from etcd (its owner no longer
        # holds it: the record as created). Its start CAS may still be in flight: sent as etcd lost its quorum,
        # it can land after the worker gave up waiting for the answer (game day, session 28: RUNNING for a
        # worker that had dropped it, 6-10 s until its new owner gave it up). Retiring the number is a CAS
        # from the creation revision, the one that start CAS compares: exactly one of them lands, and a start
        # that landed first makes this the starter's not-started report of a RUNNING attempt (below).
        return (retire_reserved(e, now_ms, worker=worker, message=message[:2000] or RESERVED_MESSAGE),
                Disposition.RECORDED)
    if e.attempt != attempt or e.state not in IN_FLIGHT:
        cur = e.current
        if cur is not None and cur.attempt == attempt and cur.finished_ms:
            return e, Disposition.DUPLICATE
        return e, Disposition.STALE
    cur = e.current
    assert cur is not None
    if token is not None and token != cur.token:
        return e, Disposition.STALE
    if not_started and cur.started_ms and worker and cur.worker and worker != cur.worker:
        return e, Disposition.STALE
    ec = None if succeeded or cancelled else (error_class or ErrorClass.UNKNOWN)
    done = _evolve(cur, finished_ms=now_ms, succeeded=succeeded, error_class=ec, message=message[:2000],
                   worker=worker or cur.worker, started_ms=0 if not_started else cur.started_ms or started_ms,
                   never_started=not_started or cur.never_started,  # a start recorded but never acted on: none
                   ran_ms=0 if not_started else max(0, ran_ms))
    if output is not None:
        done = _evolve(done, stdout_tail=output[0], stderr_tail=output[1], exit_code=output[2])
    attempts = (*e.attempts[:-1], done)
    if succeeded:
        return _evolve(e, state=ExecState.SUCCEEDED, attempts=attempts), Disposition.RECORDED
    if e.state is ExecState.CANCELLING or cancelled:
        return _evolve(e, state=ExecState.CANCELLED, attempts=attempts), Disposition.RECORDED
    if not_started and cur.dispatched_ms < e.due_ms and all(a.never_started for a in attempts
                                                            if a.attempt > e.attempt_base):
        # Handed out ahead of its time (start ahead) and never begun, nor any attempt of this run before it: still
        # a new run, waiting for its due time as one, never run before it (a disarm after a pause: recorded as
        # paused once due, as the schedule's other runs are; a retry would wait for the resume and run then).
        return _evolve(e, state=ExecState.SCHEDULED, attempts=attempts, next_attempt_ms=0), Disposition.RECORDED
    if not_started:  # the same run, never begun: again at once, like a drain hand-back
        return _evolve(e, state=ExecState.RETRY_WAIT, attempts=attempts, next_attempt_ms=now_ms), Disposition.RECORDED
    e2 = _evolve(e, attempts=attempts)
    assert ec is not None
    if _should_retry(e2, ec):
        wait = max(backoff_ms(e2, attempt), retry_after_ms)
        return _evolve(e2, state=ExecState.RETRY_WAIT, next_attempt_ms=now_ms + wait), Disposition.RECORDED
    return _evolve(e2, state=ExecState.DEAD_LETTER, dead_reason=_dead_reason(e2, ec)), Disposition.RECORDED


def dead_reason(e: Execution) -> str:
    """The recorded reason of a dead letter; for a record written before reasons were recorded, the
    same rule applied to its latest attempt."""
    if e.dead_reason:
        return e.dead_reason
    cur = e.current
    return _dead_reason(e, cur.error_class if cur is not None and cur.error_class else ErrorClass.UNKNOWN)


def _dead_reason(e: Execution, error_class: ErrorClass) -> str:
    """Why `_should_retry` said no, counting only the attempts of the run under way (after
    `attempt_base`: a rerun or replay has its own budget)."""
    if error_class is ErrorClass.PERMANENT:
        return "permanent error"
    n = e.attempt - e.attempt_base
    if n >= e.retry.max_attempts:
        return f"retries exhausted ({n} attempt{'s' if n != 1 else ''})"
    unknown = sum(1 for a in e.attempts if a.attempt > e.attempt_base and a.error_class is ErrorClass.UNKNOWN)
    return f"unknown-error limit ({unknown} unknown error{'s' if unknown != 1 else ''})"


UNSTARTED_MESSAGE = "no worker confirmed the start by the start-by deadline: dispatched again"
KILL_MESSAGE = "cancelled, and its worker did not confirm the stop by the kill deadline"


def unstarted(e: Execution, now_ms: int) -> Execution | None:
    """The owner's side of start confirmation: a DISPATCHED attempt past its start-by instant is ended
    never-started and the execution is due again at once (same id, next attempt). Applied by a CAS from
    the record's revision, which a worker's start CAS from that revision excludes. None: not due."""
    cur = e.current
    if e.state is not ExecState.DISPATCHED or cur is None or not cur.start_by_ms or cur.start_by_ms > now_ms:
        return None
    new, _ = result(e, e.attempt, succeeded=False, error_class=ErrorClass.TRANSIENT, message=UNSTARTED_MESSAGE,
                    now_ms=now_ms, not_started=True)
    return new


def timed_out(e: Execution, now_ms: int) -> bool:
    cur = e.current
    return e.state in IN_FLIGHT and cur is not None and cur.deadline_ms <= now_ms


def cancel(e: Execution, reason: str, now_ms: int = 0, kill_after_ms: int = KILL_AFTER_MS) -> Execution:
    """Cancel: at once when no attempt is out; otherwise CANCELLING until the worker confirms the stop
    or the kill deadline (`now + kill_after_ms`, never later than the attempt's own deadline) passes.
    A second cancel of a CANCELLING execution changes nothing (the first one's deadline stands)."""
    if e.terminal:
        raise TransitionError(f"{e.id}: already {e.state}")
    if e.state is ExecState.CANCELLING:
        return e
    cur = e.current
    if e.state is ExecState.DISPATCHED and cur is not None and cur.start_by_ms and not cur.started_ms and now_ms:
        # Start confirmation is in force and no start was recorded: no handler runs (a start from now on
        # is refused, the record having moved), so it is cancelled at once, the attempt never started.
        unrun = _evolve(cur, finished_ms=now_ms, never_started=True, message="cancelled before it started")
        return _evolve(e, state=ExecState.CANCELLED, skip_reason=reason, attempts=(*e.attempts[:-1], unrun))
    if e.state in IN_FLIGHT and cur is not None and now_ms:
        stopping = _evolve(cur, stop_requested_ms=now_ms, deadline_ms=min(cur.deadline_ms, now_ms + kill_after_ms))
        return _evolve(e, state=ExecState.CANCELLING, skip_reason=reason, attempts=(*e.attempts[:-1], stopping))
    return _evolve(e, state=ExecState.CANCELLED, skip_reason=reason)


def skip(e: Execution, reason: str) -> Execution:
    """Withdraw a pre-written execution that never ran (pause, schedule change)."""
    if e.state is not ExecState.SCHEDULED:
        raise TransitionError(f"{e.id}: only a scheduled execution can be skipped, not {e.state}")
    return _evolve(e, state=ExecState.SKIPPED, skip_reason=reason)


def replay(e: Execution, now_ms: int, *, payload: bytes | None = None) -> Execution:
    """Operator replay of a dead letter: same id, a fresh retry budget, due now, with the payload it
    died with. It is the same run continued (like a retry), so the overlap policy does not hold it."""
    if e.state is not ExecState.DEAD_LETTER:
        raise TransitionError(f"{e.id}: only dead letters can be replayed, not {e.state}")
    return _evolve(e, state=ExecState.SCHEDULED, run_trigger=Trigger.REPLAY, due_ms=min(e.due_ms, now_ms),
                   next_attempt_ms=0, attempt_base=e.attempt, overlap=Overlap.ALLOW_ALL,
                   payload=payload if payload is not None else e.payload, dead_reason="")


def discard(e: Execution) -> Execution:
    if e.state is not ExecState.DEAD_LETTER:
        raise TransitionError(f"{e.id}: only dead letters can be discarded, not {e.state}")
    return _evolve(e, state=ExecState.FAILED)


def rerun(e: Execution, now_ms: int, *, retry: RetryPolicy, timeout_ms: int) -> Execution:
    """Operator rerun of a finished planned time: back to scheduled under the same id, the next attempt
    number, the schedule's current retry policy and timeout. The operator asked for this run, so the
    schedule's overlap policy does not skip it. Dead letters go through `replay` instead."""
    if not e.terminal:
        raise TransitionError(f"{e.id}: only a finished execution can be rerun, not {e.state}")
    return _evolve(e, state=ExecState.SCHEDULED, run_trigger=Trigger.RERUN, due_ms=min(e.due_ms, now_ms),
                   next_attempt_ms=0, skip_reason="", attempt_base=e.attempt, retry=retry, timeout_ms=timeout_ms,
                   overlap=Overlap.ALLOW_ALL, payload=None)


def log_fields(e: Execution, partition: int | None = None, token: FencingToken | None = None) -> dict[str, object]:
    """The fields every execution event log line carries (docs/operations.md, Logs). The token is the
    latest attempt's (`<partition>:<revision>`) unless the caller, an owner, gives its own; the partition
    comes from the token when the caller does not know it."""
    if token is None:
        cur = e.current
        token = cur.token if cur is not None else None
    if partition is None and token is not None:
        partition = token.partition
    return {"execution_id": e.id, "schedule_id": e.schedule_id, "partition": "" if partition is None else partition,
            "token": "" if token is None else str(token), "attempt": e.attempt, "state": e.state.value}
