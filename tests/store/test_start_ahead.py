"""Start ahead on a real etcd and real gRPC streams (docs/workers.md, "Start ahead"): runs handed to a worker
before their due time begin at it, never before it, each once; a pause made while a run waits armed stops it
(disarmed, then recorded as paused once due)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from chaos.infra.etcd import EtcdCluster
from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler.clock import SYSTEM_CLOCK
from scheduler.config import CoordinationSettings
from scheduler.execution import ExecState, Execution, Trigger
from scheduler.model import Schedule, ScheduleState
from scheduler.node import PlannerNode
from scheduler.planner.settings import PlannerSettings
from scheduler.server import start_server
from scheduler.store.etcd import EtcdClient
from scheduler.store.keyspace import Keyspace
from scheduler.timeplan.plan import to_ms
from scheduler.worker import ExecutionContext, Worker, WorkerSettings, protocol

pytestmark = pytest.mark.etcd

COORD = CoordinationSettings(node_id="n1", lease_ttl=2, renew_interval=0.5, rpc_timeout=2.0, safety_margin=0.3,
                             partitions=2)
AHEAD = PlannerSettings(lookahead_ms=2_000, loop_interval=0.02, late_grace_ms=1_000, start_ahead_ms=1_500)


@pytest.fixture
async def kv(etcd_server: EtcdCluster) -> AsyncIterator[EtcdClient]:
    async with EtcdClient(etcd_server.config(timeout=2.0)) as c:
        yield c


class Cluster:
    def __init__(self, kv: EtcdClient, key_prefix: str) -> None:
        self.node = PlannerNode(kv, Keyspace(key_prefix.rstrip("/")), COORD, SYSTEM_CLOCK, planner=AHEAD)
        self.d = self.node.make_dispatcher()
        self.began: list[tuple[str, int, int, int]] = []  # (schedule, planned ms, attempt, wall ms the handler began)

    async def __aenter__(self) -> Cluster:
        self.server, port = await start_server(self.d, "127.0.0.1", 0)
        self.task = asyncio.create_task(self.node.run())
        self.worker = Worker(settings=WorkerSettings(worker_id="w1", pool="pool", planners=(f"127.0.0.1:{port}",),
                                                     concurrency=200, discovery_interval=60))

        @self.worker.task("t")
        async def handler(ctx: ExecutionContext, payload: bytes) -> None:
            self.began.append((ctx.schedule_id, to_ms(ctx.planned_at), ctx.attempt, SYSTEM_CLOCK.wall_ms()))

        async with asyncio.timeout(15):
            while len(self.node.planners) < COORD.partitions or any(
                    p.stats.rounds == 0 for p in self.node.planners.values()):
                await asyncio.sleep(0.05)
        await self.worker.start()
        return self

    async def every_second(self, prefix: str, n: int, seconds: int) -> tuple[list[tuple[str, int]], list[Execution]]:
        """`n` schedules firing every second, all at one instant (the start-lag goal's shape), for `seconds` + 1
        planned times each from 2 s on; waits until each planned time began, returns them and their records."""
        start = (SYSTEM_CLOCK.wall_ms() // 1000 + 2) * 1000
        end = start + seconds * 1000
        ids = [f"{prefix}-{i:02d}" for i in range(n)]
        for sid in ids:
            await self.node.store.create(Schedule(id=sid, tenant="t", spec="* * * * * *", worker_pool="pool",
                                                  task_type="t", start_ms=start, end_ms=end), SYSTEM_CLOCK.wall_ms())
        want = sorted((sid, t) for sid in ids for t in range(start, end + 1, 1000))
        async with asyncio.timeout(end - SYSTEM_CLOCK.wall_ms() + 10_000):
            while len(self.began) < len(want):
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        records = [e for sid, t in want if (e := await self.node.ledger.get(self.node.kv, sid, t)) is not None]
        return want, records

    async def __aexit__(self, *exc: object) -> None:
        await self.worker.close()
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.server.stop(None)


async def test_runs_handed_out_ahead_begin_at_their_due_time_each_once(kv: EtcdClient, key_prefix: str) -> None:
    async with Cluster(kv, key_prefix) as c:
        want, records = await c.every_second("every", 30, 3)
    assert sorted((sid, t) for sid, t, _, _ in c.began) == want, "each planned time ran once"
    # Never before its due time (the worker waits for its instant; one machine, one clock).
    early = [(sid, t, at - t) for sid, t, _, at in c.began if at < t]
    assert not early, early
    # Handed out ahead: dispatched before the due time, the start recorded as of the due time.
    ahead = [e for e in records if e.attempts and e.attempts[0].dispatched_ms < e.due_ms]
    assert len(ahead) >= len(want) // 2, f"only {len(ahead)} of {len(want)} runs were handed out ahead"
    assert all(e.attempts[0].started_ms == e.due_ms and e.state is ExecState.SUCCEEDED for e in ahead)


async def test_a_pause_while_a_run_waits_armed_stops_it(kv: EtcdClient, key_prefix: str) -> None:
    async with Cluster(kv, key_prefix) as c:
        planned = (SYSTEM_CLOCK.wall_ms() // 1000 + 3) * 1000
        s = Schedule(id="armed", tenant="t", spec="* * * * * *", worker_pool="pool", task_type="t",
                     start_ms=planned, end_ms=planned + 2_000)
        await c.node.store.create(s, SYSTEM_CLOCK.wall_ms())
        async with asyncio.timeout(10):  # handed out, its start recorded, waiting on the worker for its instant
            while (e := await c.node.ledger.get(kv, s.id, planned)) is None or e.state is not ExecState.RUNNING:
                await asyncio.sleep(0.02)
        assert SYSTEM_CLOCK.wall_ms() < planned - 200, "armed too late to test a pause before its instant"
        st = await c.node.store.get(s.id)
        await c.node.store.update(replace(st.schedule, state=ScheduleState.PAUSED), None, SYSTEM_CLOCK.wall_ms())
        async with asyncio.timeout(10):
            while (e := await c.node.ledger.get(kv, s.id, planned)) is None or e.state is not ExecState.SKIPPED:
                await asyncio.sleep(0.05)
        await asyncio.sleep(max(0, planned + 2_500 - SYSTEM_CLOCK.wall_ms()) / 1000)
        later = [await c.node.ledger.get(kv, s.id, t) for t in (planned + 1_000, planned + 2_000)]
    assert not c.began, f"a paused schedule ran: {c.began}"
    assert e.skip_reason == "paused" and e.trigger is Trigger.SCHEDULED
    assert e.attempts and e.attempts[-1].never_started and "disarmed" in e.attempts[-1].message, e.attempts
    assert c.d.disarmed >= 1
    assert all(x is None or x.state is ExecState.SKIPPED for x in later), later


async def test_a_worker_that_does_not_honour_start_in_is_handed_no_run_early(
        kv: EtcdClient, key_prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An older worker SDK ignores start_in and would run an armed run at once, before its due time. Its Hello
    lacks WORKER_CAPABILITY_START_IN, so the planner arms nothing for its pool: every run is handed out at its
    due time (docs/workers.md, "Capabilities")."""
    monkeypatch.setattr(protocol, "CAPABILITIES", (wpb.WORKER_CAPABILITY_START_CONFIRMATION,))
    async with Cluster(kv, key_prefix) as c:
        want, records = await c.every_second("old", 10, 2)
        assert not c.d.may_arm("pool")
    assert sorted((sid, t) for sid, t, _, _ in c.began) == want, "each planned time ran once"
    early = [(e.id, e.due_ms - a.dispatched_ms) for e in records for a in e.attempts
             if a.dispatched_ms < e.due_ms]
    assert not early, f"handed out before their due time to a worker that would start them at once: {early}"
