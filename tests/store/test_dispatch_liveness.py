"""Heartbeat liveness of the planner's WorkerService over a real socket, a raw protocol client and a real
etcd: a silent stream is ended and its attempt timed out (and retried, same id) long before its recorded
deadline; a worker that reconnects within the heartbeat timeout keeps its attempt; a result records the
worker that ran the attempt, on the fast path (owner) and on the slow path (another node)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
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
from scheduler.execution import ErrorClass, ExecState, Execution
from scheduler.model import Policies, RetryPolicy, Schedule
from scheduler.node import PlannerNode
from scheduler.planner.partition import LOST_MESSAGE
from scheduler.planner.settings import PlannerSettings
from scheduler.server import start_server
from scheduler.store.etcd import EtcdClient
from scheduler.store.keyspace import Keyspace
from scheduler.worker.protocol import CAPABILITIES

pytestmark = pytest.mark.etcd

COORD = CoordinationSettings(node_id="n1", lease_ttl=2, renew_interval=0.5, rpc_timeout=0.5, safety_margin=0.3,
                             partitions=4)
FAST = PlannerSettings(lookahead_ms=500, loop_interval=0.05, late_grace_ms=1_000, heartbeat_interval=0.1,
                       heartbeat_timeout=0.5)
LONG = Policies(execution_timeout_ms=120_000, retry=RetryPolicy(max_attempts=3, initial_backoff_ms=50,
                                                                max_backoff_ms=100))


@pytest.fixture
async def kv(etcd_server: EtcdCluster) -> AsyncIterator[EtcdClient]:
    async with EtcdClient(etcd_server.config(timeout=0.5)) as c:
        yield c


class Client:
    """One raw worker stream: messages are sent only when the test says (no automatic heartbeats)."""

    def __init__(self, port: int, worker_id: str, running: list[wpb.RunningAttempt] | None = None) -> None:
        self.ch = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        self.out: asyncio.Queue[wpb.WorkerMessage] = asyncio.Queue()
        hello = wpb.Hello(worker_id=worker_id, pool="pool", region="default", capacity=1, task_types=["x"],
                          running=running or [], capabilities=CAPABILITIES)
        self.out.put_nowait(wpb.WorkerMessage(hello=hello))
        self.call: Any = wgrpc.WorkerServiceStub(self.ch).Connect(self._requests())
        self.running = running or []
        self.beats = asyncio.create_task(self._beat())

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(0.1)
            self.send(heartbeat=wpb.Heartbeat(running=self.running))

    def freeze(self) -> None:
        """Stop heartbeating, keep the connection: a frozen (SIGSTOPped) worker."""
        self.beats.cancel()

    async def _requests(self) -> AsyncIterator[wpb.WorkerMessage]:
        while True:
            yield await self.out.get()

    def send(self, **body: Any) -> None:
        self.out.put_nowait(wpb.WorkerMessage(**body))

    async def next(self, kind: str, timeout: float = 15) -> Any:
        async with asyncio.timeout(timeout):
            while True:
                msg = await self.call.read()
                if msg is grpc.aio.EOF:  # type: ignore[attr-defined]
                    raise EOFError("stream ended")
                if msg.WhichOneof("body") == kind:
                    return getattr(msg, kind)

    async def ended(self, timeout: float = 10) -> None:
        async with asyncio.timeout(timeout):
            while (await self.call.read()) is not grpc.aio.EOF:  # type: ignore[attr-defined]
                pass

    async def close(self) -> None:
        self.beats.cancel()
        self.call.cancel()
        await self.ch.close(None)


async def record(node: PlannerNode, kv: EtcdClient, sid: str, planned_ms: int) -> Execution:
    e = await node.ledger.get(kv, sid, planned_ms)
    assert e is not None
    return e


@contextlib.asynccontextmanager
async def planner(kv: EtcdClient, prefix: str, node_id: str = "n1", run: bool = True,
                  settings: PlannerSettings = FAST, coord: CoordinationSettings = COORD,
                  ) -> AsyncIterator[tuple[PlannerNode, Dispatcher, int]]:
    """A node serving WorkerService; with run=False it claims no partitions (records results only)."""
    node = PlannerNode(kv, Keyspace(prefix), replace(coord, node_id=node_id), SYSTEM_CLOCK, planner=settings)
    d = node.make_dispatcher()
    server, port = await start_server(d, "127.0.0.1", 0)
    task = asyncio.create_task(node.run() if run else asyncio.sleep(0))
    try:
        yield node, d, port
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await server.stop(None)


async def one_run(node: PlannerNode, sid: str) -> int:
    planned = (SYSTEM_CLOCK.wall_ms() // 1000 + 2) * 1000
    await node.store.create(Schedule(id=sid, tenant="t", spec="* * * * * *", worker_pool="pool", task_type="x",
                                     start_ms=planned, end_ms=planned, policies=LONG), SYSTEM_CLOCK.wall_ms())
    return planned


def ok(a: wpb.Assignment) -> wpb.Results:
    return wpb.Results(results=[wpb.Result(execution_id=a.execution_id, attempt=a.attempt,
                                           fencing_token=a.fencing_token,
                                           outcome=execution_pb2.ATTEMPT_OUTCOME_SUCCEEDED)])


async def test_silent_stream_is_ended_and_its_attempt_retried_long_before_the_deadline(
    kv: EtcdClient, key_prefix: str
) -> None:
    prefix = key_prefix.rstrip("/")
    async with planner(kv, prefix) as (node, d, port):
        planned = await one_run(node, "quiet")
        w1 = Client(port, "w1")
        w2: Client | None = None
        try:
            await w1.next("welcome")
            w1.send(credits=wpb.Credits(credits=1))
            a1 = (await w1.next("assignments")).assignments[0]
            assert a1.attempt == 1
            w1.freeze()  # the TCP connection stays open, nothing is sent
            await w1.ended()
            assert d.liveness.streams_declared_dead == 1
            w2 = Client(port, "w2")
            await w2.next("welcome")
            w2.send(credits=wpb.Credits(credits=1))
            a2 = (await w2.next("assignments")).assignments[0]
            assert (a2.execution_id, a2.attempt) == (a1.execution_id, 2), "retried: same id, next attempt"
            # Its result goes to another node that owns nothing: recorded on the slow path, worker and all.
            async with planner(kv, prefix, "n2", run=False) as (_n2, _d2, port2):
                via = Client(port2, "w2")
                try:
                    await via.next("welcome")
                    via.send(results=ok(a2))
                    ack = (await via.next("result_ack")).acks[0]
                finally:
                    await via.close()
            assert ack.disposition == wpb.RESULT_DISPOSITION_RECORDED
            # A late result of attempt 1 (w1 thawed) is stale.
            w1b = Client(port, "w1")
            try:
                await w1b.next("welcome")
                w1b.send(results=ok(a1))
                assert (await w1b.next("result_ack")).acks[0].disposition == wpb.RESULT_DISPOSITION_STALE
            finally:
                await w1b.close()
        finally:
            await w1.close()
            if w2 is not None:
                await w2.close()
        e = await record(node, kv, "quiet", planned)
    assert e.state is ExecState.SUCCEEDED and e.attempt == 2, e
    first, second = e.attempts
    assert first.error_class is ErrorClass.TIMEOUT and first.message == LOST_MESSAGE, first
    assert first.finished_ms < first.deadline_ms - 100_000, "timed out by the lost heartbeat, not the deadline"
    assert second.succeeded and second.worker == "w2", second


async def test_a_worker_back_within_the_timeout_keeps_its_attempt(kv: EtcdClient, key_prefix: str) -> None:
    async with planner(kv, key_prefix.rstrip("/")) as (node, d, port):
        planned = await one_run(node, "blip")
        w1 = Client(port, "w1")
        await w1.next("welcome")
        w1.send(credits=wpb.Credits(credits=1))
        a1 = (await w1.next("assignments")).assignments[0]
        w1.send(started=wpb.Started(starts=[wpb.StartRequest(execution_id=a1.execution_id, attempt=1,
                                                             fencing_token=a1.fencing_token)]))
        assert (await w1.next("start_ack")).acks[0].disposition == wpb.START_DISPOSITION_STARTED
        await w1.close()  # the connection drops; the worker re-dials at once
        running = [wpb.RunningAttempt(execution_id=a1.execution_id, attempt=1, fencing_token=a1.fencing_token)]
        w1 = Client(port, "w1", running)
        try:
            await w1.next("welcome")
            back = await w1.next("reattached")
            assert [(r.execution_id, r.attempt) for r in back.accepted] == [(a1.execution_id, 1)]
            await asyncio.sleep(2.0)  # four heartbeat timeouts, heartbeating
            assert not d.liveness.orphans and d.liveness.attempts_lost == 0
            e = await record(node, kv, "blip", planned)
            assert e.state is ExecState.RUNNING and e.attempt == 1, f"kept, not retried: {e}"
            w1.send(results=ok(a1))
            assert (await w1.next("result_ack")).acks[0].disposition == wpb.RESULT_DISPOSITION_RECORDED
        finally:
            await w1.close()
        e = await record(node, kv, "blip", planned)
    assert e.state is ExecState.SUCCEEDED and e.attempt == 1 and len(e.attempts) == 1, e
    assert e.attempts[0].worker == "w1", "the fast path recorded who ran it"


async def test_a_lost_last_attempt_is_dead_lettered_with_its_payload(kv: EtcdClient, key_prefix: str) -> None:
    prefix = key_prefix.rstrip("/")
    async with planner(kv, prefix) as (node, _d, port):
        planned = (SYSTEM_CLOCK.wall_ms() // 1000 + 2) * 1000
        await node.store.create(Schedule(
            id="last", tenant="t", spec="* * * * * *", worker_pool="pool", task_type="x", payload=b"keep-me",
            start_ms=planned, end_ms=planned, policies=Policies(execution_timeout_ms=120_000,
                                                                retry=RetryPolicy(max_attempts=1))),
            SYSTEM_CLOCK.wall_ms())
        w1 = Client(port, "w1")
        try:
            await w1.next("welcome")
            w1.send(credits=wpb.Credits(credits=1))
            await w1.next("assignments")
            w1.freeze()
            await w1.ended()

            async def dead() -> Execution | None:
                e = await record(node, kv, "last", planned)
                return e if e.state is ExecState.DEAD_LETTER else None
            async with asyncio.timeout(15):
                while (e := await dead()) is None:
                    await asyncio.sleep(0.1)
        finally:
            await w1.close()
        p = node.store.partition("last")
        letter = await kv.get(node.ks.dead_letter(p, "last", planned))
    assert e.attempts[0].message == LOST_MESSAGE and e.attempts[0].error_class is ErrorClass.TIMEOUT
    assert letter is not None and json.loads(letter.value)["payload"] == b"keep-me".hex(), letter


async def test_a_running_attempt_whose_worker_and_planner_both_died_is_retried_by_the_next_owner(
    kv: EtcdClient, key_prefix: str
) -> None:
    """Found by the stateful test: the planner holding the worker's stream was gone, so nobody orphaned
    the attempt, and the new owner left it RUNNING until its execution deadline (5 min by default), the
    schedule's later runs skipped as overlap meanwhile. The new owner now expects every running attempt
    it finds at its claim to be listed by a worker within the heartbeat timeout."""
    prefix = key_prefix.rstrip("/")
    async with planner(kv, prefix) as (node, _d, port):
        planned = await one_run(node, "orphan")
        w1 = Client(port, "w1")
        try:
            await w1.next("welcome")
            w1.send(credits=wpb.Credits(credits=1))
            a1 = (await w1.next("assignments")).assignments[0]
            w1.send(started=wpb.Started(starts=[wpb.StartRequest(execution_id=a1.execution_id, attempt=1,
                                                                 fencing_token=a1.fencing_token)]))
            assert (await w1.next("start_ack")).acks[0].disposition == wpb.START_DISPOSITION_STARTED
        finally:
            await w1.close()  # the worker dies with its planner: no stream re-attaches, no result comes
    async with planner(kv, prefix, "n2") as (node2, _d2, port2):
        w2 = Client(port2, "w2")
        try:
            await w2.next("welcome")
            w2.send(credits=wpb.Credits(credits=1))
            a2 = (await w2.next("assignments", timeout=20)).assignments[0]
            assert (a2.execution_id, a2.attempt) == (a1.execution_id, 2), "retried: same id, next attempt"
        finally:
            await w2.close()
        e = await record(node2, kv, "orphan", planned)
    first = e.attempts[0]
    assert first.error_class is ErrorClass.TIMEOUT and first.message == LOST_MESSAGE, first
    assert first.finished_ms < first.deadline_ms - 100_000, "given up by the new owner, not at the deadline"


async def test_a_running_attempt_a_worker_still_lists_is_kept_by_the_next_owner(
    kv: EtcdClient, key_prefix: str
) -> None:
    prefix = key_prefix.rstrip("/")
    async with planner(kv, prefix) as (node, _d, port):
        planned = await one_run(node, "alive")
        w1 = Client(port, "w1")
        try:
            await w1.next("welcome")
            w1.send(credits=wpb.Credits(credits=1))
            a1 = (await w1.next("assignments")).assignments[0]
            w1.send(started=wpb.Started(starts=[wpb.StartRequest(execution_id=a1.execution_id, attempt=1,
                                                                 fencing_token=a1.fencing_token)]))
            assert (await w1.next("start_ack")).acks[0].disposition == wpb.START_DISPOSITION_STARTED
        finally:
            await w1.close()
    running = [wpb.RunningAttempt(execution_id=a1.execution_id, attempt=1, fencing_token=a1.fencing_token)]
    # The worker heartbeats from this process's event loop, which the planner shares: a timeout of a few
    # stalls, not one (a 0.54 s stall of a loaded machine outlasted 0.5 s, and the attempt was given up).
    patient = replace(FAST, heartbeat_timeout=1.5)
    async with planner(kv, prefix, "n2", settings=patient) as (node2, _d2, port2):
        w1 = Client(port2, "w1", running)  # the worker lives on and reconnects to the next planner
        try:
            await w1.next("welcome")
            await asyncio.sleep(COORD.lease_ttl + 3 * patient.heartbeat_timeout + 1)  # claim, then past the grace
            e = await record(node2, kv, "alive", planned)
            assert e.state is ExecState.RUNNING and e.attempt == 1, e
        finally:
            await w1.close()


async def test_every_heartbeat_is_answered_so_the_worker_can_tell_a_silent_planner(
        kv: EtcdClient, key_prefix: str) -> None:
    async with planner(kv, key_prefix.rstrip("/"), run=False) as (_node, _d, port):
        w = Client(port, "w1")
        try:
            welcome = await w.next("welcome")
            assert welcome.acks_heartbeats
            w.beats.cancel()  # heartbeats sent by hand from here
            for seq in (1, 2, 3):
                w.send(heartbeat=wpb.Heartbeat(seq=seq))
                assert (await w.next("heartbeat_ack")).seq == seq
        finally:
            await w.close()
