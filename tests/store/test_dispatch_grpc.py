"""The planner's WorkerService over a real socket, a raw protocol client, and a real etcd."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from chaos.infra.etcd import EtcdCluster
from scheduler._gen.scheduler.v1 import execution_pb2
from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler._gen.scheduler.v1 import worker_service_pb2_grpc as wgrpc
from scheduler.clock import SYSTEM_CLOCK
from scheduler.config import CoordinationSettings
from scheduler.execution import ExecState, Execution
from scheduler.model import Schedule
from scheduler.node import PlannerNode
from scheduler.planner.settings import PlannerSettings
from scheduler.server import start_server
from scheduler.store.etcd import EtcdClient
from scheduler.store.keyspace import Keyspace
from scheduler.worker.protocol import CAPABILITIES

pytestmark = pytest.mark.etcd

COORD = CoordinationSettings(node_id="n1", lease_ttl=2, renew_interval=0.5, rpc_timeout=0.5, safety_margin=0.3,
                             partitions=4)
FAST = PlannerSettings(lookahead_ms=500, loop_interval=0.05, late_grace_ms=1_000)


@pytest.fixture
async def kv(etcd_server: EtcdCluster) -> AsyncIterator[EtcdClient]:
    async with EtcdClient(etcd_server.config(timeout=0.5)) as c:
        yield c


async def all_executions(node: PlannerNode, kv: EtcdClient) -> list[Execution]:
    out: list[Execution] = []
    for p in range(COORD.partitions):
        out += (await node.ledger.list_partition(kv, p))[0]
    return out


async def test_assign_run_report(kv: EtcdClient, key_prefix: str) -> None:
    node = PlannerNode(kv, Keyspace(key_prefix.rstrip("/")), COORD, SYSTEM_CLOCK, planner=FAST)
    dispatcher = node.make_dispatcher()
    server, port = await start_server(dispatcher, "127.0.0.1", 0)
    node_task = asyncio.create_task(node.run())
    for i in range(5):
        await node.store.create(Schedule(id=f"s{i}", tenant=f"t{i % 2}", spec="* * * * * *", worker_pool="pool",
                                         task_type="x", payload=b"hello"), SYSTEM_CLOCK.wall_ms())
    seen: list[wpb.Assignment] = []
    acks: list[wpb.ResultAckEntry] = []
    outbox: asyncio.Queue[wpb.WorkerMessage] = asyncio.Queue()

    async def requests() -> AsyncIterator[wpb.WorkerMessage]:
        yield wpb.WorkerMessage(hello=wpb.Hello(worker_id="w1", pool="pool", region="default", capacity=8,
                                                task_types=["x"], capabilities=CAPABILITIES))
        yield wpb.WorkerMessage(credits=wpb.Credits(credits=8))
        while True:
            yield await outbox.get()

    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = wgrpc.WorkerServiceStub(ch)
            call = stub.Connect(requests())
            welcome = await call.read()
            assert welcome.welcome.planner_id == "n1"
            async with asyncio.timeout(15):
                while len(acks) < 10:
                    msg = await call.read()
                    kind = msg.WhichOneof("body")
                    if kind == "assignments":
                        for a in msg.assignments.assignments:
                            assert a.payload == b"hello"
                            assert a.attempt == 1
                            assert a.fencing_token.revision > 0
                            seen.append(a)
                            await outbox.put(wpb.WorkerMessage(results=wpb.Results(results=[wpb.Result(
                                execution_id=a.execution_id, attempt=a.attempt, fencing_token=a.fencing_token,
                                outcome=execution_pb2.ATTEMPT_OUTCOME_SUCCEEDED)])))
                            await outbox.put(wpb.WorkerMessage(credits=wpb.Credits(credits=1)))
                    elif kind == "result_ack":
                        acks += list(msg.result_ack.acks)
            call.cancel()
        assert all(a.disposition == wpb.RESULT_DISPOSITION_RECORDED for a in acks)
        ids = [a.execution_id for a in seen]
        assert len(ids) == len(set(ids))
        done = {e.id for e in await all_executions(node, kv) if e.state is ExecState.SUCCEEDED}
        assert {a.execution_id for a in acks} <= done
        assert node.restarts == 0
    finally:
        node_task.cancel()
        await asyncio.gather(node_task, return_exceptions=True)
        await server.stop(None)


async def test_a_worker_that_does_not_confirm_starts_is_refused_naming_the_field(kv: EtcdClient,
                                                                                  key_prefix: str) -> None:
    """A worker built before start confirmation runs an assignment at once without asking for its start, and
    its planner dispatches the run again after start_timeout while it runs: such a stream is refused at its
    Hello (docs/workers.md, "Capabilities"), loudly, instead of being given work it would run twice."""
    node = PlannerNode(kv, Keyspace(key_prefix.rstrip("/")), COORD, SYSTEM_CLOCK, planner=FAST)
    dispatcher = node.make_dispatcher()
    server, port = await start_server(dispatcher, "127.0.0.1", 0)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            for caps in ([], [wpb.WORKER_CAPABILITY_START_IN]):
                call = wgrpc.WorkerServiceStub(ch).Connect()
                await call.write(wpb.WorkerMessage(hello=wpb.Hello(worker_id="old", pool="pool", capacity=8,
                                                                   task_types=["x"], capabilities=caps)))
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call.read()
                assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert "hello.capabilities" in (err.value.details() or "")
        assert dispatcher.conns == {}, "a refused stream was kept"
    finally:
        await server.stop(None)
