"""A scriptable planner for worker tests: a real grpc.aio WorkerService server on a loopback port.

It speaks the worker side of the protocol the way a dispatcher must (docs/workers.md): it answers
Hello with a Welcome, counts credits and refuses to assign beyond them (an assertion: a test that
tries is wrong), records every message, acknowledges results (configurable), and lets a test send
any PlannerMessage or break a stream.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from scheduler._gen.scheduler.v1 import cluster_pb2 as cpb
from scheduler._gen.scheduler.v1 import execution_pb2 as epb
from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler._gen.scheduler.v1 import worker_service_pb2_grpc as wgrpc
from scheduler.tls import ServerTls, peer_identity

RECORDED = wpb.RESULT_DISPOSITION_RECORDED
_ABORT = object()


def ts(ms: int) -> Timestamp:
    t = Timestamp()
    t.FromMilliseconds(ms)
    return t


def duration(seconds: float) -> Duration:
    d = Duration()
    d.FromMilliseconds(round(seconds * 1000))
    return d


def assignment(
    n: int = 1,
    *,
    schedule_id: str = "sched-a",
    task_type: str = "t",
    payload: bytes = b"",
    attempt: int = 1,
    partition: int = 7,
    revision: int = 4242,
    planned_ms: int = 1_790_000_000_000,
    timeout: float | None = 5.0,
    trigger: epb.Trigger = epb.TRIGGER_SCHEDULED,
    tenant: str = "acme",
    start_timeout: float | None = None,
    start_in: float | None = None,
) -> wpb.Assignment:
    """The n-th planned time of a test schedule, one second apart."""
    from scheduler.ids import execution_id

    planned = planned_ms + (n - 1) * 1000
    a = wpb.Assignment(
        execution_id=execution_id(schedule_id, planned), schedule_id=schedule_id, tenant=tenant,
        task_type=task_type, planned_at=ts(planned), attempt=attempt,
        fencing_token=epb.FencingToken(partition=partition, revision=revision), payload=payload,
        trigger=trigger,
    )
    if start_timeout is not None:
        a.start_timeout.CopyFrom(duration(start_timeout))
    if start_in is not None:
        a.start_in.CopyFrom(duration(start_in))
    if timeout is not None:
        a.timeout.CopyFrom(duration(timeout))
        a.deadline.CopyFrom(ts(planned + round(timeout * 1000)))
    return a


@dataclass
class Conn:
    """One Connect stream, as the planner sees it."""

    hello: wpb.Hello
    credits: int = 0  # granted and not yet used
    granted: int = 0  # total ever granted
    messages: list[wpb.WorkerMessage] = field(default_factory=list)
    closed: bool = False
    _out: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)

    def send(self, msg: wpb.PlannerMessage | None) -> None:
        """Queue a message; None ends the planner's side of the stream."""
        self._out.put_nowait(msg)

    def assign(self, *assignments: wpb.Assignment) -> None:
        assert len(assignments) <= self.credits, f"only {self.credits} credits for {len(assignments)} assignments"
        self.credits -= len(assignments)
        self.send(wpb.PlannerMessage(assignments=wpb.Assignments(assignments=assignments)))

    def cancel(
        self, a: wpb.Assignment, reason: wpb.CancelReason = wpb.CANCEL_REASON_REQUESTED, message: str = ""
    ) -> None:
        self.send(wpb.PlannerMessage(cancel=wpb.Cancel(execution_id=a.execution_id, attempt=a.attempt,
                                                       reason=reason, message=message)))

    def abort(self) -> None:
        """Break the stream (the worker sees UNAVAILABLE), as a planner crash or network cut would."""
        self._out.put_nowait(_ABORT)

    def of_kind(self, kind: str) -> list[Any]:
        return [getattr(m, kind) for m in self.messages if m.WhichOneof("body") == kind]

    @property
    def results(self) -> list[wpb.Result]:
        return [r for batch in self.of_kind("results") for r in batch.results]


