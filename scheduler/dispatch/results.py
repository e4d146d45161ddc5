"""Recording workers' results in the ledger, with a typed report of what happened to each.

Any planner may record any result (a result must not be lost when ownership moves), so this is not
fenced by a partition token: the compare-and-swap on the record's mod_revision plus the attempt check
in `execution.result` make a stale or repeated report harmless. Two paths:

- fast: results of executions this node holds in memory (`lookup`, the owner's pending index) are
  decided on that copy and written as one txn of CASes per 120, no reads;
- slow: everything else (not in memory after a restart or an ownership move; dead letters, which keep
  the payload; CASes the fast path lost) is read, decided and CASed one by one (`record_result`), many
  at a time. A lost CAS means the record changed under us (another result, a timeout, a cancel): read
  again and decide again.

Results read from every stream wait in one inbox while earlier ones are being recorded, so the stream
readers never block on etcd and results arriving together share one txn. Each delivery's caller gets a
`ResultReport` back: what became of each of its results and the acknowledgements to send. A result
that could not be recorded (etcd error, record not found) is not acknowledged: the worker sends it
again, maybe to another planner.

This lives with the dispatcher (floor 3) rather than with the planner: it needs only the ledger and
the pure transitions (floor 2), and the owner's memory through a lookup callback, never a partition
loop; its one production caller is the WorkerService stream.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from scheduler._gen.scheduler.v1 import execution_pb2
from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler.api.convert import fencing_token_from_pb
from scheduler.clock import Clock
from scheduler.dispatch.scope import Scope, refused
from scheduler.errors import NotFound, PermissionDenied, SchedError
from scheduler.execution import (
    IN_FLIGHT,
    Disposition,
    ErrorClass,
    ExecState,
    Execution,
    log_fields,
    result,
    with_revision,
)
from scheduler.ids import ExecutionId, execution_id
from scheduler.store.etcd.ops import Op
from scheduler.store.kv import KV
from scheduler.store.ledger import Ledger

log = logging.getLogger(__name__)

PayloadLookup = Callable[[str], Awaitable[bytes]]
NoticeFor = Callable[[str, int], Sequence[Op]]

MAX_CAS_PER_TXN = 120  # under etcd's default --max-txn-ops (128)
LINGER = 0.005  # seconds a small batch of results waits for more to share its txn
SLOW_CONCURRENCY = 32  # slow-path results recorded at once (each is a read and a CAS)

_ERROR_CLASS = {
    execution_pb2.ERROR_CLASS_TRANSIENT: ErrorClass.TRANSIENT,
    execution_pb2.ERROR_CLASS_PERMANENT: ErrorClass.PERMANENT,
    execution_pb2.ERROR_CLASS_UNKNOWN: ErrorClass.UNKNOWN,
    execution_pb2.ERROR_CLASS_TIMEOUT: ErrorClass.TIMEOUT,
}


class Recorded(StrEnum):
    """What became of one result."""

    FINISHED = "finished"  # recorded, and the execution ended (succeeded, failed, cancelled)
    RETRY_SCHEDULED = "retry_scheduled"  # recorded, and the execution waits for its next attempt
    DEAD_LETTERED = "dead_lettered"  # recorded, and the execution went to the dead-letter list
    DUPLICATE = "duplicate"  # this attempt's result was already recorded
    STALE = "stale"  # superseded: a newer attempt exists, or the execution ended without it
    UNKNOWN = "unknown"  # not recorded (etcd error, no such record): not acknowledged, sent again
    # The stream may not report on this execution (another pool or tenant: dispatch/scope.py): nothing is
    # written, and it is acknowledged as stale so that the worker lets go of it instead of re-sending it
    # on every stream forever.
    REFUSED = "refused"


@dataclass(frozen=True)
class ResultEntry:
    execution_id: str
    attempt: int
    recorded: Recorded
    fast: bool  # decided on the owner's memory and written in a batched txn, no read
    execution: Execution | None = None  # the record as written (recorded) or as found (duplicate, stale)


@dataclass(frozen=True)
class ResultReport:
    """One delivery's results: what happened to each, and the acknowledgements to send back (none for an
    UNKNOWN result). Fast-path entries come first, as their acks do."""

    entries: tuple[ResultEntry, ...]
    acks: tuple[wpb.ResultAckEntry, ...]


def _recorded(e: Execution) -> Recorded:
    if e.state is ExecState.DEAD_LETTER:
        return Recorded.DEAD_LETTERED
    # SCHEDULED: a reserved attempt reported never started, retired (execution.result); the run waits for its
    # next attempt like a retry.
    return Recorded.RETRY_SCHEDULED if e.state in (ExecState.RETRY_WAIT, ExecState.SCHEDULED) else Recorded.FINISHED


def outcome(r: wpb.Result) -> tuple[bool, ErrorClass | None]:
    """(succeeded, error class) of a result, for `execution.result`."""
    ok = r.outcome == execution_pb2.ATTEMPT_OUTCOME_SUCCEEDED
    ec = None if ok else _ERROR_CLASS.get(r.error_class, ErrorClass.UNKNOWN)
    if r.outcome == execution_pb2.ATTEMPT_OUTCOME_TIMED_OUT:
        ec = ErrorClass.TIMEOUT
    return ok, ec


def details(r: wpb.Result) -> dict[str, Any]:
    """What a result says beyond its outcome, for `execution.result`: when the handler started, how long
    it ran (by the worker's clock, whatever its offset), whether it never ran, whether a Cancel stopped it,
    and the executor's output; and the token it was dispatched under (a result under another is another
    dispatch's: `execution.result`)."""
    ran = (r.finished_at.ToMilliseconds() - r.started_at.ToMilliseconds()
           if r.HasField("started_at") and r.HasField("finished_at") and not r.not_started else 0)
    return {"started_ms": r.started_at.ToMilliseconds() if r.HasField("started_at") else 0, "ran_ms": max(0, ran),
            "not_started": r.not_started, "cancelled": r.outcome == execution_pb2.ATTEMPT_OUTCOME_CANCELLED,
            "output": (r.stdout_tail, r.stderr_tail, r.exit_code if r.HasField("exit_code") else None)
            if r.stdout_tail or r.stderr_tail or r.HasField("exit_code") else None,
            "token": fencing_token_from_pb(r.fencing_token) if r.HasField("fencing_token") else None}


async def record_result(
    kv: KV,
    ledger: Ledger,
    schedule_id: str,
    planned_ms: int,
    attempt: int,
    *,
    succeeded: bool,
    error_class: ErrorClass | None,
    message: str,
    now_ms: int,
    retry_after_ms: int = 0,
    worker: str = "",
    payload_of: PayloadLookup | None = None,
    timeout: float | None = None,
    max_rounds: int = 5,
    extra: Sequence[Op] = (),
    check: Callable[[Execution], str] | None = None,
    **details: Any,
) -> tuple[Execution, Disposition]:
    """The slow path for one result: read the record, apply the pure transition, compare-and-swap; again
    on a lost CAS. `extra`: ops committed only with the result (a notice for a partition owned elsewhere).
    `details`: what else the result says (`execution.result`'s started_ms, not_started, cancelled, output).
    `check`: why the reporter may not touch the record as read ("" if it may): PermissionDenied, nothing written."""
    for _ in range(max_rounds):
        e = await ledger.get(kv, schedule_id, planned_ms, timeout=timeout)
        if e is None:
            raise NotFound(f"execution {execution_id(schedule_id, planned_ms)} not found")
        if check is not None and (why := check(e)):
            raise PermissionDenied(why)
        new, disposition = result(e, attempt, succeeded=succeeded, error_class=error_class, message=message,
                                  now_ms=now_ms, retry_after_ms=retry_after_ms, worker=worker, **details)
        if disposition is not Disposition.RECORDED:
            return e, disposition
        payload = b""
        if new.state is ExecState.DEAD_LETTER:  # dead letters keep the payload for replay
            if new.payload is not None:
                payload = new.payload  # a replayed dead letter dying again keeps the one it ran with
            elif payload_of is not None:
                payload = await payload_of(schedule_id)
        r = await kv.txn([], [ledger.cas_op(new, e.mod_revision, payload=payload, now_ms=now_ms, extra=extra)],
                         timeout=timeout)
        if ledger.cas_results(r)[0]:
            return ledger.with_revision(new, r.revision), Disposition.RECORDED
    raise NotFound(f"execution {execution_id(schedule_id, planned_ms)}: record kept changing; "
                   f"gave up after {max_rounds} reads")


Key = tuple[str, int]  # (execution id, attempt)
Reply = Callable[[ResultReport], None]


def _key(r: wpb.Result) -> Key:
    return (r.execution_id, r.attempt)


@dataclass(frozen=True)
class _Delivery:
    sender: object  # the stream the results came on: a sender's fast-path acks go out with its first delivery
    worker: str
    results: list[wpb.Result]
    reply: Reply
    scope: Scope | None  # what the sender may report on (None: anything: auth off, or this planner itself)


@dataclass(frozen=True)
class _FastOutcome:
    entries: list[ResultEntry]
    slow: list[wpb.Result]


class ResultRecorder:
    def __init__(
        self,
        *,
        kv: KV,
        ledger: Ledger,
        clock: Clock,
        lookup: Callable[[str], Execution | None],
        on_transition: Callable[[Execution], None],
        notice_for: NoticeFor,
        payload_of: PayloadLookup | None = None,
        timeout: float | None = None,
        after_batch: Callable[[], None] = lambda: None,
    ) -> None:
        """`lookup`: the owner's in-memory copy of an unfinished execution (fast path); `on_transition`: each
        recorded result; `notice_for`: ops telling another node's partition that one of its records changed;
        `payload_of`: a schedule's payload, kept with a dead letter; `after_batch`: called after each turn of
        the inbox (the dispatcher pumps: recorded results freed task-type slots)."""
        self.kv, self.ledger, self.clock = kv, ledger, clock
        self._lookup, self._on_transition, self._notice_for = lookup, on_transition, notice_for
        self._payload_of, self._timeout, self._after_batch = payload_of, timeout, after_batch
        self._inbox: list[_Delivery] = []
        self._task: asyncio.Task[None] | None = None
        self.results = 0  # results answered (acknowledged with any disposition)
        self.refused = 0  # results refused: the reporting stream may not touch the execution (dispatch/scope.py)

    # ---- what the dispatcher calls ------------------------------------------------------------------

    def enqueue(self, sender: object, worker: str, results: list[wpb.Result], reply: Reply,
                scope: Scope | None = None) -> None:
        """Queue one message's results and return at once; `reply` gets their report once they are recorded
        (not at all if recording failed: the worker sends them again). `scope`: the sender's stream's."""
        self._inbox.append(_Delivery(sender, worker, results, reply, scope))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain(), name="result-recorder")

    async def record_now(self, worker: str, results: list[wpb.Result], scope: Scope | None = None) -> ResultReport:
        """Record these results without waiting for others to share their txns (a drain's hand-back)."""
        fast = await self._fast_path(results, lambda r: worker, lambda r: scope)
        self.results += len(fast.entries)
        return await self._slow_path(worker, fast.slow, fast.entries, scope)

    # ---- the inbox ------------------------------------------------------------------------------------

    async def _drain(self) -> None:
        while self._inbox:
            if sum(len(d.results) for d in self._inbox) < MAX_CAS_PER_TXN:
                await asyncio.sleep(LINGER)
            # At most a few txns' worth per turn: the rest waits for the next turn of the loop.
            batch: list[_Delivery] = []
            n = 0
            while self._inbox and n < 8 * MAX_CAS_PER_TXN:
                d = self._inbox.pop(0)
                batch.append(d)
                n += len(d.results)
            try:
                await self._record_batch(batch)
            except Exception:  # not acknowledged: the workers send them again
                log.exception("recording results failed")
            self._after_batch()

    async def _record_batch(self, batch: list[_Delivery]) -> None:
        owner = {_key(r): d for d in batch for r in d.results}  # a result repeated in one batch: its last sender
        fast = await self._fast_path([r for d in batch for r in d.results], lambda r: owner[_key(r)].worker,
                                     lambda r: owner[_key(r)].scope)
        self.results += len(fast.entries)
        by_sender: dict[int, list[ResultEntry]] = {}
        for entry in fast.entries:
            by_sender.setdefault(id(owner[(entry.execution_id, entry.attempt)].sender), []).append(entry)
        for d in batch:
            mine = {_key(r) for r in d.results}
            d.reply(await self._slow_path(d.worker, [r for r in fast.slow if _key(r) in mine],
                                          by_sender.pop(id(d.sender), []), d.scope))

    # ---- the fast path: one txn of CASes, no reads ---------------------------------------------------

    async def _fast_path(self, results: list[wpb.Result], worker_of: Callable[[wpb.Result], str],
                         scope_of: Callable[[wpb.Result], Scope | None]) -> _FastOutcome:
        """Results for executions this node owns and holds in memory: one txn of CASes for all of them, no
        reads. Whatever does not apply cleanly goes to the slow path (read, decide, CAS). `worker_of` names
        the worker that reported a result: recorded in its attempt, in the same CAS; `scope_of` says what
        its stream may report on (a refused result is answered here, never written)."""
        now = self.clock.wall_ms()
        cands: list[tuple[wpb.Result, Execution, Execution]] = []
        slow: list[wpb.Result] = []
        entries: list[ResultEntry] = []
        for r in results:
            old = self._lookup(r.execution_id)
            if old is not None and refused(scope_of(r), old, "result", worker_of(r)):
                self.refused += 1
                entries.append(ResultEntry(r.execution_id, r.attempt, Recorded.REFUSED, True, old))
                continue
            if old is None or old.attempt != r.attempt or old.state not in IN_FLIGHT:
                slow.append(r)
                continue
            ok, ec = outcome(r)
            new, disp = result(old, r.attempt, succeeded=ok, error_class=ec, message=r.message, now_ms=now,
                               retry_after_ms=int(r.retry_after.ToMilliseconds()), worker=worker_of(r),
                               **details(r))
            if disp is not Disposition.RECORDED or new.state is ExecState.DEAD_LETTER:
                slow.append(r)  # dead letters keep the payload: the slow path looks it up
                continue
            cands.append((r, old, new))
        chunks = [cands[i:i + MAX_CAS_PER_TXN] for i in range(0, len(cands), MAX_CAS_PER_TXN)]

        async def commit(chunk: list[tuple[wpb.Result, Execution, Execution]]) -> None:
            try:
                tr = await self.kv.txn([], [self.ledger.cas_op(new, old.mod_revision, now_ms=now,
                                                              old_state=old.state)
                                            for _, old, new in chunk])
            except SchedError:
                slow.extend(r for r, _, _ in chunk)
                return
            for (r, _old, new), applied in zip(chunk, self.ledger.cas_results(tr), strict=False):
                if not applied:
                    slow.append(r)
                    continue
                written = with_revision(new, tr.revision)
                self._on_transition(written)
                entries.append(ResultEntry(r.execution_id, r.attempt, _recorded(written), True, written))

        if len(chunks) == 1:
            await commit(chunks[0])
        elif chunks:
            await asyncio.gather(*(commit(c) for c in chunks))
        return _FastOutcome(entries, slow)

    # ---- the slow path: read, decide, CAS, per result -------------------------------------------------

    async def _slow_path(self, worker: str, slow: list[wpb.Result], fast: list[ResultEntry],
                         scope: Scope | None = None) -> ResultReport:
        """Results the fast path could not apply (not in this node's memory: after a restart or an ownership
        move; dead letters; lost CASes) are read and recorded one by one, but many at a time: after a
        partition reload thousands arrive together, and a sequential read + CAS each would leave them
        unacknowledged for minutes. `fast`: this delivery's fast-path entries, reported first."""
        gate = asyncio.Semaphore(SLOW_CONCURRENCY)

        async def one(r: wpb.Result) -> ResultEntry:
            async with gate:
                try:
                    eid = ExecutionId.parse(r.execution_id)
                    sid, planned_ms = eid.schedule_id, eid.planned_ms
                    ok, ec = outcome(r)
                    e, disp = await record_result(
                        self.kv, self.ledger, sid, planned_ms, r.attempt, succeeded=ok, error_class=ec,
                        message=r.message, now_ms=self.clock.wall_ms(),
                        retry_after_ms=int(r.retry_after.ToMilliseconds()), worker=worker,
                        payload_of=self._payload_of, timeout=self._timeout, extra=self._notice_for(sid, planned_ms),
                        check=None if scope is None else lambda e: refused(scope, e, "result", worker), **details(r),
                    )
                except PermissionDenied:  # logged by `refused`
                    self.refused += 1
                    return ResultEntry(r.execution_id, r.attempt, Recorded.REFUSED, False)
                except (NotFound, SchedError) as err:
                    log.warning("result not recorded: %s", err, extra={"execution_id": r.execution_id})
                    return ResultEntry(r.execution_id, r.attempt, Recorded.UNKNOWN, False)
            self.results += 1
            if disp is Disposition.RECORDED:
                self._on_transition(e)  # which logs it
                return ResultEntry(r.execution_id, r.attempt, _recorded(e), False, e)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("result not applied", extra={"event": "result_ignored", "disposition": disp.value,
                                                       **log_fields(e), "attempt": r.attempt})
            return ResultEntry(r.execution_id, r.attempt,
                               Recorded.DUPLICATE if disp is Disposition.DUPLICATE else Recorded.STALE, False, e)

        done = [await one(slow[0])] if len(slow) == 1 else list(await asyncio.gather(*(one(r) for r in slow)))
        entries = (*fast, *done)
        return ResultReport(entries, tuple(_ack(x) for x in entries if x.recorded is not Recorded.UNKNOWN))


# The acknowledgement of each answered result (UNKNOWN ones get none): the worker forgets it on any of them.
_ACK = {Recorded.DUPLICATE: wpb.RESULT_DISPOSITION_DUPLICATE, Recorded.STALE: wpb.RESULT_DISPOSITION_STALE,
        Recorded.REFUSED: wpb.RESULT_DISPOSITION_STALE}


def _ack(x: ResultEntry) -> wpb.ResultAckEntry:
    return wpb.ResultAckEntry(execution_id=x.execution_id, attempt=x.attempt,
                              disposition=_ACK.get(x.recorded, wpb.RESULT_DISPOSITION_RECORDED))
