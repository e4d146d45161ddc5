"""The start window on a real etcd and real gRPC streams (dispatch/start_window.py, docs/operations.md
"Overload"): a worker with far more slots than its planner records starts for in time is handed only what
is answered before start-by, so a burst drains once instead of churning through unstarted re-dispatches.

The planner's start recording is slowed to a known rate (a slow etcd, a loaded machine): 6,000 runs due at
one instant, 1,500 starts recorded a second, 2 s to each start-by. Handed out at once (the worker's 6,000
slots), the tail of them waits 4 s for its start: half expire and are sent again (shown with the window
removed, bench/README.md). With the window, every run starts on its first attempt."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from chaos.infra.etcd import EtcdCluster
from scheduler.clock import SYSTEM_CLOCK
from scheduler.config import CoordinationSettings
from scheduler.dispatch.starts import _Req
from scheduler.execution import ExecState
from scheduler.model import Policies, Schedule
from scheduler.node import PlannerNode
from scheduler.planner.settings import PlannerSettings
from scheduler.server import start_server
from scheduler.store.etcd import EtcdClient
from scheduler.store.keyspace import Keyspace
from scheduler.store.schedules import MAX_BATCH
from scheduler.timeplan import Overlap
from scheduler.timeplan.plan import to_ms
from scheduler.worker import ExecutionContext, Worker, WorkerSettings

pytestmark = pytest.mark.etcd

N = 6_000
RATE = 1_500  # starts recorded per second, whatever the machine's speed
COORD = CoordinationSettings(node_id="n1", lease_ttl=4, renew_interval=1.0, rpc_timeout=2.0, safety_margin=0.5,
                             partitions=2)
SETTINGS = PlannerSettings(lookahead_ms=1_000, loop_interval=0.02, late_grace_ms=30_000, start_timeout_ms=2_000,
                           max_planned_per_round=1_000)


@pytest.fixture
async def kv(etcd_server: EtcdCluster) -> AsyncIterator[EtcdClient]:
    async with EtcdClient(etcd_server.config(timeout=5.0)) as c:
        yield c


async def test_a_burst_on_a_worker_with_more_slots_than_starts_recorded_in_time_starts_each_run_once(
        kv: EtcdClient, key_prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    node = PlannerNode(kv, Keyspace(key_prefix.rstrip("/")), COORD, SYSTEM_CLOCK, planner=SETTINGS)
    d = node.make_dispatcher()
    rec = d.starts
    real = rec.record

    async def slow(batch: list[_Req]) -> None:
        await asyncio.sleep(len(batch) / RATE)
        await real(batch)
    monkeypatch.setattr(rec, "record", slow)
    began: list[tuple[str, int, int]] = []
    server, port = await start_server(d, "127.0.0.1", 0)
    task = asyncio.create_task(node.run())
    worker = Worker(settings=WorkerSettings(worker_id="w1", pool="pool", planners=(f"127.0.0.1:{port}",),
                                            concurrency=N, discovery_interval=60))

    @worker.task("t")
    async def handler(ctx: ExecutionContext, payload: bytes) -> None:
        began.append((ctx.schedule_id, to_ms(ctx.planned_at), ctx.attempt))

    try:
        async with asyncio.timeout(20):
            while len(node.planners) < COORD.partitions or any(p.stats.rounds == 0 for p in node.planners.values()):
                await asyncio.sleep(0.05)
        await worker.start()
        due = (SYSTEM_CLOCK.wall_ms() // 1000 + 4) * 1000
        pol = Policies(overlap=Overlap.ALLOW_ALL, execution_timeout_ms=120_000)
        ids = [f"burst{i:05d}" for i in range(N)]
        for lo in range(0, N, MAX_BATCH):
            await node.store.create_batch([Schedule(id=sid, tenant="t", spec="* * * * * *", worker_pool="pool",
                                                    task_type="t", start_ms=due, end_ms=due, policies=pol)
                                           for sid in ids[lo:lo + MAX_BATCH]], SYSTEM_CLOCK.wall_ms())
        assert SYSTEM_CLOCK.wall_ms() < due - 1_000, "the creates took too long to test a burst at one instant"
        give_up = SYSTEM_CLOCK.wall_ms() + 40_000  # about 5 s when it works; the checks below say what did not
        while len(began) < N and SYSTEM_CLOCK.wall_ms() < give_up:
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)
        records = [e for lo in range(0, N, 500)
                   for e in await asyncio.gather(*(node.ledger.get(kv, sid, due) for sid in ids[lo:lo + 500]))]
    finally:
        await worker.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await server.stop(None)
    # From the records: how many attempts ended because their start was not recorded by start-by.
    unstarted = sum(1 for e in records if e is not None for a in e.attempts if a.never_started)
    w = d.window.pool("pool")
    assert sorted((sid, t) for sid, t, _ in began) == [(sid, due) for sid in ids], (
        f"each planned time runs once: {len(began)} of {N} began within 40 s, {unstarted} attempts went unstarted")
    assert unstarted <= N // 100, (
        f"{unstarted} attempts of {N} runs were not started by their start-by and dispatched again (window "
        f"{w.size:.0f}, halved {w.cuts} times, {w.expired} expired)")
    assert all(e is not None and e.state is ExecState.SUCCEEDED for e in records)
    assert w.cuts >= 1, "the window never had to shrink: the test did not overload the start pipeline"