class FakePlanner(wgrpc.WorkerServiceServicer):  # type: ignore[misc]  # generated, untyped
    def __init__(self, planner_id: str = "planner-1", region: str = "r1", heartbeat_interval: float = 0.05,
                 port: int = 0, tls: ServerTls | None = None) -> None:
        self.planner_id = planner_id
        self.tls = tls  # serve TLS (mutual with require_client_cert) instead of plaintext
        self.identities: list[dict[str, list[str]]] = []  # each stream's verified peer (auth_context)
        self.region = region
        self.heartbeat_interval = heartbeat_interval
        self.conns: list[Conn] = []
        self.others: list[cpb.PlannerInfo] = []  # other planners, for DiscoverPlanners and Welcome
        # How to answer each result; None: do not answer it.
        self.ack: Callable[[wpb.Result, Conn], wpb.ResultDisposition | None] = lambda r, c: RECORDED
        self.reattach: Callable[[list[wpb.RunningAttempt]], wpb.Reattached | None] = lambda running: None
        self.on_drain: Callable[[Conn, wpb.Drain], None] = lambda c, d: None
        # How to answer each start request; None: do not answer it.
        self.start_answer: Callable[[wpb.StartRequest, Conn], wpb.StartDisposition | None] = \
            lambda r, c: wpb.START_DISPOSITION_STARTED
        self.ignore_half_close = False  # misbehave: keep the stream open after the worker's half-close
        # Answer heartbeats (Welcome.acks_heartbeats), as the real dispatcher does; `mute` stops every answer
        # and message while the connection stays up (a link cut that TCP does not see, a frozen planner).
        self.acks = False
        self.mute = False
        self.address = ""
        self.port = port  # 0: any free port
        self._server: grpc.aio.Server | None = None

    @property
    def info(self) -> cpb.PlannerInfo:
        return cpb.PlannerInfo(node_id=self.planner_id, region=self.region, api_address=self.address,
                               liveness=cpb.PLANNER_LIVENESS_ALIVE)

    @property
    def results(self) -> list[wpb.Result]:
        return [r for c in self.conns for r in c.results]

    @property
    def live(self) -> list[Conn]:
        return [c for c in self.conns if not c.closed]

    async def start(self) -> FakePlanner:
        self._server = grpc.aio.server(options=[
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 1000),
            ("grpc.http2.max_ping_strikes", 0),
        ])
        wgrpc.add_WorkerServiceServicer_to_server(self, self._server)
        where = f"127.0.0.1:{self.port}"
        self.port = (self._server.add_insecure_port(where) if self.tls is None
                     else self._server.add_secure_port(where, self.tls.credentials()))
        self.address = f"127.0.0.1:{self.port}"
        await self._server.start()
        return self

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=None)

    async def wait_for(self, cond: Callable[[], Any], timeout: float = 5.0, what: str = "condition") -> Any:
        deadline = asyncio.get_running_loop().time() + timeout
        while not (value := cond()):
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            await asyncio.sleep(0.005)
        return value

    async def conn(self, n: int = 1, timeout: float = 5.0) -> Conn:
        """The n-th stream opened to this planner (1-based), once it exists."""
        await self.wait_for(lambda: len(self.conns) >= n, timeout, f"stream #{n} to {self.planner_id}")
        return self.conns[n - 1]

    async def DiscoverPlanners(self, request: Any, context: Any) -> wpb.DiscoverPlannersResponse:
        return wpb.DiscoverPlannersResponse(planners=[self.info, *self.others])

    async def Connect(self, request_iterator: Any, context: Any) -> AsyncIterator[wpb.PlannerMessage]:
        first = await anext(aiter(request_iterator))
        if first.WhichOneof("body") != "hello":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "first message must be a Hello")
        conn = Conn(hello=first.hello)
        self.identities.append(peer_identity(context))
        self.conns.append(conn)
        reader = asyncio.create_task(self._read(conn, request_iterator))
        try:
            while self.mute:  # a muted planner answers nothing, a Hello neither
                await asyncio.sleep(0.01)
            yield wpb.PlannerMessage(welcome=wpb.Welcome(
                planner_id=self.planner_id, region=self.region, server_time=ts(0),
                planners=[self.info, *self.others], heartbeat_interval=duration(self.heartbeat_interval),
                heartbeat_timeout=duration(self.heartbeat_interval * 5), acks_heartbeats=self.acks))
            if first.hello.running:
                answer = self.reattach(list(first.hello.running))
                if answer is not None:
                    yield wpb.PlannerMessage(reattached=answer)
            while (msg := await conn._out.get()) is not None:
                if msg is _ABORT:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "planner stream broken by the test")
                if not self.mute:
                    yield msg
        finally:
            conn.closed = True
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def _read(self, conn: Conn, request_iterator: Any) -> None:
        with contextlib.suppress(Exception):
            async for msg in request_iterator:
                conn.messages.append(msg)
                kind = msg.WhichOneof("body")
                if kind == "heartbeat" and self.acks:
                    conn.send(wpb.PlannerMessage(heartbeat_ack=wpb.HeartbeatAck(seq=msg.heartbeat.seq)))
                elif kind == "credits":
                    conn.credits += msg.credits.credits
                    conn.granted += msg.credits.credits
                elif kind == "results":
                    acks = [wpb.ResultAckEntry(execution_id=r.execution_id, attempt=r.attempt, disposition=d)
                            for r in msg.results.results if (d := self.ack(r, conn)) is not None]
                    if acks:
                        conn.send(wpb.PlannerMessage(result_ack=wpb.ResultAck(acks=acks)))
                elif kind == "started":
                    answers = [wpb.StartAckEntry(execution_id=r.execution_id, attempt=r.attempt, disposition=sd,
                                                 reason="refused by the test")
                               for r in msg.started.starts if (sd := self.start_answer(r, conn)) is not None]
                    if answers:
                        conn.send(wpb.PlannerMessage(start_ack=wpb.StartAck(acks=answers)))
                elif kind == "drain":
                    self.on_drain(conn, msg.drain)  # may still use credits: an assignment crossing the Drain
                    conn.credits = 0  # a draining worker's credits are void
        if not self.ignore_half_close:
            conn.send(None)  # the worker half-closed: end our side too, as a dispatcher must
