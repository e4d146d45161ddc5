"""The planner side of `WorkerService`: one bidirectional stream per connected worker.

Protocol (docs/workers.md has the worker's view):
- the worker opens with Hello (pool, region, capacity, task types, attempts it is running: re-attach);
  we answer Welcome (our id, region, heartbeat timing, every planner for discovery) and, for a
  re-attach, Reattached with the attempts we accept (the ledger still shows that attempt in flight)
  and those we reject (a newer attempt exists or the execution ended: the worker must stop it);
- Credits are additive: each grants that many more assignments; we never send more than granted;
- Assignments are batched: one message carries as many as the worker has credits for;
- Results are recorded in the ledger by compare-and-swap (any planner may record any result) and
  acknowledged with their disposition (dispatch/results.py); a worker re-sends unacknowledged results
  on its next stream;
- Started asks for an attempt's start to be recorded before its handler runs (dispatch/starts.py);
- Drain lists assignments the worker received but will not start: we record them as transient
  failures so that they are retried (same execution id, next attempt);
- Cancel tells a worker to stop one attempt (overlap cancel_other, pause, cancel requests);
- Liveness (dispatch/liveness.py): every message (heartbeats at least every `heartbeat_interval`)
  refreshes the stream's last-seen time; a watchdog ends a stream silent for `heartbeat_timeout`. The
  attempts of an ended stream are orphaned: unless a stream re-attaches one within `heartbeat_timeout`
  (Hello.running, or a heartbeat listing an attempt of a partition this node owns), `on_lost_attempts`
  hands it to the owner's planner, which times it out (a CAS keyed on the attempt: a result recorded
  meanwhile wins).

With auth on, a stream may report only on executions of its own pool (checked on Hello) and of tenants
that pool serves: every result, start, re-attach and hand-back naming another is refused, logged and not
written (dispatch/scope.py).

This module is the stream service itself and assignment pumping: it feeds results, starts and liveness
events to the modules named above and sends their answers back. Items wait in a fair queue (per tenant,
capped per task type) until some worker of their pool has credit; workers of the planning region are
served first, and the region policy's worker affinity per pool (dispatch/affinity.py) says whether, and
from when, other regions' workers may take the pool's executions.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from scheduler._gen.scheduler.v1 import cluster_pb2, execution_pb2
from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler.api.convert import fencing_token_pb
from scheduler.auth.access import OPEN, Authz
from scheduler.auth.current import current
from scheduler.auth.principal import Role
from scheduler.clock import Clock
from scheduler.dispatch.affinity import AffinityGate
from scheduler.dispatch.conn import ASSIGNMENT_OVERHEAD, AttemptKey, Conn, outgoing
from scheduler.dispatch.duplicate import DuplicateDelivery
from scheduler.dispatch.liveness import Liveness
from scheduler.dispatch.queue import FairQueue
from scheduler.dispatch.results import NoticeFor, PayloadLookup, ResultRecorder, ResultReport
from scheduler.dispatch.scope import Scope
from scheduler.dispatch.start_window import StartWindow
from scheduler.dispatch.starts import StartRecorder
from scheduler.dispatch.vouch import Vouches
from scheduler.execution import Execution
from scheduler.ids import FencingToken
from scheduler.outqueue import MAX_JOINED_BYTES
from scheduler.region.affinity import AffinityPolicy, Mode
from scheduler.region.policy import RegionPolicy
from scheduler.store.kv import KV
from scheduler.store.ledger import Ledger
from scheduler.timeconv import ms_to_duration, ms_to_timestamp

log = logging.getLogger(__name__)

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
        planners: Callable[[], list[cluster_pb2.PlannerInfo]],
        on_transition: Callable[[Execution], None] = lambda e: None,
        lookup: Callable[[str], Execution | None] = lambda eid: None,
        on_capacity: Callable[[], None] = lambda: None,
        on_lost_attempts: Callable[[list[AttemptKey]], None] = lambda keys: None,
        on_started: Callable[[Execution], None] = lambda e: None,
        on_worker: Callable[[], None] = lambda: None,
        notice_for: NoticeFor = lambda sid, planned_ms: (),
        owns: Callable[[str], bool] | None = None,
        payload_of: PayloadLookup | None = None,
        rpc_timeout: float | None = None,
        heartbeat_interval: float = 1.0,
        heartbeat_timeout: float = 5.0,
        type_caps: dict[str, int] | None = None,
        tenant_weights: dict[str, int] | None = None,
        duplicate_file: str = "",
        authz: Authz = OPEN,
        start_window: int = 0,
    ) -> None:
        self.node_id, self.region, self.kv, self.ledger, self.clock = node_id, region, kv, ledger, clock
        # Which principal may serve which pool (checked on Hello), and which tenants a pool may run
        # (checked on every submit: enforced here, never trusted to the worker).
        self.authz = authz
        self.refused_tenant = 0  # executions not sent because their pool does not serve their tenant
        self._planners, self._on_transition = planners, on_transition
        self._lookup = lookup
        self._on_capacity = on_capacity  # new credits: wake planner loops waiting for capacity
        self.hb_interval, self.hb_timeout = heartbeat_interval, heartbeat_timeout
        self.queue: FairQueue[_Item] = FairQueue(tenant_weights, type_caps)
        self.conns: dict[int, Conn] = {}
        self._ids = itertools.count()
        # The heartbeat lease over these streams: silent ones ended, their attempts orphaned (dispatch/liveness.py).
        self.liveness = Liveness(conns=self.conns, clock=clock, kv=kv, ledger=ledger, lookup=lookup,
                                 release=self.queue.finished, on_lost=on_lost_attempts,
                                 heartbeat_interval=heartbeat_interval, heartbeat_timeout=heartbeat_timeout)
        self.sent = 0
        self.disarmed = 0  # armed attempts this planner told their worker not to start (start ahead)
        # Worker affinity per pool (region policy): who may take a pool's executions, and the count of
        # assignments sent outside the planning region (metrics: scheduler_dispatch_cross_region_...).
        self.affinity = AffinityGate(region, clock.monotonic)
        self.cross_region: dict[str, int] = {}
        self._retry: asyncio.TimerHandle | None = None
        self._retry_at = 0.0
        # Results from every stream, recorded in batches (dispatch/results.py); `notice_for` tells another
        # node's partition when a record of it changed here (results and starts alike).
        self.recorder = ResultRecorder(kv=kv, ledger=ledger, clock=clock, lookup=lookup, on_transition=on_transition,
                                       notice_for=notice_for, payload_of=payload_of, timeout=rpc_timeout,
                                       after_batch=self._pump)
        self._pump_pending = False
        self._reserved: dict[str, int] = {}  # capacity held by partition loops committing dispatches
        # Start confirmation (dispatch/starts.py): Started requests from any stream, recorded in batches.
        self._on_started, self._notice_for = on_started, notice_for
        self._on_worker = on_worker  # a worker stream was welcomed (the node publishes that it has workers)
        self._starts: StartRecorder | None = None
        # Runs of partitions this node no longer owns that their worker still lists here (dispatch/vouch.py);
        # `owns` (whether this node owns an execution id's partition) None: never vouch (tests without a node).
        self._owns, self._rpc_timeout = owns, rpc_timeout
        self._vouches: Vouches | None = None
        # Hand-outs waiting for their start, bounded per pool so that each is answered before its start-by
        # (dispatch/start_window.py); `start_window` > 0 fixes the size.
        self.window = StartWindow(clock, fixed=start_window)
        # pool -> its streams whose worker does not honour start_in (Hello.capabilities): no run of it is armed.
        self._no_start_in: dict[str, int] = {}
        # TEST ONLY (drill fault F9): re-send some assignments while a control file says so. None in
        # production: the setting that names the file is refused outside test mode (planner/settings.py).
        self.duplicate = DuplicateDelivery(duplicate_file, self._resend) if duplicate_file else None

    @property
    def starts(self) -> StartRecorder:
        if self._starts is None:  # made on first use: unit tests build a Dispatcher without a ledger
            self._starts = StartRecorder(kv=self.kv, ledger=self.ledger, ks=self.ledger.ks,
                                         partitions=self.ledger.partitions, clock=self.clock, lookup=self._lookup,
                                         on_started=self._on_started, notice_for=self._notice_for)
        return self._starts

    @property
    def vouches(self) -> Vouches | None:
        if self._vouches is None and self._owns is not None:
            self._vouches = Vouches(kv=self.kv, ks=self.ledger.ks, partitions=self.ledger.partitions, clock=self.clock,
                                    owns=self._owns, every=self.hb_timeout / 3, timeout=self._rpc_timeout)
        return self._vouches

    @property
    def results(self) -> int:
        """Results answered (acknowledged with any disposition)."""
        return self.recorder.results

    # ---- DispatchSink (called by partition planners) --------------------------------------------------

    def served(self, pool: str) -> bool:
        return any(c.pool == pool for c in self.conns.values())

    def capacity(self, pool: str) -> int:
        # Only streams the pool's affinity lets us use now: otherwise the planner loops would hand over
        # work that then waits here for a worker it may not go to.
        # A remote stream counts once some task type it runs may go to it (an estimate: the queued work
        # may be of another type; the pump decides per item).
        gate, credit = self.affinity, 0
        for c in self.conns.values():
            if c.pool != pool or c.credits <= 0:
                continue
            if c.region == gate.planning_region:
                credit += c.credits
            else:
                left = gate.stream_wait_left(pool, c.task_types)
                if left == 0.0:
                    credit += c.credits
                elif left != float("inf"):
                    self._retry_later(left)  # prefer: this credit becomes usable then; wake the loops
        # The start window (its hand-outs waiting for their start) counts what is queued here already.
        return max(0, min(credit - self.queue.depth(pool), self.window.room(pool)) - self._reserved.get(pool, 0))

    # ---- worker affinity (region policy) ---------------------------------------------------------------

    def set_region_policy(self, policy: RegionPolicy | None) -> None:
        """The region guard's latest policy: the planning region and the affinity rules, precomputed."""
        self.affinity.configure(policy.primary if policy else None, policy.affinity if policy else AffinityPolicy())
        with contextlib.suppress(RuntimeError):  # no running loop (unit tests): the next pump sees it
            asyncio.get_running_loop().call_soon(self._retry_fire)

    def _retry_later(self, delay: float) -> None:
        """Pump again (and wake starved planner loops) in `delay` s, when a prefer pool may go abroad."""
        at = self.clock.monotonic() + delay
        if self._retry is not None and self._retry_at <= at:
            return
        if self._retry is not None:
            self._retry.cancel()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a unit test calling capacity()): nothing to wake
            return
        self._retry_at = at
        self._retry = loop.call_later(delay + 0.01, self._retry_fire)

    def _retry_fire(self) -> None:
        self._retry = None
        self._pump()
        self._on_capacity()

    def _local_credit(self, c: Conn) -> None:
        if c.credits > 0 and c.region == self.affinity.planning_region:
            self.affinity.local_credit(c.pool, c.task_types)

    def _may_go_abroad(self, pool: str, task_type: str) -> bool:
        """For a remote `prefer` stream: may an execution of `task_type` go to it now? If not yet, pump
        again when it may (a local worker that runs the type may still take it meanwhile)."""
        left = self.affinity.wait_left(pool, task_type)
        if left == 0.0:
            return True
        if left != float("inf"):
            self._retry_later(left)
        return False

    def reserve(self, pool: str, n: int) -> None:
        self._reserved[pool] = self._reserved.get(pool, 0) + n

    def release(self, pool: str, n: int) -> None:
        left = self._reserved.get(pool, 0) - n
        if left > 0:
            self._reserved[pool] = left
        else:
            self._reserved.pop(pool, None)

    def expect(self, attempts: Sequence[tuple[str, int]]) -> None:
        self.liveness.expect(attempts)

    def submit(self, e: Execution, payload: bytes, token: FencingToken) -> None:
        allowed = self.authz.pools.get(e.pool)
        if allowed is not None and e.tenant not in allowed:
            self._refuse_tenant(e, token)
            return
        self.queue.put(e.pool, e.tenant, e.task_type, _Item(e, payload, token))
        cur = e.current
        if cur is not None and cur.start_by_ms:
            self.window.add((e.id, e.attempt), e.pool, max(0, cur.start_by_ms - self.clock.wall_ms()) / 1000)
        # Pumped at the end of this loop iteration, so a round's dispatches share one Assignments message.
        if not self._pump_pending:
            self._pump_pending = True
            asyncio.get_running_loop().call_soon(self._pump)

    def _refuse_tenant(self, e: Execution, token: FencingToken) -> None:
        """An execution of a tenant its pool does not serve (a schedule stored before the pool was restricted:
        create and update refuse it now) never reaches the pool's workers. Its attempt is recorded as a
        permanent failure, as a worker's result would be, so it ends in the dead-letter list with the reason
        instead of being dispatched again and again; replay it after moving the schedule to a pool that
        serves its tenant."""
        self.refused_tenant += 1
        why = f"pool {e.pool!r} does not serve tenant {e.tenant!r} (auth file [pools]): not sent to its workers"
        log.error("execution not sent: its pool does not serve its tenant", extra={
            "event": "dispatch_refused_tenant", "execution_id": e.id, "pool": e.pool, "tenant": e.tenant})
        self.recorder.enqueue(self, f"planner:{self.node_id}", [wpb.Result(
            execution_id=e.id, attempt=e.attempt, fencing_token=fencing_token_pb(token),
            outcome=execution_pb2.ATTEMPT_OUTCOME_FAILED, error_class=execution_pb2.ERROR_CLASS_PERMANENT,
            message=why)], lambda report: None)

    def cancel(self, e: Execution, reason: str) -> None:
        self.cancel_attempt(e.id, e.attempt, reason)

    def cancel_attempt(self, execution_id: str, attempt: int, reason: str) -> None:
        """Drop the attempt if still queued here; tell its worker to stop if it runs on one of our streams."""
        self.queue.remove(lambda it: it.e.id == execution_id)
        self.window.drop([(execution_id, attempt)])
        for c in self.conns.values():
            if (execution_id, attempt) in c.running:
                c.out.put_nowait(wpb.PlannerMessage(cancel=wpb.Cancel(
                    execution_id=execution_id, attempt=attempt, reason=wpb.CANCEL_REASON_OVERLAP
                    if reason == "overlap" else wpb.CANCEL_REASON_REQUESTED, message=reason)))

    def may_arm(self, pool: str) -> bool:
        return pool not in self._no_start_in  # asked per armable run: counted on connect and disconnect

    def _on_time(self, it: _Item) -> bool:
        """For a stream whose worker does not honour `start_in`: only runs due now. A run handed out early waits
        for a worker that does, or for its due time (pumped again then), and is sent without `start_in`."""
        cur = it.e.current
        if cur is None or cur.dispatched_ms >= it.e.due_ms:
            return True
        left = it.e.due_ms - self.clock.wall_ms()
        if left <= 0:
            return True
        self._retry_later(left / 1000)
        return False

    def disarm(self, e: Execution) -> None:
        """Start ahead: the worker holding e's armed attempt is not to start it (wpb.Disarm); dropped here if it
        is still queued. Sent to every stream that holds it and every stream of the worker whose start was
        recorded (an owner that took the partition over holds it on no stream of its own until a heartbeat
        lists it). Nothing is written: the worker's not-started result is the write; a worker that has begun
        it ignores this."""
        self.queue.remove(lambda it: it.e.id == e.id)
        cur = e.current
        key = (e.id, e.attempt)
        self.window.drop([key])
        msg = wpb.PlannerMessage(disarm=wpb.Disarm(attempts=[wpb.AttemptRef(execution_id=e.id, attempt=e.attempt)]))
        for c in self.conns.values():
            if key in c.running or (cur is not None and cur.worker and c.worker_id == cur.worker):
                c.out.put_nowait(msg)
        self.disarmed += 1

    # ---- sending ----------------------------------------------------------------------------------

    def _assignment(self, it: _Item) -> wpb.Assignment:
        e = it.e
        cur = e.current
        # Start ahead: handed out before it is due; the worker runs it that much later (0: at once).
        ahead = e.due_ms - self.clock.wall_ms() if cur is not None and cur.dispatched_ms < e.due_ms else 0
        return wpb.Assignment(
            execution_id=e.id, schedule_id=e.schedule_id, tenant=e.tenant, task_type=e.task_type,
            planned_at=ms_to_timestamp(e.planned_ms), attempt=e.attempt,
            fencing_token=fencing_token_pb(it.token),
            payload=it.payload, deadline=ms_to_timestamp(cur.deadline_ms if cur else 0),
            trigger=_TRIGGER[e.current_trigger.value],
            timeout=ms_to_duration(e.timeout_ms),
            start_timeout=ms_to_duration(cur.start_by_ms - cur.dispatched_ms) if cur and cur.start_by_ms else None,
            start_in=ms_to_duration(ahead) if ahead > 0 else None,
        )

    def _pump(self) -> None:
        self._pump_pending = False
        if not len(self.queue):
            return
        gate = self.affinity
        home = gate.planning_region
        conns = sorted(self.conns.values(), key=lambda c: c.region != home)  # the planning region first
        for c in conns:
            if c.credits <= 0:
                continue
            accepts: Callable[[str], bool] = c.runs
            if c.region == home:
                gate.local_credit(c.pool, c.task_types)  # it has credit now: work it runs stays home
            else:
                mode = gate.rule(c.pool)[0]
                if mode is Mode.STRICT:
                    continue
                if mode is Mode.PREFER:
                    # Judged per item: whether a local stream running *its* task type had credit lately.
                    accepts = lambda t, c=c: c.runs(t) and self._may_go_abroad(c.pool, t)  # type: ignore[misc]  # noqa: E731
            batch: list[wpb.Assignment] = []
            size = 0
            item_ok = None if c.start_in else self._on_time
            while c.credits > 0:
                it = self.queue.take(c.pool, accepts=accepts, item_ok=item_ok)
                if it is None:
                    break
                c.credits -= 1
                a = self._assignment(it)
                start_wait = a.start_timeout.ToMilliseconds() / 1000 if a.HasField("start_timeout") else 0.0
                self.liveness.hold(c, (it.e.id, it.e.attempt), it.e.task_type, start_wait)
                self.window.sent((it.e.id, it.e.attempt))
                n = len(it.payload) + ASSIGNMENT_OVERHEAD
                if batch and size + n > MAX_JOINED_BYTES:
                    # Hundreds of 64 KiB payloads in one message passed gRPC's 4 MiB receive limit: the
                    # worker's stream broke on it, and again on each re-dispatch of the same runs.
                    self._send(c, batch, home)
                    batch, size = [], 0
                batch.append(a)
                size += n
            if batch:
                self._send(c, batch, home)
            if not len(self.queue):
                return

    def _send(self, c: Conn, batch: list[wpb.Assignment], home: str) -> None:
        self.sent += len(batch)
        if c.region != home:
            self.cross_region[c.pool] = self.cross_region.get(c.pool, 0) + len(batch)
        c.out.put_nowait(wpb.PlannerMessage(assignments=wpb.Assignments(assignments=batch)))
        if self.duplicate is not None:
            self.duplicate.sent(c, batch)

    def _resend(self, c: Conn, a: wpb.Assignment) -> bool:
        """TEST ONLY (F9): `a` once more on `c`, alone, if the stream is still up and has a credit for it.
        It takes the credit as any assignment does, so that the worker's book (it counts every assignment
        it receives, and frees the slot of one it ignores) and ours stay equal."""
        if not any(x is c for x in self.conns.values()) or c.credits <= 0:
            return False
        c.credits -= 1
        self.sent += 1
        c.out.put_nowait(wpb.PlannerMessage(assignments=wpb.Assignments(assignments=[a])))
        return True

    # ---- receiving --------------------------------------------------------------------------------------

    def _finished(self, c: Conn, results: list[wpb.Result]) -> None:
        keys = [(r.execution_id, r.attempt) for r in results]
        self.window.drop(keys)  # a start never asked for (handed back, not started): no answer will come
        self.liveness.forget(c, keys)

    def _send_acks(self, c: Conn, report: ResultReport) -> None:
        if report.acks:
            c.out.put_nowait(wpb.PlannerMessage(result_ack=wpb.ResultAck(acks=report.acks)))

    def _enqueue_results(self, c: Conn, results: list[wpb.Result]) -> None:
        """Hand results to the recorder (dispatch/results.py) and return at once. Acks still go out only
        after the results are recorded."""
        self._finished(c, results)
        self.recorder.enqueue(c, c.worker_id, results, lambda report, c=c: self._send_acks(c, report),  # type: ignore[misc]
                              c.scope)

    async def _handle_results(self, c: Conn, results: list[wpb.Result]) -> None:
        self._finished(c, results)
        self._send_acks(c, await self.recorder.record_now(c.worker_id, results, c.scope))
        self._pump()

    async def _returned(self, c: Conn, refs: list[wpb.AttemptRef]) -> None:
        """Assignments a draining worker hands back unstarted: retried elsewhere, same id."""
        results = [wpb.Result(execution_id=r.execution_id, attempt=r.attempt,
                              outcome=execution_pb2.ATTEMPT_OUTCOME_FAILED,
                              error_class=execution_pb2.ERROR_CLASS_TRANSIENT, message="returned by a draining worker",
                              not_started=True)
                   for r in refs]
        await self._handle_results(c, results)

    def _start_acks(self, c: Conn, acks: list[wpb.StartAckEntry]) -> None:
        """Answer a Started message. A refused start is never run by the worker, whatever happens to its
        not-started result (it may go to another planner): the stream lets go of it now."""
        for a in acks:
            if a.disposition == wpb.START_DISPOSITION_STARTED:
                self.liveness.started(c, (a.execution_id, a.attempt))
        self.liveness.forget(c, [(a.execution_id, a.attempt) for a in acks
                                 if a.disposition != wpb.START_DISPOSITION_STARTED])
        c.out.put_nowait(wpb.PlannerMessage(start_ack=wpb.StartAck(acks=acks)))
        if self.window.answered((a.execution_id, a.attempt) for a in acks):
            self._on_capacity()  # a window was full: partition loops waiting for room may hand out again

    async def _read(self, c: Conn, it: AsyncIterator[wpb.WorkerMessage]) -> None:
        async for msg in it:
            self.liveness.heard(c)
            kind = msg.WhichOneof("body")
            if kind == "credits":
                c.credits += msg.credits.credits
                self._local_credit(c)
                self._pump()
                if self.capacity(c.pool) > 0:
                    self._on_capacity()
            elif kind == "results":
                self._enqueue_results(c, list(msg.results.results))
            elif kind == "started":
                self.starts.enqueue(c.worker_id, list(msg.started.starts),
                                    lambda acks, c=c: self._start_acks(c, acks), c.scope)  # type: ignore[misc]
            elif kind == "heartbeat":
                hb = msg.heartbeat
                self.liveness.heartbeat(c, hb.running, hb.unacked if hb.lists_unacked else None, hb.probe_echo)
                # Answered, so that the worker hears from us once a heartbeat interval (Welcome.acks_heartbeats).
                c.out.put_nowait(wpb.PlannerMessage(heartbeat_ack=wpb.HeartbeatAck(seq=hb.seq)))
                if (vouches := self.vouches) is not None:
                    vouches.heard(c.worker_id, hb.running, c.running)
            elif kind == "drain":
                self._local_credit(c)  # it had credit until now
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
        scope: Scope | None = None
        if self.authz.enabled:
            p = current()
            if p is None or not p.may(Role.WORKER, h.pool):
                who = p.name if p else "an unauthenticated caller"
                await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                    f"hello.pool: {who} may not serve pool {h.pool!r} (it needs {h.pool}:worker)")
                return
            # Everything this stream reports later is checked against it (dispatch/scope.py).
            scope = Scope.of(p.name, h.pool, self.authz.pools)
        caps = set(h.capabilities)
        if wpb.WORKER_CAPABILITY_START_CONFIRMATION not in caps:
            # Every assignment of this planner carries a start-by: a worker that runs it at once, without asking
            # for its start, would be running it when its owner dispatches it again (a second run of the id).
            log.warning("worker refused: it does not confirm starts", extra={
                "event": "worker_refused", "worker": h.worker_id, "pool": h.pool, "sdk_version": h.sdk_version})
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "hello.capabilities: the worker does not confirm starts "
                                "(WORKER_CAPABILITY_START_CONFIRMATION), and this planner dispatches again what is "
                                "not started within start_timeout: upgrade the worker SDK (docs/workers.md, "
                                "\"Capabilities\")")
            return
        if self.duplicate is not None:
            self.duplicate.start()  # polled from the first stream on: without workers there is nothing to repeat
        conn_id = next(self._ids)
        c = Conn(h.worker_id, h.pool, h.region, frozenset(h.task_types), outgoing(),
                 last_seen=self.clock.monotonic(), capacity=h.capacity, scope=scope,
                 start_in=wpb.WORKER_CAPABILITY_START_IN in caps)
        self.conns[conn_id] = c
        if not c.start_in:
            self._no_start_in[c.pool] = self._no_start_in.get(c.pool, 0) + 1
        self.liveness.start_watchdog()
        log.info("worker connected", extra={"event": "worker_connected", "worker": h.worker_id, "pool": h.pool})
        self._on_worker()
        yield wpb.PlannerMessage(welcome=wpb.Welcome(
            planner_id=self.node_id, region=self.region, server_time=ms_to_timestamp(self.clock.wall_ms()),
            planners=self._planners(), heartbeat_interval=ms_to_duration(int(self.hb_interval * 1000)),
            heartbeat_timeout=ms_to_duration(int(self.hb_timeout * 1000)), acks_heartbeats=True))
        if h.running:
            c.out.put_nowait(await self.liveness.reattach(c, list(h.running)))
            self.liveness.heard(c)  # its reads took our time, not the worker's silence
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
            if not c.start_in:
                if (n := self._no_start_in[c.pool] - 1) > 0:
                    self._no_start_in[c.pool] = n
                else:
                    del self._no_start_in[c.pool]
            self._local_credit(c)  # a local stream that ends with credit had it until now
            self.window.drop(c.running)  # starts it never asked for will not be asked for on it
            # Attempts it was running stay in flight in the ledger; a result (possibly via another planner
            # after a reconnect) or a re-attach within the heartbeat timeout keeps them, else they time out.
            self.liveness.orphan(c)
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
