"""Runs with large payloads due together reach a worker with many free slots (real etcd, real gRPC).

The planner sent every run a stream had credit for in one Assignments message: 120 runs of 64 KiB (the
payload limit) made a 7.7 MiB message, past gRPC's 4 MiB default receive limit. The worker's stream broke
on it (RESOURCE_EXHAUSTED), the runs waited for the liveness check to give them up, and their re-dispatch
broke the stream again: none ran until the retries were spent. A message now stays under 1 MiB."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from chaos.infra.etcd import EtcdCluster
from scheduler.clock import SYSTEM_CLOCK
from scheduler.config import CoordinationSettings
from scheduler.execution import ExecState
from scheduler.model import MAX_PAYLOAD_BYTES, Policies, Schedule
from scheduler.node import PlannerNode
from scheduler.planner.settings import PlannerSettings
from scheduler.server import start_server
from scheduler.store.etcd import EtcdClient
from scheduler.store.keyspace import Keyspace
from scheduler.worker import ExecutionContext, Worker, WorkerSettings

pytestmark = pytest.mark.etcd

COORD = CoordinationSettings(node_id="n1", lease_ttl=2, renew_interval=0.5, rpc_timeout=2.0, safety_margin=0.3,
                             partitions=2)
FAST = PlannerSettings(lookahead_ms=1_000, loop_interval=0.02, late_grace_ms=1_000)
RUNS = 120


@pytest.fixture
async def kv(etcd_server: EtcdCluster) -> AsyncIterator[EtcdClient]:
    async with EtcdClient(etcd_server.config(timeout=2.0)) as c:
        yield c


async def test_many_runs_with_the_largest_payload_due_together_all_run_once(kv: EtcdClient, key_prefix: str) -> None:
    node = PlannerNode(kv, Keyspace(key_prefix.rstrip("/")), COORD, SYSTEM_CLOCK, planner=FAST)
    d = node.make_dispatcher()
    server, port = await start_server(d, "127.0.0.1", 0)
    task = asyncio.create_task(node.run())
    worker = Worker(settings=WorkerSettings(worker_id="w1", pool="pool", planners=(f"127.0.0.1:{port}",),
                                            concurrency=RUNS * 2, discovery_interval=60))
    ran: list[tuple[str, int]] = []

    @worker.task("big")
    async def handler(ctx: ExecutionContext, payload: bytes) -> None:
        assert len(payload) == MAX_PAYLOAD_BYTES
        ran.append((ctx.schedule_id, ctx.attempt))

    try:
        async with asyncio.timeout(15):
            while len(node.planners) < COORD.partitions or any(p.stats.rounds == 0 for p in node.planners.values()):
                await asyncio.sleep(0.05)
        await worker.start()
        planned = (SYSTEM_CLOCK.wall_ms() // 1000 + 3) * 1000  # after every create, all at one instant
        schedules = [Schedule(id=f"big-{i:03d}", tenant="t", spec="* * * * * *", worker_pool="pool", task_type="big",
                              start_ms=planned, end_ms=planned, payload=bytes([i % 256]) * MAX_PAYLOAD_BYTES,
                              policies=Policies(execution_timeout_ms=60_000)) for i in range(RUNS)]
        for i in range(0, RUNS, 10):  # (a txn of etcd's holds at most 1.5 MiB by default)
            await asyncio.gather(*(node.store.create(s, SYSTEM_CLOCK.wall_ms()) for s in schedules[i:i + 10]))
        async with asyncio.timeout(20):
            while len(ran) < RUNS:
                await asyncio.sleep(0.05)
        async with asyncio.timeout(10):
            for s in schedules:
                while (e := await node.ledger.get(kv, s.id, planned)) is None or e.state is not ExecState.SUCCEEDED:
                    await asyncio.sleep(0.05)
    finally:
        await worker.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await server.stop(None)
    assert sorted(ran) == [(s.id, 1) for s in schedules], "each ran once, on its first attempt"
    assert d.sent == RUNS
