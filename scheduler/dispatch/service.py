"""The planner side of `WorkerService`: one bidirectional stream per connected worker.

Protocol (docs/workers.md has the worker's view):
- the worker opens with Hello (pool, region, capacity, task types, attempts it is running: re-attach);
  we answer Welcome (our id, region, heartbeat timing, every planner for discovery) and, for a
  re-attach, Reattached with the attempts we accept (the ledger still shows that attempt in flight)
  and those we reject (a newer attempt exists or the execution ended: the worker must stop it);
- Credits are additive: each grants that many more assignments; we never send more than granted;
- Assignments are batched: one message carries as many as the worker has credits for;
- Results are recorded in the ledger by compare-and-swap (any planner may record any result) and
  acknowledged with their disposition; a worker re-sends unacknowledged results on its next stream;
- Drain lists assignments the worker received but will not start: we record them as transient
  failures so that they are retried (same execution id, next attempt);
- Cancel tells a worker to stop one attempt (overlap cancel_other, pause, cancel requests);
- Liveness: every message (heartbeats at least every `heartbeat_interval`) refreshes the connection's
  last-seen time; a watchdog ends a stream silent for `heartbeat_timeout`. The attempts of an ended
  stream are orphaned: unless a connection re-attaches one within `heartbeat_timeout` (Hello.running,
  or a heartbeat listing an attempt of a partition this node owns), `on_lost_attempts` hands it to the
  owner's planner, which times it out (a CAS keyed on the attempt: a result recorded meanwhile wins).

Items wait in a fair queue (per tenant, capped per task type) until some worker of their pool has
credit; workers in this planner's region are served first.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from scheduler._gen.scheduler.v1 import cluster_pb2, execution_pb2
from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler.api.convert import fencing_token_pb, ms_to_duration, ms_to_timestamp
from scheduler.clock import Clock
from scheduler.dispatch.queue import FairQueue
from scheduler.dispatch.starts import StartRecorder
from scheduler.errors import NotFound, SchedError
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
from scheduler.ids import ExecutionId, FencingToken
from scheduler.store.etcd.ops import Op
from scheduler.store.kv import KV
from scheduler.store.ledger import Ledger

log = logging.getLogger(__name__)

_ERROR_CLASS = {
    execution_pb2.ERROR_CLASS_TRANSIENT: ErrorClass.TRANSIENT,
    execution_pb2.ERROR_CLASS_PERMANENT: ErrorClass.PERMANENT,
    execution_pb2.ERROR_CLASS_UNKNOWN: ErrorClass.UNKNOWN,
    execution_pb2.ERROR_CLASS_TIMEOUT: ErrorClass.TIMEOUT,
}
_DISPOSITION = {
    Disposition.RECORDED: wpb.RESULT_DISPOSITION_RECORDED,
    Disposition.DUPLICATE: wpb.RESULT_DISPOSITION_DUPLICATE,
    Disposition.STALE: wpb.RESULT_DISPOSITION_STALE,
}
_TRIGGER = {
    "scheduled": execution_pb2.TRIGGER_SCHEDULED, "manual": execution_pb2.TRIGGER_MANUAL,
    "rerun": execution_pb2.TRIGGER_RERUN, "backfill": execution_pb2.TRIGGER_BACKFILL,
    "replay": execution_pb2.TRIGGER_REPLAY,
}


@dataclass
class _Item:
    e: Execution
    payload: bytes
    token: FencingToken


@dataclass
class _Conn:
    worker_id: str
    pool: str
    region: str
    task_types: frozenset[str]
    out: asyncio.Queue[wpb.PlannerMessage | None]
    credits: int = 0
    last_seen: float = 0.0  # monotonic time of the last message (any message proves the worker alive)
    dead: bool = False  # the watchdog ended this stream (silent for heartbeat_timeout)
    running: dict[tuple[str, int], str] = field(default_factory=dict)  # (execution id, attempt) -> task type
    capacity: int = 0  # Hello.capacity, for cluster status


Recorder = Callable[..., Awaitable[tuple[Execution, Disposition]]]
AttemptKey = tuple[str, int]  # (execution id, attempt)


class Dispatcher:
    """DispatchSink for the planner loops and the WorkerService servicer, in one object
    (registered with worker_service_pb2_grpc.add_WorkerServiceServicer_to_server)."""

    def __init__(
        self,
        *,
        node_id: str,
        region: str,
        kv: KV,
        ledger: Ledger,
        clock: Clock,
        record: Recorder,
        planners: Callable[[], list[cluster_pb2.PlannerInfo]],
        on_transition: Callable[[Execution], None] = lambda e: None,
        lookup: Callable[[str], Execution | None] = lambda eid: None,
        on_capacity: Callable[[], None] = lambda: None,
        on_lost_attempts: Callable[[list[AttemptKey]], None] = lambda keys: None,
        on_started: Callable[[Execution], None] = lambda e: None,
        start_notice: Callable[[str, int], Sequence[Op]] = lambda sid, planned_ms: (),
        heartbeat_interval: float = 1.0,
        heartbeat_timeout: float = 5.0,
        type_caps: dict[str, int] | None = None,
        tenant_weights: dict[str, int] | None = None,
    ) -> None:
        self.node_id, self.region, self.kv, self.ledger, self.clock = node_id, region, kv, ledger, clock
        self._record, self._planners, self._on_transition = record, planners, on_transition
        self._lookup = lookup
        self._on_capacity = on_capacity  # new credits: wake planner loops waiting for capacity
        self.hb_interval, self.hb_timeout = heartbeat_interval, heartbeat_timeout
        self._on_lost = on_lost_attempts
        # Attempts of ended streams -> monotonic time they are given up unless re-attached first.
        self.orphans: dict[AttemptKey, float] = {}
        self._watchdog: asyncio.Task[None] | None = None
        self.streams_declared_dead = 0
        self.attempts_lost = 0
        self.queue: FairQueue[_Item] = FairQueue(tenant_weights, type_caps)
        self.conns: dict[int, _Conn] = {}
        self._ids = itertools.count()
        self._tasks: set[asyncio.Task[None]] = set()
        self.sent = 0
        self.results = 0
        # Results read from every stream wait here while earlier ones are being recorded: the stream
        # readers never block on etcd, and results arriving together share one txn.
        self._inbox: list[tuple[_Conn, list[wpb.Result]]] = []
        self._recorder: asyncio.Task[None] | None = None
        self._pump_pending = False
        self._reserved: dict[str, int] = {}  # capacity held by partition loops committing dispatches
        # Start confirmation (dispatch/starts.py): Started requests from any stream, recorded in batches.
        self._on_started, self._start_notice = on_started, start_notice
        self._starts: StartRecorder | None = None

    @property
    def starts(self) -> StartRecorder:
        if self._starts is None:  # made on first use: unit tests build a Dispatcher without a ledger
            self._starts = StartRecorder(kv=self.kv, ledger=self.ledger, ks=self.ledger.ks,
                                         partitions=self.ledger.partitions, clock=self.clock, lookup=self._lookup,
                                         on_started=self._on_started, notice_for=self._start_notice)
        return self._starts

    # ---- DispatchSink (called by partition planners) --------------------------------------------------

    def capacity(self, pool: str) -> int:
        credit = sum(c.credits for c in self.conns.values() if c.pool == pool)
        return max(0, credit - self.queue.depth(pool) - self._reserved.get(pool, 0))

    def reserve(self, pool: str, n: int) -> None:
        self._reserved[pool] = self._reserved.get(pool, 0) + n

    def release(self, pool: str, n: int) -> None:
        left = self._reserved.get(pool, 0) - n
        if left > 0:
            self._reserved[pool] = left
        else:
            self._reserved.pop(pool, None)

    def submit(self, e: Execution, payload: bytes, token: FencingToken) -> None:
        self.queue.put(e.pool, e.tenant, e.task_type, _Item(e, payload, token))
        # Pumped at the end of this loop iteration, so a round's dispatches share one Assignments message.
        if not self._pump_pending:
            self._pump_pending = True
            asyncio.get_running_loop().call_soon(self._pump)

    def cancel(self, e: Execution, reason: str) -> None:
        self.cancel_attempt(e.id, e.attempt, reason)

    def cancel_attempt(self, execution_id: str, attempt: int, reason: str) -> None:
        """Drop the attempt if still queued here; tell its worker to stop if it runs on one of our streams."""
        self.queue.remove(lambda it: it.e.id == execution_id)
        for c in self.conns.values():
            if (execution_id, attempt) in c.running:
                c.out.put_nowait(wpb.PlannerMessage(cancel=wpb.Cancel(
                    execution_id=execution_id, attempt=attempt, reason=wpb.CANCEL_REASON_OVERLAP
                    if reason == "overlap" else wpb.CANCEL_REASON_REQUESTED, message=reason)))

    # ---- sending ----------------------------------------------------------------------------------

    def _assignment(self, it: _Item) -> wpb.Assignment:
        e = it.e
        cur = e.current
        return wpb.Assignment(
            execution_id=e.id, schedule_id=e.schedule_id, tenant=e.tenant, task_type=e.task_type,
            planned_at=ms_to_timestamp(e.planned_ms), attempt=e.attempt,
            fencing_token=fencing_token_pb(it.token),
            payload=it.payload, deadline=ms_to_timestamp(cur.deadline_ms if cur else 0),
            trigger=_TRIGGER[e.current_trigger.value],
            timeout=ms_to_duration(e.timeout_ms),
            start_timeout=ms_to_duration(cur.start_by_ms - cur.dispatched_ms) if cur and cur.start_by_ms else None,
        )

    def _pump(self) -> None:
        self._pump_pending = False
        if not len(self.queue):
            return
        conns = sorted(self.conns.values(), key=lambda c: c.region != self.region)  # own region first
        for c in conns:
            batch: list[wpb.Assignment] = []
            while c.credits > 0:
                it = self.queue.take(c.pool, accepts=lambda t, c=c: not c.task_types or t in c.task_types)  # type: ignore[misc]
                if it is None:
                    break
                c.credits -= 1
                c.running[(it.e.id, it.e.attempt)] = it.e.task_type
                batch.append(self._assignment(it))
            if batch:
                self.sent += len(batch)
                c.out.put_nowait(wpb.PlannerMessage(assignments=wpb.Assignments(assignments=batch)))
            if not len(self.queue):
                return

    # ---- receiving --------------------------------------------------------------------------------------

    def _outcome(self, r: wpb.Result) -> tuple[bool, ErrorClass | None]:
        ok = r.outcome == execution_pb2.ATTEMPT_OUTCOME_SUCCEEDED
        ec = None if ok else _ERROR_CLASS.get(r.error_class, ErrorClass.UNKNOWN)
        if r.outcome == execution_pb2.ATTEMPT_OUTCOME_TIMED_OUT:
            ec = ErrorClass.TIMEOUT
        return ok, ec

    @staticmethod
    def _details(r: wpb.Result) -> dict[str, Any]:
        """What a result says beyond its outcome, for `execution.result`: when the handler started, whether
        it never ran, whether a Cancel stopped it, and the executor's output."""
        return {"started_ms": r.started_at.ToMilliseconds() if r.HasField("started_at") else 0,
                "not_started": r.not_started, "cancelled": r.outcome == execution_pb2.ATTEMPT_OUTCOME_CANCELLED,
                "output": (r.stdout_tail, r.stderr_tail, r.exit_code if r.HasField("exit_code") else None)
                if r.stdout_tail or r.stderr_tail or r.HasField("exit_code") else None}

    _MAX_CAS_PER_TXN = 120  # under etcd's default --max-txn-ops (128)

    async def _fast_path(
        self, results: list[wpb.Result], worker_of: Callable[[wpb.Result], str]
    ) -> tuple[list[wpb.ResultAckEntry], list[wpb.Result]]:
        """Results for executions this node owns and holds in memory: one txn of CASes for all of
        them, no reads. Whatever does not apply cleanly goes to the slow path (read, decide, CAS).
        `worker_of` names the worker that reported a result: recorded in its attempt, in the same CAS."""
        now = self.clock.wall_ms()
        cands: list[tuple[wpb.Result, Execution, Execution]] = []
        slow: list[wpb.Result] = []
        for r in results:
            old = self._lookup(r.execution_id)
            if old is None or old.attempt != r.attempt or old.state not in IN_FLIGHT:
                slow.append(r)
                continue
            ok, ec = self._outcome(r)
            new, disp = result(old, r.attempt, succeeded=ok, error_class=ec, message=r.message, now_ms=now,
                               retry_after_ms=int(r.retry_after.ToMilliseconds()), worker=worker_of(r),
                               **self._details(r))
            if disp is not Disposition.RECORDED or new.state is ExecState.DEAD_LETTER:
                slow.append(r)  # dead letters keep the payload: the slow path looks it up
                continue
            cands.append((r, old, new))
        acks: list[wpb.ResultAckEntry] = []
        n = self._MAX_CAS_PER_TXN
        chunks = [cands[i:i + n] for i in range(0, len(cands), n)]

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
                self._on_transition(with_revision(new, tr.revision))
                acks.append(wpb.ResultAckEntry(execution_id=r.execution_id, attempt=r.attempt,
                                               disposition=wpb.RESULT_DISPOSITION_RECORDED))

        if len(chunks) == 1:
            await commit(chunks[0])
        elif chunks:
            await asyncio.gather(*(commit(c) for c in chunks))
        return acks, slow

    def _finished(self, c: _Conn, results: list[wpb.Result]) -> None:
        for r in results:
            task_type = c.running.pop((r.execution_id, r.attempt), None)
            if task_type is not None:
                self.queue.finished(task_type)

    def _enqueue_results(self, c: _Conn, results: list[wpb.Result]) -> None:
        """Hand results to the recorder task and return at once. Acks still go out only after the
        results are recorded."""
        self._finished(c, results)
        self._inbox.append((c, results))
        if self._recorder is None or self._recorder.done():
            self._recorder = asyncio.create_task(self._record_inbox())
            self._tasks.add(self._recorder)
            self._recorder.add_done_callback(self._tasks.discard)

    _RESULT_LINGER = 0.005  # seconds a small batch of results waits for more to share its txn

    async def _record_inbox(self) -> None:
        while self._inbox:
            if sum(len(rs) for _, rs in self._inbox) < self._MAX_CAS_PER_TXN:
                await asyncio.sleep(self._RESULT_LINGER)
            # At most a few txns' worth per turn: the rest waits for the next turn of the loop.
            batch, n = [], 0
            while self._inbox and n < 8 * self._MAX_CAS_PER_TXN:
                item = self._inbox.pop(0)
                batch.append(item)
                n += len(item[1])
            results = [r for _, rs in batch for r in rs]
            owner = {(r.execution_id, r.attempt): c for c, rs in batch for r in rs}
            try:
                acks, slow = await self._fast_path(
                    results, lambda r, owner=owner: owner[(r.execution_id, r.attempt)].worker_id)  # type: ignore[misc]
                self.results += len(acks)
                by_conn: dict[int, tuple[_Conn, list[wpb.ResultAckEntry]]] = {}
                for a in acks:
                    c = owner[(a.execution_id, a.attempt)]
                    by_conn.setdefault(id(c), (c, []))[1].append(a)
                for c, rs in batch:
                    mine = {(r.execution_id, r.attempt) for r in rs}
                    await self._record_slow(c, [r for r in slow if (r.execution_id, r.attempt) in mine],
                                            by_conn.pop(id(c), (c, []))[1])
                for c, conn_acks in by_conn.values():
                    await self._record_slow(c, [], conn_acks)
            except Exception:  # not acknowledged: the workers send them again
                log.exception("recording results failed")
            self._pump()

    async def _handle_results(self, c: _Conn, results: list[wpb.Result]) -> None:
        self._finished(c, results)
        acks, slow = await self._fast_path(results, lambda r: c.worker_id)
        self.results += len(acks)
        await self._record_slow(c, slow, acks)
        self._pump()

    _SLOW_CONCURRENCY = 32  # slow-path results recorded at once (each is a read and a CAS)

    async def _record_slow(self, c: _Conn, slow: list[wpb.Result], acks: list[wpb.ResultAckEntry]) -> None:
        """Results the fast path could not apply (not in this node's memory: after a restart or an
        ownership move; dead letters; lost CASes) are read and recorded one by one, but many at a
        time: after a partition reload thousands arrive together, and a sequential read + CAS each
        would leave them unacknowledged for minutes."""
        gate = asyncio.Semaphore(self._SLOW_CONCURRENCY)

        async def one(r: wpb.Result) -> wpb.ResultAckEntry | None:
            async with gate:
                try:
                    eid = ExecutionId.parse(r.execution_id)
                    ok, ec = self._outcome(r)
                    e, disp = await self._record(
                        eid.schedule_id, eid.planned_ms, r.attempt, succeeded=ok, error_class=ec, message=r.message,
                        now_ms=self.clock.wall_ms(), retry_after_ms=int(r.retry_after.ToMilliseconds()),
                        worker=c.worker_id, **self._details(r),
                    )
                except (NotFound, SchedError) as err:
                    log.warning("result not recorded: %s", err, extra={"execution_id": r.execution_id})
                    return None  # not acknowledged: the worker sends it again, maybe to another planner
            self.results += 1
            if disp is Disposition.RECORDED:
                self._on_transition(e)  # which logs it
            elif log.isEnabledFor(logging.DEBUG):
                log.debug("result not applied", extra={"event": "result_ignored", "disposition": disp.value,
                                                       **log_fields(e), "attempt": r.attempt})
            return wpb.ResultAckEntry(execution_id=r.execution_id, attempt=r.attempt, disposition=_DISPOSITION[disp])

        done = [await one(slow[0])] if len(slow) == 1 else list(await asyncio.gather(*(one(r) for r in slow)))
        acks.extend(a for a in done if a is not None)
        if acks:
            c.out.put_nowait(wpb.PlannerMessage(result_ack=wpb.ResultAck(acks=acks)))

    async def _reattach(self, c: _Conn, running: list[wpb.RunningAttempt]) -> None:
        accepted, rejected = [], []
        for ra in running:
            try:
                eid = ExecutionId.parse(ra.execution_id)
                e = await self.ledger.get(self.kv, eid.schedule_id, eid.planned_ms)
            except SchedError:
                e = None
            if e is not None and e.attempt == ra.attempt and e.state in IN_FLIGHT:
                c.running[(ra.execution_id, ra.attempt)] = e.task_type
                self.orphans.pop((ra.execution_id, ra.attempt), None)  # its worker is back in time
                accepted.append(wpb.AttemptRef(execution_id=ra.execution_id, attempt=ra.attempt))
            else:
                why = "unknown execution" if e is None else f"execution is {e.state.value} at attempt {e.attempt}"
                rejected.append(wpb.RejectedAttempt(execution_id=ra.execution_id, attempt=ra.attempt, reason=why))
        c.out.put_nowait(wpb.PlannerMessage(reattached=wpb.Reattached(accepted=accepted, rejected=rejected)))

    def _adopt(self, c: _Conn, running: Sequence[wpb.RunningAttempt]) -> None:
        """A heartbeat lists attempts this stream does not track: those of partitions this node owns,
        still in flight at the same attempt in the owner's memory, are taken over (answered Reattached),
        so that a planner taking over a partition re-attaches its running attempts without a ledger read
        and they are not orphaned. Attempts of other partitions are another planner's to answer."""
        accepted = []
        for ra in running:
            key = (ra.execution_id, ra.attempt)
            if key in c.running:
                continue
            e = self._lookup(ra.execution_id)
            if e is None or e.attempt != ra.attempt or e.state not in IN_FLIGHT:
                continue
            c.running[key] = e.task_type
            self.orphans.pop(key, None)
            accepted.append(wpb.AttemptRef(execution_id=ra.execution_id, attempt=ra.attempt))
        if accepted:
            log.info("running attempts re-attached from a heartbeat",
                     extra={"event": "reattached", "worker": c.worker_id, "count": len(accepted)})
            c.out.put_nowait(wpb.PlannerMessage(reattached=wpb.Reattached(accepted=accepted)))

    # ---- liveness ---------------------------------------------------------------------------------------

    def check_liveness(self, now: float) -> None:
        """One watchdog tick (monotonic `now`): end streams silent for longer than the heartbeat timeout,
        and give up orphaned attempts nobody re-attached in time. O(streams + orphans), never per result."""
        for c in self.conns.values():
            if not c.dead and now - c.last_seen > self.hb_timeout:
                c.dead = True
                self.streams_declared_dead += 1
                log.warning("worker stopped heartbeating; ending its stream",
                            extra={"event": "worker_silent", "worker": c.worker_id,
                                   "silent_s": round(now - c.last_seen, 3), "running": len(c.running)})
                c.out.put_nowait(None)  # Connect returns; its finally orphans what the worker was running
        if not self.orphans:
            return
        due = [k for k, t in self.orphans.items() if t <= now]
        if due:
            for k in due:
                del self.orphans[k]
            self.attempts_lost += len(due)
            log.warning("attempts orphaned by a lost worker stream were not re-attached in time",
                        extra={"event": "attempts_lost", "count": len(due)})
            self._on_lost(due)

    def _orphan(self, c: _Conn) -> None:
        """The stream ended: what it was running may still run (a reconnect re-attaches it) or not."""
        give_up = self.clock.monotonic() + self.hb_timeout
        others = [o.running for o in self.conns.values() if o is not c]
        for key, task_type in c.running.items():
            self.queue.finished(task_type)
            if not any(key in r for r in others):  # else another stream already re-attached it
                self.orphans[key] = give_up
        c.running.clear()

    async def _watch(self) -> None:
        period = max(0.01, min(self.hb_interval, self.hb_timeout / 4))
        while True:
            await asyncio.sleep(period)
            try:
                self.check_liveness(self.clock.monotonic())
            except Exception:  # the watchdog must outlive a bug in one tick
                log.exception("liveness check failed")

    def _start_watchdog(self) -> None:
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = asyncio.create_task(self._watch(), name="dispatch-watchdog")
            self._tasks.add(self._watchdog)
            self._watchdog.add_done_callback(self._tasks.discard)

    async def _returned(self, c: _Conn, refs: list[wpb.AttemptRef]) -> None:
        """Assignments a draining worker hands back unstarted: retried elsewhere, same id."""
        results = [wpb.Result(execution_id=r.execution_id, attempt=r.attempt,
                              outcome=execution_pb2.ATTEMPT_OUTCOME_FAILED,
                              error_class=execution_pb2.ERROR_CLASS_TRANSIENT, message="returned by a draining worker",
                              not_started=True)
                   for r in refs]
        await self._handle_results(c, results)

    async def _read(self, c: _Conn, it: AsyncIterator[wpb.WorkerMessage]) -> None:
        async for msg in it:
            c.last_seen = self.clock.monotonic()
            kind = msg.WhichOneof("body")
            if kind == "credits":
                c.credits += msg.credits.credits
                self._pump()
                if self.capacity(c.pool) > 0:
                    self._on_capacity()
            elif kind == "results":
                self._enqueue_results(c, list(msg.results.results))
            elif kind == "started":
                self.starts.enqueue(c.worker_id, list(msg.started.starts), lambda acks, c=c: c.out.put_nowait(  # type: ignore[misc]
                    wpb.PlannerMessage(start_ack=wpb.StartAck(acks=acks))))
            elif kind == "heartbeat":
                if msg.heartbeat.running:  # once per heartbeat interval, a dict lookup per running attempt
                    self._adopt(c, msg.heartbeat.running)
            elif kind == "drain":
                c.credits = 0
                await self._returned(c, list(msg.drain.returned))

    # ---- the RPCs --------------------------------------------------------------------------------------

    async def Connect(
        self, request_iterator: AsyncIterator[wpb.WorkerMessage], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[wpb.PlannerMessage]:
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("body") != "hello":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "hello: the first message must be a Hello")
            return
        h = first.hello
        if not h.worker_id or not h.pool:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "hello.worker_id and hello.pool are required")
            return
        conn_id = next(self._ids)
        c = _Conn(h.worker_id, h.pool, h.region, frozenset(h.task_types), asyncio.Queue(),
                  last_seen=self.clock.monotonic(), capacity=h.capacity)
        self.conns[conn_id] = c
        self._start_watchdog()
        log.info("worker connected", extra={"event": "worker_connected", "worker": h.worker_id, "pool": h.pool})
        yield wpb.PlannerMessage(welcome=wpb.Welcome(
            planner_id=self.node_id, region=self.region, server_time=ms_to_timestamp(self.clock.wall_ms()),
            planners=self._planners(), heartbeat_interval=ms_to_duration(int(self.hb_interval * 1000)),
            heartbeat_timeout=ms_to_duration(int(self.hb_timeout * 1000))))
        if h.running:
            await self._reattach(c, list(h.running))
            c.last_seen = self.clock.monotonic()  # its reads took our time, not the worker's silence
        reader = asyncio.create_task(self._read(c, request_iterator))
        reader.add_done_callback(lambda _t: c.out.put_nowait(None))
        try:
            while (msg := await c.out.get()) is not None:
                yield msg
        finally:
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader
            del self.conns[conn_id]
            # Attempts it was running stay in flight in the ledger; a result (possibly via another planner
            # after a reconnect) or a re-attach within the heartbeat timeout keeps them, else they time out.
            self._orphan(c)
            log.info("worker disconnected", extra={"event": "worker_disconnected", "worker": h.worker_id,
                                                   "declared_dead": c.dead})

    async def DiscoverPlanners(
        self, request: wpb.DiscoverPlannersRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> wpb.DiscoverPlannersResponse:
        ps = self._planners()
        if request.region:
            ps = [p for p in ps if p.region == request.region]
        return wpb.DiscoverPlannersResponse(planners=ps)

    def connected_workers(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.conns.values():
            out[c.pool] = out.get(c.pool, 0) + 1
        return out
