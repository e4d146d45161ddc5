"""What a planner thinks a worker holds returns to what the worker really runs, after every way an attempt
can end without a result on its stream (issue 9, item 12: `cluster status` showed RUNNING 12-20 while the
workers ran none). Real etcd, real gRPC, raw protocol clients that send only what the test says.

Three views are checked after each path: the node's status (what `cluster status` reads: a worker's
RUNNING), the attempts the node holds out on the worker's streams (what cancels, orphaning and re-attach
act on), and the fair queue's per-task-type count of attempts out (what its type caps read)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import grpc
import pytest

from chaos.infra.etcd import EtcdCluster
from scheduler._gen.scheduler.v1 import execution_pb2
from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler._gen.scheduler.v1 import worker_service_pb2_grpc as wgrpc
from scheduler.clock import SYSTEM_CLOCK
from scheduler.config import CoordinationSettings
from scheduler.dispatch.service import Dispatcher
from scheduler.execution import ExecState, Execution
from scheduler.model import Policies, RetryPolicy, Schedule
from scheduler.node import PlannerNode, default_operations
from scheduler.planner.settings import PlannerSettings
from scheduler.server import start_server
from scheduler.store.etcd import EtcdClient
from scheduler.store.keyspace import Keyspace
from scheduler.worker.protocol import CAPABILITIES

pytestmark = pytest.mark.etcd

COORD = CoordinationSettings(node_id="n1", lease_ttl=2, renew_interval=0.5, rpc_timeout=0.5, safety_margin=0.3,
                             partitions=4)
HB_INTERVAL, HB_TIMEOUT, START_TIMEOUT_MS = 0.1, 0.5, 600
FAST = PlannerSettings(lookahead_ms=500, loop_interval=0.02, late_grace_ms=1_000, start_timeout_ms=START_TIMEOUT_MS,
                       heartbeat_interval=HB_INTERVAL, heartbeat_timeout=HB_TIMEOUT)
POLICIES = Policies(execution_timeout_ms=120_000, retry=RetryPolicy(max_attempts=3, initial_backoff_ms=50,
                                                                    max_backoff_ms=100))
# How long an attempt the worker never lists may be in transit or waiting for its start confirmation.
GRACE = START_TIMEOUT_MS / 1000 + HB_TIMEOUT


@pytest.fixture
async def kv(etcd_server: EtcdCluster) -> AsyncIterator[EtcdClient]:
    async with EtcdClient(etcd_server.config(timeout=0.5)) as c:
        yield c


@contextlib.asynccontextmanager
async def planner(kv: EtcdClient, prefix: str, node_id: str = "n1",
                  run: bool = True) -> AsyncIterator[tuple[PlannerNode, Dispatcher, int]]:
    """A node serving WorkerService; run=False: it claims no partitions (records what it is sent)."""
    node = PlannerNode(kv, Keyspace(prefix), replace(COORD, node_id=node_id), SYSTEM_CLOCK, planner=FAST)
    d = node.make_dispatcher()
    server, port = await start_server(d, "127.0.0.1", 0)
    task = asyncio.create_task(node.run() if run else asyncio.sleep(0))
    try:
        if run:  # every partition claimed and planned once before the test creates schedules
            async with asyncio.timeout(15):
                while len(node.planners) < COORD.partitions or any(p.stats.rounds == 0 for p in node.planners.values()):
                    await asyncio.sleep(0.05)
        yield node, d, port
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await server.stop(None)


class Worker:
    """A raw worker stream. It heartbeats every HB_INTERVAL listing `running` (what the test says the worker
    runs, as the SDK lists every running attempt on every stream), and sends nothing else unasked."""

    def __init__(self, port: int, worker_id: str, credits: int = 1,
                 running: list[wpb.RunningAttempt] | None = None) -> None:
        self.ch = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        self.out: asyncio.Queue[wpb.WorkerMessage] = asyncio.Queue()
        self.running: list[wpb.RunningAttempt] = list(running or [])
        self.send(hello=wpb.Hello(worker_id=worker_id, pool="pool", region="default", capacity=4, task_types=["x"],
                                  running=self.running, capabilities=CAPABILITIES))
        if credits:
            self.send(credits=wpb.Credits(credits=credits))
        self.call: Any = wgrpc.WorkerServiceStub(self.ch).Connect(self._requests())
        self.inbox: dict[str, asyncio.Queue[Any]] = {}
        self.reader = asyncio.create_task(self._read())
        self.beats = asyncio.create_task(self._beat())

    async def _requests(self) -> AsyncIterator[wpb.WorkerMessage]:
        while True:
            yield await self.out.get()

    async def _read(self) -> None:
        while (msg := await self.call.read()) is not grpc.aio.EOF:  # type: ignore[attr-defined]
            kind = msg.WhichOneof("body")
            self.inbox.setdefault(kind, asyncio.Queue()).put_nowait(getattr(msg, kind))

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(HB_INTERVAL)
            self.send(heartbeat=wpb.Heartbeat(running=self.running))

    def send(self, **body: Any) -> None:
        self.out.put_nowait(wpb.WorkerMessage(**body))

    async def next(self, kind: str, timeout: float = 15) -> Any:
        async with asyncio.timeout(timeout):
            return await self.inbox.setdefault(kind, asyncio.Queue()).get()

    def runs(self, *assignments: wpb.Assignment) -> None:
        self.running = [wpb.RunningAttempt(execution_id=a.execution_id, attempt=a.attempt,
                                           fencing_token=a.fencing_token) for a in assignments]

    def freeze(self) -> None:
        """Stop heartbeating, keep the connection: a frozen (SIGSTOPped) worker."""
        self.beats.cancel()

    async def close(self) -> None:
        self.beats.cancel()
        self.reader.cancel()
        self.call.cancel()
        await asyncio.gather(self.reader, self.beats, return_exceptions=True)
        await self.ch.close(None)


def started(a: wpb.Assignment) -> wpb.Started:
    return wpb.Started(starts=[wpb.StartRequest(execution_id=a.execution_id, attempt=a.attempt,
                                                fencing_token=a.fencing_token)])


def result(a: wpb.Assignment, outcome: int = execution_pb2.ATTEMPT_OUTCOME_SUCCEEDED) -> wpb.Results:
    return wpb.Results(results=[wpb.Result(execution_id=a.execution_id, attempt=a.attempt,
                                           fencing_token=a.fencing_token, outcome=outcome)])  # type: ignore[arg-type]


async def one_run(node: PlannerNode, sid: str) -> int:
    planned = (SYSTEM_CLOCK.wall_ms() // 1000 + 2) * 1000
    await node.store.create(Schedule(id=sid, tenant="t", spec="* * * * * *", worker_pool="pool", task_type="x",
                                     start_ms=planned, end_ms=planned, policies=POLICIES), SYSTEM_CLOCK.wall_ms())
    return planned


async def record(node: PlannerNode, kv: EtcdClient, sid: str, planned_ms: int) -> Execution:
    e = await node.ledger.get(kv, sid, planned_ms)
    assert e is not None
    return e


async def until(what: str, value: Callable[[], Any], want: Any, timeout: float = 10) -> None:
    try:
        async with asyncio.timeout(timeout):
            while value() != want:
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"{what}: {value()!r} after {timeout} s, want {want!r}") from None


def reported(node: PlannerNode) -> dict[str, int]:
    """RUNNING per worker as `cluster status` gets it (the node's status snapshot)."""
    out: dict[str, int] = {}
    for w in node.status().workers:
        out[w.worker_id] = out.get(w.worker_id, 0) + w.running
    return out


def held(d: Dispatcher) -> dict[str, set[tuple[str, int]]]:
    """The attempts this node holds out on each worker's streams."""
    out: dict[str, set[tuple[str, int]]] = {}
    for c in d.conns.values():
        out.setdefault(c.worker_id, set()).update(c.running)
    return out


def out_per_type(d: Dispatcher) -> int:
    return d.queue.in_flight.get("x", 0)


async def settled(node: PlannerNode, d: Dispatcher, worker: str, runs: set[tuple[str, int]],
                  timeout: float = 3 * GRACE + 2) -> None:
    """Every view agrees with what `worker` runs, within the time an attempt may be in transit."""
    await until("status RUNNING", lambda: reported(node).get(worker, 0), len(runs), timeout)
    await until("held on the worker's streams", lambda: held(d).get(worker, set()), runs, timeout)
    await until("out per task type", lambda: out_per_type(d), sum(len(r) for r in held(d).values()), timeout)


async def test_a_result_delivered_through_another_planner(kv: EtcdClient, key_prefix: str) -> None:
    """The owner froze with the worker's result on its way (item 5): the worker sent it through the other
    planner, which recorded it. The owner's stream stays up and never sees that result."""
    prefix = key_prefix.rstrip("/")
    async with planner(kv, prefix) as (node, d, port), planner(kv, prefix, "n2", run=False) as (n2, d2, port2):
        planned = await one_run(node, "via")
        w = Worker(port, "w1")
        w2 = Worker(port2, "w1", credits=0)  # the same worker's stream to the other planner
        try:
            await w.next("welcome")
            await w2.next("welcome")
            a = (await w.next("assignments")).assignments[0]
            w.send(started=started(a))
            assert (await w.next("start_ack")).acks[0].disposition == wpb.START_DISPOSITION_STARTED
            w.runs(a)
            w2.runs(a)
            await settled(node, d, "w1", {(a.execution_id, 1)})
            # Every planner shows what the worker runs, not its own share of it: cluster status merges them.
            await until("the other planner's RUNNING", lambda: reported(n2), {"w1": 1})
            w2.send(results=result(a))  # the owner's ack timed out: the other planner records it
            ack = (await w2.next("result_ack")).acks[0]
            assert ack.disposition == wpb.RESULT_DISPOSITION_RECORDED
            w.runs()
            w2.runs()
            await settled(node, d, "w1", set())
            assert (await record(node, kv, "via", planned)).state is ExecState.SUCCEEDED
            assert d2.results == 1 and d.results == 0
            await until("the other planner's RUNNING", lambda: reported(n2), {"w1": 0})
        finally:
            await w.close()
            await w2.close()


async def test_a_start_refused_by_the_owner(kv: EtcdClient, key_prefix: str) -> None:
    """The worker asked for the start after the owner had dispatched the next attempt: refused, so the
    handler never runs here. The worker's not-started result may go anywhere, or never come."""
    async with planner(kv, key_prefix.rstrip("/")) as (node, d, port):
        planned = await one_run(node, "late")
        w = Worker(port, "w1")
        try:
            await w.next("welcome")
            a = (await w.next("assignments")).assignments[0]
            async with asyncio.timeout(10):  # no worker confirmed the start by start-by: due again
                # (the attempt handed out is written only now, ended never-started: a reserved one is not
                # written before its start)
                while not (rec := await record(node, kv, "late", planned)).attempts or \
                        not rec.attempts[0].never_started:
                    await asyncio.sleep(0.05)
            w.send(started=started(a))
            ack = (await w.next("start_ack")).acks[0]
            assert ack.disposition == wpb.START_DISPOSITION_REFUSED
            assert held(d) == {"w1": set()}, "let go with the refusal: the worker never runs it"
            await settled(node, d, "w1", set())
        finally:
            await w.close()


async def test_a_cancel_before_the_start_and_an_assignment_the_worker_drops(kv: EtcdClient, key_prefix: str) -> None:
    """An operator cancels a dispatched attempt no worker started (cancelled at once: it can no longer
    start); another assignment the worker just drops (never asks for its start, never reports it)."""
    async with planner(kv, key_prefix.rstrip("/")) as (node, d, port):
        planned = await one_run(node, "cancelme")
        await one_run(node, "dropme")
        w = Worker(port, "w1", credits=2)
        try:
            await w.next("welcome")
            got: list[wpb.Assignment] = []
            while len(got) < 2:
                got += (await w.next("assignments")).assignments
            a = next(x for x in got if x.schedule_id == "cancelme")
            cancelled = await default_operations(node).cancel_execution(a.execution_id)
            assert cancelled.state is ExecState.CANCELLED, "never started: cancelled at once, no Cancel sent"
            await settled(node, d, "w1", set())
            assert (await record(node, kv, "cancelme", planned)).state is ExecState.CANCELLED
        finally:
            await w.close()


async def test_an_assignment_returned_by_a_draining_worker(kv: EtcdClient, key_prefix: str) -> None:
    async with planner(kv, key_prefix.rstrip("/")) as (node, d, port):
        planned = await one_run(node, "back")
        w = Worker(port, "w1")
        try:
            await w.next("welcome")
            a = (await w.next("assignments")).assignments[0]
            w.send(drain=wpb.Drain(reason="test", returned=[wpb.AttemptRef(execution_id=a.execution_id,
                                                                           attempt=a.attempt)]))
            await w.next("result_ack")
            await settled(node, d, "w1", set())
            assert (await record(node, kv, "back", planned)).state is not ExecState.DISPATCHED
        finally:
            await w.close()


async def test_a_redispatch_after_orphaning(kv: EtcdClient, key_prefix: str) -> None:
    """A frozen worker's stream is ended and its attempt orphaned, timed out and dispatched again to another
    worker; the frozen one comes back and its re-attach is rejected. Each worker's count follows."""
    async with planner(kv, key_prefix.rstrip("/")) as (node, d, port):
        planned = await one_run(node, "orphan")
        w1 = Worker(port, "w1")
        w2: Worker | None = None
        back: Worker | None = None
        try:
            await w1.next("welcome")
            a1 = (await w1.next("assignments")).assignments[0]
            w1.send(started=started(a1))
            await w1.next("start_ack")
            w1.runs(a1)
            await settled(node, d, "w1", {(a1.execution_id, 1)})
            w1.freeze()
            w2 = Worker(port, "w2")
            await w2.next("welcome")
            a2 = (await w2.next("assignments", timeout=20)).assignments[0]
            assert (a2.execution_id, a2.attempt) == (a1.execution_id, 2), "retried, same id, next attempt"
            w2.send(started=started(a2))
            await w2.next("start_ack")
            w2.runs(a2)
            await settled(node, d, "w2", {(a2.execution_id, 2)})
            assert "w1" not in held(d) and reported(node).get("w1", 0) == 0, "the frozen worker's stream is gone"
            back = Worker(port, "w1", credits=0, running=w1.running)
            rej = await back.next("reattached")
            assert [r.attempt for r in rej.rejected] == [1] and not rej.accepted
            back.runs()  # the rejected attempt is stopped at once
            w2.send(results=result(a2))
            await w2.next("result_ack")
            w2.runs()
            await settled(node, d, "w2", set())
            await settled(node, d, "w1", set())
            assert (await record(node, kv, "orphan", planned)).state is ExecState.SUCCEEDED
        finally:
            for w in (w1, w2, back):
                if w is not None:
                    await w.close()
