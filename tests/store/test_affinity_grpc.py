"""Worker affinity per pool end to end: a real etcd holding the region policy (the planner's region guard
reads it from its watch), a PlannerNode's WorkerService on a real socket, and raw protocol workers of two
regions. `strict` never leaves the planning region, `prefer` goes abroad only after its local worker has
been gone for prefer_wait, `any` uses the other region's worker when the local one is busy."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace

import grpc
import pytest

from chaos.infra.etcd import EtcdCluster
from scheduler._gen.scheduler.v1 import execution_pb2
from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler._gen.scheduler.v1 import worker_service_pb2_grpc as wgrpc
from scheduler.clock import SYSTEM_CLOCK
from scheduler.model import Schedule
from scheduler.node import PlannerNode
from scheduler.region import policy as rp
from scheduler.region import store as rstore
from scheduler.region.affinity import Affinity, Mode
from scheduler.region.policy import RegionPolicy
from scheduler.server import start_server
from scheduler.store.etcd import EtcdClient
from scheduler.store.keyspace import Keyspace
from scheduler.worker.protocol import CAPABILITIES
from tests.store.test_dispatch_grpc import COORD, FAST

pytestmark = pytest.mark.etcd

PREFER_WAIT_MS = 1500


@pytest.fixture
async def kv(etcd_server: EtcdCluster) -> AsyncIterator[EtcdClient]:
    async with EtcdClient(etcd_server.config(timeout=0.5)) as c:
        yield c


@dataclass
class Worker:
    """A raw WorkerService client: capacity 1, each attempt "runs" for `busy` s, then its result and a credit."""

    worker_id: str
    pool: str
    region: str
    port: int
    busy: float = 0.3
    task_types: tuple[str, ...] = ("x",)
    got: list[float] = field(default_factory=list)  # monotonic receive time of each assignment
    task: asyncio.Task[None] | None = None

    def start(self) -> Worker:
        self.task = asyncio.create_task(self._run(), name=f"worker-{self.worker_id}")
        return self

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    async def _run(self) -> None:
        outbox: asyncio.Queue[wpb.WorkerMessage] = asyncio.Queue()

        async def requests() -> AsyncIterator[wpb.WorkerMessage]:
            yield wpb.WorkerMessage(hello=wpb.Hello(worker_id=self.worker_id, pool=self.pool, region=self.region,
                                                    capacity=1, task_types=list(self.task_types),
                                                    capabilities=CAPABILITIES))
            yield wpb.WorkerMessage(credits=wpb.Credits(credits=1))
            while True:
                yield await outbox.get()

        async def finish(a: wpb.Assignment) -> None:
            await asyncio.sleep(self.busy)
            await outbox.put(wpb.WorkerMessage(results=wpb.Results(results=[wpb.Result(
                execution_id=a.execution_id, attempt=a.attempt, fencing_token=a.fencing_token,
                outcome=execution_pb2.ATTEMPT_OUTCOME_SUCCEEDED)])))
            await outbox.put(wpb.WorkerMessage(credits=wpb.Credits(credits=1)))

        running: set[asyncio.Task[None]] = set()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{self.port}") as ch:
            call = wgrpc.WorkerServiceStub(ch).Connect(requests())
            try:
                while True:
                    msg = await call.read()
                    if msg is grpc.aio.EOF:  # type: ignore[attr-defined]
                        return
                    if msg.WhichOneof("body") == "assignments":
                        for a in msg.assignments.assignments:
                            self.got.append(time.monotonic())
                            t = asyncio.create_task(finish(a))
                            running.add(t)
                            t.add_done_callback(running.discard)
            finally:
                call.cancel()
                for t in running:
                    t.cancel()


async def test_strict_prefer_any(kv: EtcdClient, key_prefix: str) -> None:
    ks = Keyspace(key_prefix.rstrip("/"))
    policy = RegionPolicy("a", ("b",), failover_grace_ms=60_000)
    policy = rp.with_affinity(policy, "strict", Affinity(Mode.STRICT), by="test", now_ms=1)
    policy = rp.with_affinity(policy, "prefer", Affinity(Mode.PREFER, PREFER_WAIT_MS), by="test", now_ms=2)
    policy = rp.with_affinity(policy, "any", Affinity(Mode.ANY), by="test", now_ms=3)
    await rstore.cas(kv, ks, 0, policy, timeout=2)

    node = PlannerNode(kv, ks, replace(COORD, region="a"), SYSTEM_CLOCK, planner=FAST)
    dispatcher = node.make_dispatcher()
    server, port = await start_server(dispatcher, "127.0.0.1", 0)
    node_task = asyncio.create_task(node.run())
    # Three every-second schedules per pool: more than one busy local worker (capacity 1, 0.3 s per run)
    # keeps up with at the top of each second, so a pool that may go abroad does.
    for pool in ("strict", "prefer", "any"):
        for i in range(3):
            await node.store.create(Schedule(id=f"{pool}{i}", tenant="t", spec="* * * * * *", worker_pool=pool,
                                             task_type="x"), SYSTEM_CLOCK.wall_ms())
    ws = {f"{pool}-{r}": Worker(f"{pool}-{r}", pool, r, port).start()
          for pool in ("strict", "prefer", "any") for r in ("a", "b")}
    try:
        await asyncio.sleep(5)
        assert ws["strict-a"].got and not ws["strict-b"].got, "a strict pool's work went to another region"
        assert ws["prefer-a"].got and not ws["prefer-b"].got, "prefer went abroad while its local worker worked"
        assert ws["any-a"].got and ws["any-b"].got, "any did not use the other region's worker"

        await ws["prefer-a"].stop()  # the local prefer worker is gone
        gone = time.monotonic()
        await ws["strict-a"].stop()
        await asyncio.sleep(PREFER_WAIT_MS / 1000 + 3)
        first = ws["prefer-b"].got[0] if ws["prefer-b"].got else None
        assert first is not None, "prefer never fell over to the other region"
        # The wait counts from when a local worker last had credit, which can be before the stop: the local
        # worker runs up to three 0.3 s runs at the top of each second with no credit meanwhile (1.30 s
        # measured once on the CI-like machine, with a 1.5 s wait).
        assert first - gone >= PREFER_WAIT_MS / 1000 - 1.0, f"fell over after {first - gone:.2f}s"
        assert first - gone < PREFER_WAIT_MS / 1000 + 1.5
        assert not ws["strict-b"].got, "a strict pool without a local worker went abroad"
        cross = node.status().cross_region_assignments
        assert "strict" not in cross and cross.get("prefer", 0) > 0 and cross.get("any", 0) > 0
    finally:
        for w in ws.values():
            await w.stop()
        node_task.cancel()
        await asyncio.gather(node_task, return_exceptions=True)
        with contextlib.suppress(Exception):
            await server.stop(None)


async def test_prefer_is_judged_per_task_type(kv: EtcdClient, key_prefix: str) -> None:
    """An idle local worker of the pool that runs only "y" must not hold "x" work at home: once prefer_wait
    is over with no local "x" worker, the other region's "x" worker gets it (before the fix: never)."""
    ks = Keyspace(key_prefix.rstrip("/"))
    policy = rp.with_affinity(RegionPolicy("a", ("b",), failover_grace_ms=60_000), "p",
                              Affinity(Mode.PREFER, PREFER_WAIT_MS), by="test", now_ms=1)
    await rstore.cas(kv, ks, 0, policy, timeout=2)
    t0 = time.monotonic()  # before the dispatcher exists: its prefer_wait counts from no earlier
    node = PlannerNode(kv, ks, replace(COORD, region="a"), SYSTEM_CLOCK, planner=FAST)
    dispatcher = node.make_dispatcher()
    server, port = await start_server(dispatcher, "127.0.0.1", 0)
    node_task = asyncio.create_task(node.run())
    await node.store.create(Schedule(id="x1", tenant="t", spec="* * * * * *", worker_pool="p", task_type="x"),
                            SYSTEM_CLOCK.wall_ms())
    local_y = Worker("p-a-y", "p", "a", port, task_types=("y",)).start()
    remote_x = Worker("p-b-x", "p", "b", port).start()
    try:
        deadline = t0 + PREFER_WAIT_MS / 1000 + 6
        while not remote_x.got and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert remote_x.got, "x work was held at home by a local worker that does not run x"
        assert not local_y.got, "a 'y' worker was sent 'x' work"
        # Not before prefer_wait: counted from the planning region's start, local workers get it to show up.
        assert remote_x.got[0] - t0 >= PREFER_WAIT_MS / 1000 - 0.05, f"went abroad after {remote_x.got[0] - t0:.2f}s"
        assert node.status().cross_region_assignments.get("p", 0) > 0
    finally:
        for w in (local_y, remote_x):
            await w.stop()
        node_task.cancel()
        await asyncio.gather(node_task, return_exceptions=True)
        with contextlib.suppress(Exception):
            await server.stop(None)
