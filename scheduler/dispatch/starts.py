"""The planner's half of start confirmation: record a worker's `Started` requests, answer `StartAck`.

A worker runs a handler only after its start is recorded: DISPATCHED(n) -> RUNNING(n, started_ms,
worker), a compare-and-swap on the record's mod_revision, in the same nested txn as a compare on the
partition's owner key (`create_revision == ` the token the attempt was dispatched under). The owner
re-dispatches an attempt still DISPATCHED past its start-by by a CAS from the same revision
(planner/starts.py), so exactly one of the two wins: the worker runs it, or the next attempt exists
and this one is refused. A changed owner refuses it too, so only attempts of the current ownership
start (a new owner re-dispatches the rest after their start-by).

Cost: one etcd write per execution, batched: start requests arriving together (any streams) share
one txn of nested CASes, like results. Requests for executions the owner holds in memory need no
read (the fast path); others (after an ownership move, a lost CAS) are read, decided, and CASed.
Any planner may answer for any partition; one that does not own it adds a notice (docs/keyspace.md)
so the owner takes the RUNNING record in.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler.api.convert import fencing_token_from_pb
from scheduler.clock import Clock
from scheduler.dispatch.scope import Scope, refused
from scheduler.errors import SchedError
from scheduler.execution import (
    ExecState,
    Execution,
    as_read,
    hand_out,
    may_hand_out,
    start_refusal,
    started,
    with_revision,
)
from scheduler.ids import ExecutionId
from scheduler.store.codec import decode_execution
from scheduler.store.etcd.ops import Compare, Op, TxnOp
from scheduler.store.keyspace import Keyspace, partition_for
from scheduler.store.kv import KV
from scheduler.store.ledger import Ledger

log = logging.getLogger(__name__)

_MAX_PER_TXN = 120  # under etcd's default --max-txn-ops (128)
_LINGER = 0.002  # seconds a small batch waits for more requests to share its txn (starts delay handlers)
_SLOW_CONCURRENCY = 32


@dataclass
class _Req:
    reply: Callable[[wpb.StartAckEntry], None]
    worker: str
    r: wpb.StartRequest
    scope: Scope | None = None  # what the requesting stream may start (dispatch/scope.py); None: anything


def start_cas(ledger: Ledger, ks: Keyspace, old: Execution, new: Execution, extra: Sequence[Op] = ()) -> TxnOp:
    """The start CAS: the record unchanged since `old` was read (or created, for a reserved attempt handed
    out unwritten), and the dispatching owner still owning (its owner key's create_revision is the token)."""
    cur = old.current
    assert cur is not None
    fence = Compare.create_revision(ks.owner(cur.token.partition), "==", cur.token.revision)
    op = ledger.cas_op(new, old.mod_revision, old_state=ExecState.DISPATCHED, extra=extra)
    return TxnOp((*op.compare, fence), op.success, op.failure)


class StartRecorder:
    def __init__(self, *, kv: KV, ledger: Ledger, ks: Keyspace, partitions: int, clock: Clock,
                 lookup: Callable[[str], Execution | None], on_started: Callable[[Execution], None],
                 notice_for: Callable[[str, int], Sequence[Op]]) -> None:
        self.kv, self.ledger, self.ks, self.partitions, self.clock = kv, ledger, ks, partitions, clock
        self._lookup, self._on_started, self._notice_for = lookup, on_started, notice_for
        self._inbox: list[_Req] = []
        self._task: asyncio.Task[None] | None = None
        self.started = 0
        self.refused = 0
        self.unknown = 0  # answered UNKNOWN: etcd did not answer (the worker asks another planner)

    def enqueue(self, worker: str, reqs: Sequence[wpb.StartRequest],
                reply: Callable[[list[wpb.StartAckEntry]], None], scope: Scope | None = None) -> None:
        """Queue a stream's requests; `reply` gets their answers (one message per recorded batch)."""
        pending: list[wpb.StartAckEntry] = []
        left = [len(reqs)]

        def one(a: wpb.StartAckEntry) -> None:  # answers of one message go back together
            pending.append(a)
            left[0] -= 1
            if left[0] == 0:
                reply(pending)

        self._inbox += [_Req(one, worker, r, scope) for r in reqs]
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain(), name="start-recorder")

    async def _drain(self) -> None:
        while self._inbox:
            if len(self._inbox) < _MAX_PER_TXN:
                await asyncio.sleep(_LINGER)
            batch, self._inbox = self._inbox[:8 * _MAX_PER_TXN], self._inbox[8 * _MAX_PER_TXN:]
            try:
                await self.record(batch)
            except Exception:  # never leave a worker waiting for an answer that will not come
                log.exception("recording starts failed")
                for q in batch:
                    q.reply(self._ack(q, wpb.START_DISPOSITION_REFUSED, "planner error recording the start"))

    @staticmethod
    def _ack(q: _Req, disposition: int, reason: str = "") -> wpb.StartAckEntry:
        return wpb.StartAckEntry(execution_id=q.r.execution_id, attempt=q.r.attempt,
                                 disposition=disposition, reason=reason)  # type: ignore[arg-type]

    def _op(self, old: Execution, new: Execution) -> TxnOp:
        return start_cas(self.ledger, self.ks, old, new, self._notice_for(new.schedule_id, new.planned_ms))

    def _decide(self, q: _Req, e: Execution, now_ms: int) -> Execution | str:
        # Another pool's or tenant's execution: refused before anything else (logged by the slow path,
        # which every refusal goes through).
        why = (q.scope.refusal(e) if q.scope is not None else "") or start_refusal(e, q.r.attempt)
        cur = e.current
        if not why and cur is not None and cur.token != (sent := fencing_token_from_pb(q.r.fencing_token)):
            why = f"fencing token {sent} is not the attempt's {cur.token}"
        return why or started(e, q.r.attempt, now_ms, q.worker)

    async def record(self, batch: list[_Req]) -> None:
        now = self.clock.wall_ms()
        fast: list[tuple[_Req, Execution, Execution]] = []
        slow: list[_Req] = []
        for q in batch:
            e = self._lookup(q.r.execution_id)
            d = None if e is None else self._decide(q, e, now)
            if e is None or isinstance(d, str):
                slow.append(q)  # unknown here, or refused by memory: decide on the record itself
            else:
                assert d is not None
                fast.append((q, e, d))
        async def commit(chunk: list[tuple[_Req, Execution, Execution]]) -> None:
            try:
                tr = await self.kv.txn([], [self._op(old, new) for _, old, new in chunk])
            except SchedError:
                slow.extend(q for q, _, _ in chunk)  # outcome unknown: the read tells
                return
            for (q, _, new), applied in zip(chunk, self.ledger.cas_results(tr), strict=True):
                if applied:
                    self._won(q, with_revision(new, tr.revision))
                else:
                    slow.append(q)

        # Chunks of one batch in flight together (as results): one txn's round trip, not one per chunk.
        await asyncio.gather(*(commit(fast[i:i + _MAX_PER_TXN]) for i in range(0, len(fast), _MAX_PER_TXN)))
        if slow:
            gate = asyncio.Semaphore(_SLOW_CONCURRENCY)

            async def one(q: _Req) -> None:
                async with gate:
                    await self._slow(q, now)
            await asyncio.gather(*(one(q) for q in slow))

    def _won(self, q: _Req, e: Execution) -> None:
        self.started += 1
        self._on_started(e)
        q.reply(self._ack(q, wpb.START_DISPOSITION_STARTED))

    def _refuse(self, q: _Req, why: str) -> None:
        self.refused += 1
        log.info("start refused", extra={"event": "start_refused", "execution_id": q.r.execution_id,
                                         "attempt": q.r.attempt, "worker": q.worker, "reason": why})
        q.reply(self._ack(q, wpb.START_DISPOSITION_REFUSED, why))

    @staticmethod
    def _handed_out(q: _Req, e: Execution, now_ms: int) -> Execution:
        """A start of the reserved attempt its owner handed out unwritten (`execution.hand_out`), asked of
        this planner (the owner's answer was UNKNOWN, or another planner serves the stream): the record as
        created, handed out here as the owner did, so that the start CAS from its creation revision (fenced
        by the reserving token) can record it. Only the reservation's own number and token, and only on
        the record untouched since its create (a cancel or rerun since moved it: refused)."""
        token = fencing_token_from_pb(q.r.fencing_token)
        if q.r.attempt != e.attempt + 1 or not may_hand_out(e, token):
            return e
        # The owner's dispatch time is not known here: now is later, so the deadline only moves later (the
        # worker's own timeout runs from its receipt of the assignment, earlier still).
        return hand_out(e, worker="", planner="", token=token, now_ms=now_ms)

    async def _slow(self, q: _Req, now_ms: int) -> None:
        """Read the record and decide on it: one read + one CAS. A lost CAS refuses the start; the worker
        then reports the attempt not started, which is safe whatever was written. An etcd error answers
        UNKNOWN: the worker asks another planner, whose read tells (a start of its own recorded by us is
        STARTED there; one not recorded is recorded or refused there)."""
        try:
            eid = ExecutionId.parse(q.r.execution_id)
            sid, planned_ms = eid.schedule_id, eid.planned_ms
            got = await self.kv.get(self.ks.execution(partition_for(sid, self.partitions), sid, planned_ms))
            if got is None:
                self._refuse(q, "unknown execution")
                return
            e = as_read(decode_execution(got.value, got.mod_revision), got.create_revision)
            # Before the repeat check below: a stream of another pool naming the running worker's id
            # must not be told that the start is its own.
            if why := refused(q.scope, e, "start", q.worker):
                self._refuse(q, why)
                return
            e = self._handed_out(q, e, now_ms)
            d = self._decide(q, e, now_ms)
            if isinstance(d, str):
                if e.state is ExecState.RUNNING and e.attempt == q.r.attempt and e.current is not None \
                        and e.current.worker == q.worker:
                    self._won(q, e)  # our own earlier request, recorded (a repeat after an unknown outcome)
                    return
                self._refuse(q, d)
                return
            tr = await self.kv.txn([], [self._op(e, d)])
        except ValueError as err:
            self._refuse(q, f"could not record the start: {err}")
            return
        except SchedError as err:
            # etcd did not answer us: the start may have been recorded (by the fast path's txn, or this
            # one). Another planner can read the record and answer for it (the half game day gd-s20b: a
            # flaky link made its owner refuse 17 starts it had recorded, which then waited 7 s for a
            # second attempt).
            self.unknown += 1
            log.info("start outcome unknown", extra={"event": "start_unknown", "execution_id": q.r.execution_id,
                                                     "attempt": q.r.attempt, "worker": q.worker, "reason": str(err)})
            q.reply(self._ack(q, wpb.START_DISPOSITION_UNKNOWN, f"could not record the start: {err}"))
            return
        if self.ledger.cas_results(tr)[0]:
            self._won(q, with_revision(d, tr.revision))
        else:
            self._refuse(q, "the record changed or the partition's owner changed since the dispatch")
