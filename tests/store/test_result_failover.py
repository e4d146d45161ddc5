"""A result held by a frozen planner (issue 9, item 5), with the real worker SDK, two planner nodes over real
sockets and a real etcd: the owner records the start, then stops answering results (frozen); the worker's
result, unacknowledged for `result_ack_timeout`, is sent through the other planner, which records it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from chaos.infra.etcd import EtcdCluster
from scheduler.clock import SYSTEM_CLOCK
from scheduler.config import CoordinationSettings
from scheduler.execution import ExecState
from scheduler.model import Policies, Schedule
from scheduler.node import PlannerNode
from scheduler.planner.settings import PlannerSettings
from scheduler.server import start_server
from scheduler.store.etcd import EtcdClient
from scheduler.store.keyspace import Keyspace
from scheduler.worker import ExecutionContext, Worker, WorkerSettings

pytestmark = pytest.mark.etcd

COORD = CoordinationSettings(node_id="n1", lease_ttl=2, renew_interval=0.5, rpc_timeout=0.5, safety_margin=0.3,
                             partitions=4)
FAST = PlannerSettings(lookahead_ms=500, loop_interval=0.02, late_grace_ms=1_000)
ACK_TIMEOUT = 0.5


@pytest.fixture
async def kv(etcd_server: EtcdCluster) -> AsyncIterator[EtcdClient]:
    async with EtcdClient(etcd_server.config(timeout=0.5)) as c:
        yield c


async def test_a_result_the_owner_never_acknowledges_is_recorded_through_another_planner(
    kv: EtcdClient, key_prefix: str
) -> None:
    prefix = key_prefix.rstrip("/")
    owner = PlannerNode(kv, Keyspace(prefix), COORD, SYSTEM_CLOCK, planner=FAST)
    d1 = owner.make_dispatcher()
    s1, port1 = await start_server(d1, "127.0.0.1", 0)
    other = PlannerNode(kv, Keyspace(prefix), replace(COORD, node_id="n2"), SYSTEM_CLOCK, planner=FAST)
    d2 = other.make_dispatcher()  # serves WorkerService, owns nothing
    s2, port2 = await start_server(d2, "127.0.0.1", 0)
    task = asyncio.create_task(owner.run())
    worker = Worker(settings=WorkerSettings(worker_id="w1", pool="pool", planners=(f"127.0.0.1:{port1}",
                                                                                    f"127.0.0.1:{port2}"),
                                            result_ack_timeout=ACK_TIMEOUT, discovery_interval=60))
    finished = asyncio.Event()
    frozen: list[int] = []

    @worker.task("x")
    async def handler(ctx: ExecutionContext, payload: bytes) -> None:
        # The owner recorded the start; now it freezes: results reach it and are never answered.
        d1._enqueue_results = lambda c, results: frozen.extend(r.attempt for r in results)  # type: ignore[method-assign]
        finished.set()

    try:
        async with asyncio.timeout(15):
            while len(owner.planners) < COORD.partitions or any(p.stats.rounds == 0 for p in owner.planners.values()):
                await asyncio.sleep(0.05)
        await worker.start()
        planned = (SYSTEM_CLOCK.wall_ms() // 1000 + 2) * 1000
        await owner.store.create(Schedule(id="held", tenant="t", spec="* * * * * *", worker_pool="pool",
                                          task_type="x", start_ms=planned, end_ms=planned,
                                          policies=Policies(execution_timeout_ms=120_000)), SYSTEM_CLOCK.wall_ms())
        await asyncio.wait_for(finished.wait(), 15)
        t0 = time.monotonic()
        async with asyncio.timeout(10):
            while (e := await owner.ledger.get(kv, "held", planned)) is None or e.state is not ExecState.SUCCEEDED:
                await asyncio.sleep(0.02)
        took = time.monotonic() - t0
    finally:
        await worker.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await s1.stop(None)
        await s2.stop(None)
    assert frozen == [1], "the result went to the owner first, which never answered"
    assert ACK_TIMEOUT <= took < ACK_TIMEOUT + 1.5, f"recorded {took:.2f} s after the handler finished"
    cur = e.current
    assert cur is not None and cur.succeeded and cur.worker == "w1" and cur.started_ms, cur
    assert d2.results == 1, "recorded by the other planner"
