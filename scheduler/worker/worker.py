"""The worker SDK: register async handlers, connect to every planner, run what they assign.

    worker = Worker(pool="billing", planners=["10.0.0.5:7000"], region="eu-west-1", concurrency=8)

    @worker.task("invoice")
    async def invoice(ctx: ExecutionContext, payload: bytes) -> None:
        ...  # ctx.idempotency_key makes a repeat harmless; pass str(ctx.fencing_token) to side effects

    await worker.run()  # until worker.drain(grace) or worker.close()

Protocol decisions (the planner-side dispatcher must match them) are listed in docs/workers.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, Protocol, Self, runtime_checkable

from scheduler import __version__
from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler.clock import SYSTEM_CLOCK, Clock
from scheduler.metrics.worker import UNREGISTERED, WorkerMetrics
from scheduler.status import WorkerProcessStatus
from scheduler.worker import protocol
from scheduler.worker.attempt import Attempt, AttemptKey, ErrorClass, Handler, Outcome, State, Status, Stop
from scheduler.worker.credits import CreditBook
from scheduler.worker.outbox import Disposition, Outbox
from scheduler.worker.planners import PlannerSet
from scheduler.worker.settings import WorkerSettings
from scheduler.worker.starts import StartGate
from scheduler.worker.stream import PlannerStream

log = logging.getLogger("scheduler.worker")

SDK_VERSION = f"sched-python/{__version__}"
_RESULTS_PER_MESSAGE = 256
_RESULT_LINGER = 0.002  # seconds results wait for others finishing soon after, to share one message
# Attempts that finished here are remembered this long (and at most this many), so that an assignment
# delivered again after its attempt ended (a replayed message, drill fault F9) is not run a second time.
# The planner's start confirmation does not stop such a repeat: it accepts a Started repeated by the same
# worker (a repeat after an unknown outcome), and until the result is recorded the record still says
# RUNNING by this worker. Ten minutes covers any redelivery of a live stream many times over; the cap
# bounds the memory (about 100 bytes an entry) at high rates, where the oldest go first.
_DONE_REMEMBERED_S = 600.0
_DONE_REMEMBERED_MAX = 100_000
_FORGET = {wpb.RESULT_DISPOSITION_RECORDED, wpb.RESULT_DISPOSITION_DUPLICATE, wpb.RESULT_DISPOSITION_STALE}


@runtime_checkable
class Closable(Protocol):
    """A handler with resources (the HTTP executor's connection pool) is closed with the worker."""

    async def aclose(self) -> None: ...


def _wake_up(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)



def orphan_stop(orphaned_at: float, timeout: float, acked_sent: float | None, grace: float,
                margin: float) -> tuple[float, float]:
    """When to stop an attempt whose origin stream went down at `orphaned_at` (monotonic), and the grace its
    handler gets before its task is cancelled. A planner that acknowledges heartbeats had heard from this worker
    when the heartbeat sent at `acked_sent` reached it, so it declares the stream dead no sooner than a heartbeat
    timeout after that and gives its attempts up a heartbeat timeout later (`give_up`, less `margin`): the
    handler is cancelled by then. The stop waits for a re-attach as before (`timeout` after the stream went
    down) while that leaves the handler part of its grace (up to half the timeout) before `give_up`; the grace
    is cut to what is left. Asked `timeout` after the stream went down and given the whole cancel grace, it ran
    on past `give_up`: a cut link is seen here late (gRPC's keepalive) or, seen by silence, at about the moment
    the planner sees it, and a retry elsewhere overlapped it (the F13 drill). Without acknowledgements (an older
    planner, `acked_sent` None): `timeout` after the stream went down, with the whole grace."""
    if acked_sent is None:
        return orphaned_at + timeout, grace
    give_up = acked_sent + 2 * timeout - margin
    at = max(orphaned_at, min(orphaned_at + timeout, give_up - min(grace, timeout / 2)))
    return at, max(0.0, min(grace, give_up - at))

class Worker:
    def __init__(
        self,
        pool: str | None = None,
        planners: Iterable[str] | None = None,
        region: str | None = None,
        concurrency: int | None = None,
        worker_id: str | None = None,
        *,
        settings: WorkerSettings | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """Arguments given here override the same fields of `settings` (the timing knobs live there)."""
        given: dict[str, Any] = {
            "pool": pool, "region": region, "concurrency": concurrency, "worker_id": worker_id,
            "planners": None if planners is None else tuple(planners),
        }
        s = dataclasses.replace(settings or WorkerSettings(), **{k: v for k, v in given.items() if v is not None})
        s.validate()
        self.settings = s
        self.worker_id = s.resolved_worker_id
        self.clock = clock
        self.book = CreditBook(s.concurrency, s.credit_idle_after)
        self.outbox = Outbox(s.result_ack_timeout)
        self.planners = PlannerSet(self, s)
        self.starts = StartGate(self._send_to, lambda: self.planners.connected)
        self._handlers: dict[str, Handler] = {}
        self._attempts: dict[AttemptKey, Attempt] = {}
        self._done: OrderedDict[AttemptKey, float] = OrderedDict()  # finished here -> monotonic time, oldest first
        self._copies: dict[int, Attempt] = {}  # unsafe_disable_dedupe only: repeats run beside the first (by id)
        self._tasks: list[asyncio.Task[None]] = []
        self._flush_pending = False
        self._grant_pending = False  # slots freed since the last grant: granted with the next flush
        self._started = False
        self._draining: tuple[str, float] | None = None  # (reason, grace) once drain() began
        self._closing = False
        self._closed = asyncio.Event()
        self._acked = asyncio.Event()  # set whenever the outbox becomes empty
        self.metrics = WorkerMetrics()  # served over HTTP only when metrics_address is set (cli/worker.py)
        self.metrics.observe(self.status)

    # --- registration and lifecycle -------------------------------------------------------------

    def task(self, task_type: str) -> Callable[[Handler], Handler]:
        """Decorator registering the handler for `task_type`; also `worker.task("t")(handler)`."""
        if self._started:
            raise RuntimeError("register handlers before the worker starts: Hello announces the task types")

        def register(handler: Handler) -> Handler:
            if task_type in self._handlers:
                raise ValueError(f"task type {task_type!r} already has a handler")
            self._handlers[task_type] = handler
            return handler

        return register

    @property
    def task_types(self) -> list[str]:
        return sorted(self._handlers)

    @property
    def streams(self) -> dict[str, PlannerStream]:
        return self.planners.streams

    @property
    def attempts_held(self) -> list[Attempt]:
        """Every attempt assigned here and not finished (pending or running)."""
        return list(self._attempts.values())

    @property
    def running(self) -> list[Attempt]:
        return [a for a in self._attempts.values() if a.state is State.RUNNING]

    def status(self) -> WorkerProcessStatus:
        """This worker's state as one snapshot (scheduler/status.py): what its metrics read."""
        s = self.settings
        return WorkerProcessStatus(
            worker_id=self.worker_id, pool=s.pool, region=s.region, concurrency=s.concurrency,
            task_types=tuple(self.task_types), held=len(self._attempts), running=len(self.running),
            planners=tuple(self.planners.connected), unacked_results=len(self.outbox),
            draining=self._draining is not None)

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        self.planners.start()
        self._tasks.append(asyncio.create_task(self._maintain(), name="worker-maintain"))
        self._tasks.append(asyncio.create_task(self.planners.discover_forever(), name="worker-discover"))

    async def run(self) -> None:
        """Start and return once the worker has been drained or closed."""
        await self.start()
        await self._closed.wait()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def drain(self, grace: float | None = None, reason: str = "drain") -> None:
        """Shut down gracefully: take no new work, hand back what has not started, let running attempts
        finish within `grace` seconds, stop the rest (reported TRANSIENT "worker draining", so they are
        retried elsewhere), wait for the results to be acknowledged, close."""
        if self._draining is not None or self._closing:
            await self._closed.wait()
            return
        grace = self.settings.drain_grace if grace is None else grace
        self._draining = (reason, grace)
        self.book.draining = True
        log.info("worker draining", extra={"reason": reason, "grace_s": grace, "running": len(self._attempts)})
        for stream in list(self.streams.values()):
            if stream.connected:
                self._send_drain(stream, self._hand_back(stream.address))
        for a in self._attempts.values():  # unstarted, but their planner's stream is down: fail them softly
            if a.state is State.PENDING:
                a.request_stop(Stop.DRAIN)
        tasks = [a.task for a in self._attempts.values() if a.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=grace)
        for a in list(self._attempts.values()):
            a.request_stop(Stop.DRAIN)
        tasks = [a.task for a in self._attempts.values() if a.task is not None]
        if tasks:
            await asyncio.wait(tasks)
        self._flush_now()
        if len(self.outbox) and not self._closing:
            self._acked.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._acked.wait(), self.settings.flush_timeout)
        await self.close()

    async def close(self) -> None:
        """Stop at once: cancel running handlers (their results are not sent), close every stream."""
        if self._closing:
            await self._closed.wait()
            return
        self._closing = True
        self._acked.set()  # a drain waiting for acknowledgements stops waiting: nobody will answer now
        self.book.draining = True
        for t in self._tasks:
            t.cancel()
        attempt_tasks = [a.task for a in self._attempts.values() if a.task is not None]
        for t in attempt_tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, *attempt_tasks, return_exceptions=True)
        await self.planners.close()
        for handler in self._handlers.values():
            if isinstance(handler, Closable):
                with contextlib.suppress(Exception):
                    await handler.aclose()
        log.info("worker closed", extra={"unacknowledged_results": len(self.outbox),
                                         "results_resent": self.outbox.resent,
                                         "starts_asked_again": self.starts.asked_again})
        self._closed.set()

    # --- callbacks from the planner streams -------------------------------------------------------

    def hello(self) -> wpb.WorkerMessage:
        return wpb.WorkerMessage(hello=wpb.Hello(
            worker_id=self.worker_id,
            pool=self.settings.pool,
            region=self.settings.region,
            capacity=self.settings.concurrency,
            task_types=self.task_types,
            sdk_version=SDK_VERSION,
            running=protocol.running_pb(self.running),  # re-attach what we still run
            capabilities=protocol.CAPABILITIES,
        ))

    def heartbeat(self, address: str) -> wpb.WorkerMessage:
        """The heartbeat for the stream to `address`: it marks the attempts that stream is the origin of."""
        # Armed attempts too: their start is recorded for this worker, and a planner gives up an attempt of
        # this worker that a heartbeat does not list (dispatch/liveness.py).
        held = [a for a in self._attempts.values() if a.state is State.RUNNING or a.armed_ms is not None]
        return protocol.heartbeat_message(held, self.outbox.keys(), self.clock.wall_ms(), origin=address)

    def stream_up(self, stream: PlannerStream, welcome: wpb.Welcome) -> None:
        if self.planners.is_duplicate(stream):
            return
        self.book.open(stream.address, self.clock.monotonic())
        if self._draining is not None:
            self._send_drain(stream, [])
        self.planners.learn(welcome.planners)
        self._grant()
        self._flush_soon()

    def stream_closing(self, stream: PlannerStream) -> None:
        self.book.quiesce(stream.address)

    def stream_down(self, stream: PlannerStream) -> None:
        self.starts.stream_lost(stream.address, [a for a in self._attempts.values() if a.state is State.PENDING])
        for a in self._attempts.values():
            if a.armed_ms is not None and a.origin == stream.address:
                # Nobody could disarm it any more (a pause, a change): not started, reported now.
                a.request_stop(Stop.DISARM, 0.0, "its planner stream broke before its start-at instant")
        self.book.close(stream.address)
        self.outbox.stream_lost(stream.address)
        self._grant()
        self._flush_soon()

    def on_message(self, stream: PlannerStream, msg: wpb.PlannerMessage) -> None:
        kind = msg.WhichOneof("body")
        if kind == "assignments":
            self._on_assignments(stream, list(msg.assignments.assignments))
        elif kind == "cancel":
            self._on_cancel(msg.cancel)
        elif kind == "result_ack":
            self._on_ack(msg.result_ack)
        elif kind == "reattached":
            self._on_reattached(stream, msg.reattached)
        elif kind == "start_ack":
            self.starts.on_ack(msg.start_ack, stream.address)
        elif kind == "disarm":
            self._on_disarm(msg.disarm)
        elif kind == "probe":
            # Answered at once: a planner probes to learn whether this worker still holds an attempt it
            # inherited, and its retry waits for the answer (up to a heartbeat interval, otherwise).
            stream.probe_seen = msg.probe.seq
            stream.heartbeat_now()
        else:  # a second Welcome, or a message newer than this SDK: nothing to do
            log.debug("ignored planner message", extra={"planner": stream.address, "kind": kind})

    # --- planner messages ---------------------------------------------------------------------------

    def _on_assignments(self, stream: PlannerStream, assignments: list[wpb.Assignment]) -> None:
        within = self.book.received(stream.address, len(assignments), self.clock.monotonic())
        self.metrics.received += len(assignments)
        handed_back: list[Attempt] = []
        for i, a in enumerate(assignments):
            ctx, timeout = protocol.context_from_assignment(a, self.worker_id, self.clock)
            attempt = Attempt(ctx, a.payload, self._handlers.get(a.task_type), stream.address, timeout,
                              protocol.start_timeout_of(a), self.clock.monotonic(), protocol.start_in_of(a))
            if self._repeat(attempt.key):  # running or recently finished here (delivered again): run it once
                log.warning("duplicate assignment ignored", extra={**ctx.log_fields(), "planner": stream.address,
                                                                    "event": "duplicate_ignored"})
                self.metrics.duplicates_ignored += 1
                if i < within:
                    self.book.finished()
            elif i >= within:
                # The planner sent more than it had credits for: refuse without running, retried elsewhere.
                log.error("assignment beyond granted credits refused", extra={**ctx.log_fields(),
                                                                              "planner": stream.address})
                self._report(attempt, Outcome(Status.FAILED, ErrorClass.TRANSIENT,
                                              "refused: assignment beyond the credits granted"))
            elif self._draining is not None:
                self.book.finished()
                handed_back.append(attempt)  # crossed our Drain on the wire: hand it back too
            else:
                if attempt.key in self._attempts:  # only with unsafe_disable_dedupe: both run, both are tracked
                    self._copies[id(attempt)] = attempt
                else:
                    self._attempts[attempt.key] = attempt
                attempt.task = asyncio.create_task(self._execute(attempt), name=f"attempt {ctx.execution_id}")
        if handed_back:
            self._send_drain(stream, handed_back)
        self._grant()

    def _on_cancel(self, c: wpb.Cancel) -> None:
        attempt = self._attempts.get((c.execution_id, c.attempt))
        if attempt is None:  # finished already (its result is on the way) or never ours
            return
        reason = wpb.CancelReason.Name(c.reason) if c.reason in wpb.CancelReason.values() else str(c.reason)
        message = f"cancelled by the planner ({reason.removeprefix('CANCEL_REASON_').lower()})"
        message += f": {c.message}" if c.message else ""
        log.info("execution cancel requested", extra={**attempt.ctx.log_fields(), "reason": message})
        attempt.request_stop(Stop.CANCEL, self.settings.cancel_grace, message)

    def _on_disarm(self, d: wpb.Disarm) -> None:
        """Attempts handed out ahead of their time that are not to start after all: dropped unless the handler
        has begun (then the run has started, as its record says)."""
        for ref in d.attempts:
            attempt = self._attempts.get((ref.execution_id, ref.attempt))
            if attempt is not None and attempt.state is State.PENDING and attempt.start_in > 0:
                log.info("execution disarmed", extra={**attempt.ctx.log_fields(), "event": "disarmed"})
                attempt.request_stop(Stop.DISARM, 0.0, "disarmed by the planner before its start-at instant")

    def _on_ack(self, ack: wpb.ResultAck) -> None:
        now = self.clock.monotonic()
        for e in ack.acks:
            forget = e.disposition in _FORGET
            self.outbox.acked((e.execution_id, e.attempt), Disposition.FORGET if forget else Disposition.RETRY, now)
        if not len(self.outbox):
            self._acked.set()

    def _on_reattached(self, stream: PlannerStream, r: wpb.Reattached) -> None:
        for ref in r.accepted:
            attempt = self._attempts.get((ref.execution_id, ref.attempt))
            if attempt is not None:
                attempt.origin = stream.address
                attempt.orphaned_at = None
                log.info("execution re-attached", extra={**attempt.ctx.log_fields(), "planner": stream.address})
        for rej in r.rejected:
            attempt = self._attempts.get((rej.execution_id, rej.attempt))
            if attempt is not None:
                # A newer attempt may already run elsewhere: stop now, and send no result (it would be STALE).
                log.warning("execution re-attach rejected; stopping it",
                            extra={**attempt.ctx.log_fields(), "planner": stream.address, "reason": rej.reason})
                attempt.request_stop(Stop.REJECTED, 0.0, f"re-attach rejected: {rej.reason}")

    # --- running attempts ------------------------------------------------------------------------------

    async def _execute(self, attempt: Attempt) -> None:
        fields = attempt.ctx.log_fields()
        if attempt.stop is None and log.isEnabledFor(logging.DEBUG):  # per execution: DEBUG (hot path)
            log.debug("execution started", extra={**fields, "event": "start", "planner": attempt.origin,
                                                  "timeout_s": attempt.timeout})
        try:
            refused = await self._confirm_start(attempt)
            if refused is None and attempt.start_in > 0:
                await self._await_instant(attempt)
            outcome = await attempt.run() if refused is None else refused
        finally:
            self._forget(attempt)
        if attempt.state is State.RETURNED:
            return
        attempt.state = State.DONE
        if attempt.stop is Stop.REJECTED:
            log.info("execution stopped after rejected re-attach", extra=fields)
        else:
            self._report(attempt, outcome)
        # Freed slots are granted with the next flush: one Credits message for all the attempts that
        # finished meanwhile, not one per attempt (each stream message costs both sides a write).
        self._grant_pending = True
        self._flush_soon()

    async def _confirm_start(self, attempt: Attempt) -> Outcome | None:
        """Start confirmation: None once a planner recorded the start (run the handler), else the
        outcome to report for an attempt whose handler must never run (worker/starts.py). A handler
        without a start confirmation could run while the owner, seeing no start by start-by, already
        dispatched the next attempt elsewhere."""
        if attempt.start_timeout is None or attempt.handler is None or attempt.stop is not None:
            return None  # an older planner; or nothing will run anyway (run() reports why)
        left = attempt.start_timeout - (self.clock.monotonic() - attempt.received)
        why = await self.starts.confirm(attempt, left)
        if not why:
            return None
        log.info("execution not started", extra={**attempt.ctx.log_fields(), "event": "not_started",
                                                 "planner": attempt.origin, "reason": why})
        return Outcome(Status.FAILED, ErrorClass.TRANSIENT, f"not started: {why}", not_started=True)

    async def _await_instant(self, attempt: Attempt) -> None:
        """Start ahead: wait, start confirmed, until `start_in` after receipt. A Disarm or Cancel ends the
        wait (run() then reports it not started, or cancelled); so does the stream it came on closing, since
        nobody could disarm it then. Only an attempt still wanted, from a stream still open, runs."""
        left = attempt.received + attempt.start_in - self.clock.monotonic()
        if attempt.stop is None and left > 0:
            attempt.armed_ms = self.clock.wall_ms()
            # A future and a timer, not wait_for on the cancel event: no task per waiting run (thousands a second).
            loop = asyncio.get_running_loop()
            attempt.wake = wake = loop.create_future()
            timer = loop.call_later(left, _wake_up, wake)
            try:
                await wake
            finally:
                timer.cancel()
                attempt.armed_ms = attempt.wake = None
        stream = self.streams.get(attempt.origin)
        if attempt.stop is None and (stream is None or not stream.connected):
            attempt.request_stop(Stop.DISARM, 0.0, "its planner stream closed before its start-at instant")

    def _send_to(self, address: str, msg: wpb.WorkerMessage) -> bool:
        stream = self.streams.get(address)
        return stream is not None and stream.send(msg)

    def _report(self, attempt: Attempt, outcome: Outcome) -> None:
        finished = self.clock.wall_ms()
        started = attempt.started_ms if attempt.started_ms is not None else finished
        task_type = attempt.ctx.task_type if attempt.handler is not None else UNREGISTERED
        self.metrics.finished(task_type, outcome.status.value, finished - started)
        # A success is routine (DEBUG, hot path); a failure is worth a line at INFO.
        level = logging.DEBUG if outcome.status is Status.SUCCEEDED else logging.INFO
        if log.isEnabledFor(level):
            log.log(level, "execution finished", extra={
                **attempt.ctx.log_fields(), "event": "result", "outcome": outcome.status.value,
                "error_class": outcome.error_class.value, "error": outcome.message,
                "duration_ms": finished - started, "retry_after_s": outcome.retry_after})
        self.outbox.add(protocol.result_pb(attempt, outcome, finished), attempt.origin,
                        avoid_origin=attempt.origin_silent)
        self._acked.clear()
        self._flush_soon()

    def stop_orphans(self, now: float) -> None:
        """The worker's half of the heartbeat lease: an attempt whose origin planner stream is down, and that
        no planner re-attached, is stopped and reported TIMEOUT, its handler cancelled before the planner,
        if alive, can give it up and run it elsewhere (`orphan_stop`)."""
        for a in self._attempts.values():
            if a.stop is not None:
                continue
            stream = self.streams.get(a.origin)
            if stream is not None and stream.connected:
                a.orphaned_at = None
                continue
            if a.orphaned_at is None:
                a.orphaned_at = now
            timeout = stream.heartbeat_timeout if stream is not None else self.settings.heartbeat_interval * 10
            at, grace = orphan_stop(a.orphaned_at, timeout, stream.acked_sent if stream is not None else None,
                                    self.settings.cancel_grace, stream.heartbeat_interval if stream else 1.0)
            if now >= at:
                log.warning("planner stream gone and the attempt not re-attached; stopping it before the planner "
                            "gives it up", extra={**a.ctx.log_fields(), "planner": a.origin, "event": "orphaned",
                                                  "grace_s": round(grace, 3)})
                a.request_stop(Stop.ORPHANED, grace, "origin planner unreachable")

    def _repeat(self, key: AttemptKey) -> bool:
        """This attempt is running here or finished here lately: a second delivery of the same assignment."""
        if self.settings.unsafe_disable_dedupe:
            return False
        now = self.clock.monotonic()
        while self._done and (len(self._done) > _DONE_REMEMBERED_MAX
                              or now - next(iter(self._done.values())) > _DONE_REMEMBERED_S):
            self._done.popitem(last=False)
        return key in self._attempts or key in self._done

    def _forget(self, attempt: Attempt) -> None:
        if self._attempts.get(attempt.key) is attempt:
            del self._attempts[attempt.key]
            self.book.finished()
            self._done[attempt.key] = self.clock.monotonic()
            self._done.move_to_end(attempt.key)
        elif self._copies.pop(id(attempt), None) is not None:
            self.book.finished()

    def _hand_back(self, address: str) -> list[Attempt]:
        """Attempts from `address` whose handler has not started: returned, never run."""
        back = [a for a in self._attempts.values() if a.state is State.PENDING and a.origin == address]
        for a in back:
            self._forget(a)
            a.state = State.RETURNED
            if a.task is not None:
                a.task.cancel()
        return back

    def _send_drain(self, stream: PlannerStream, returned: list[Attempt]) -> None:
        assert self._draining is not None
        reason, grace = self._draining
        for a in returned:
            log.info("execution handed back unstarted", extra={**a.ctx.log_fields(), "planner": stream.address})
        stream.send(protocol.drain_message(reason, grace, returned))

    # --- credits and results ---------------------------------------------------------------------------

    def _grant(self) -> None:
        for address, n in self.book.allocate(self.clock.monotonic()).items():
            stream = self.streams.get(address)
            if stream is None or not stream.send(protocol.credits_message(n)):
                # Cannot happen while the book opens and closes lines with the streams; say so loudly.
                log.error("credits granted to a stream that cannot take them", extra={"planner": address})

    def _flush_soon(self) -> None:
        """Send pending results very soon, so results finishing together travel in one Results message."""
        if not self._flush_pending:
            self._flush_pending = True
            asyncio.get_running_loop().call_later(_RESULT_LINGER, self._flush_now)

    def _flush_now(self) -> None:
        self._flush_pending = False
        for address, results in self.outbox.route(self.planners.connected, self.clock.monotonic()).items():
            for i in range(0, len(results), _RESULTS_PER_MESSAGE):
                self.streams[address].send(protocol.results_message(results[i:i + _RESULTS_PER_MESSAGE]))
        if self._grant_pending:
            self._grant_pending = False
            self._grant()

    async def _maintain(self) -> None:
        """Periodic chores: resend overdue results, grant slots freed by idleness, reclaim parked credits."""
        while True:
            await asyncio.sleep(min(0.25, self.settings.result_ack_timeout / 4))
            self._flush_now()
            self._grant()
            self.stop_orphans(self.clock.monotonic())
            victim = self.book.reclaim(self.clock.monotonic())
            # Never while attempts it sent wait for their start: the planner ends the call on our half-close
            # without the answers to starts it is recording, so they would be reported not_started (and run
            # again later) though recorded. They wait at most start_timeout; the next tick asks again.
            if victim is not None and victim in self.streams and not any(
                    a.state is State.PENDING and a.origin == victim for a in self._attempts.values()):
                log.info("re-opening an idle planner stream to reclaim its credits",
                         extra={"planner": victim, "credits": self.book.unused(victim)})
                self.streams[victim].recycle()
