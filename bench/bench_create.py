"""API create throughput: CreateSchedule one at a time (16 in flight) against BatchCreateSchedules (1000 per
call), through the Python client, over real gRPC to the real ScheduleService on a real etcd. The two are
interleaved in rounds (single, batch, single, batch ...) on fresh id ranges, and the ratio is per round.

The service runs in a process of its own (as on a planner node), the client in this one, etcd in a third.

    python bench/bench_create.py             # 5 rounds of 5,000 schedules each way
    python bench/bench_create.py --quick     # 1 round of 500 (CI smoke: no timing asserts)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chaos.infra.etcd import EtcdCluster, find_binary  # noqa: E402
from scheduler._gen.scheduler.v1 import schedule_pb2 as pb  # noqa: E402
from scheduler.client import SchedulerClient  # noqa: E402

SERVE = """
import asyncio, sys
import grpc
from scheduler._gen.scheduler.v1 import schedule_service_pb2_grpc as sgrpc
from scheduler.api.schedule_service import ScheduleService
from scheduler.clock import SYSTEM_CLOCK
from scheduler.store.etcd import EtcdClient, EtcdConfig
from scheduler.store.keyspace import Keyspace
from scheduler.store.ledger import Ledger
from scheduler.store.schedules import ScheduleStore
from tests.unit.api.test_service_inproc import FakeOps

async def main() -> None:
    async with EtcdClient(EtcdConfig(endpoints=(sys.argv[1],), timeout=10.0)) as kv:
        ks = Keyspace("/create")
        svc = ScheduleService(kv=kv, ks=ks, store=ScheduleStore(kv, ks, 256, timeout=10.0), ledger=Ledger(ks, 256),
                              clock=SYSTEM_CLOCK, ops=FakeOps(), rpc_timeout=10.0)
        server = grpc.aio.server()
        sgrpc.add_ScheduleServiceServicer_to_server(svc, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        print(f"serving 127.0.0.1:{port}", flush=True)
        await server.wait_for_termination()

asyncio.run(main())
"""


def sched(i: int) -> pb.Schedule:
    return pb.Schedule(id=f"c{i:08d}", tenant="t", spec="*/5 * * * *", worker_pool="p", task_type="x",
                       payload=b'{"command": "true"}', labels={"team": "bench"})


async def single(c: SchedulerClient, lo: int, n: int) -> float:
    sem = asyncio.Semaphore(16)

    async def one(i: int) -> None:
        async with sem:
            await c.create_schedule(sched(i))

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(lo, lo + n)))
    return n / (time.perf_counter() - t0)


async def batch(c: SchedulerClient, lo: int, n: int) -> float:
    t0 = time.perf_counter()
    for start in range(lo, lo + n, 1000):
        results = await c.batch_create_schedules([sched(i) for i in range(start, min(lo + n, start + 1000))])
        assert not any(r.already_exists for r in results)
    return n / (time.perf_counter() - t0)


async def run(address: str, rounds: int, n: int) -> None:
    async with SchedulerClient(address, timeout=120.0) as c:
        await single(c, 90_000_000, 50)  # warm up the channel and the server's code paths
        await batch(c, 91_000_000, 50)
        rates: list[tuple[float, float]] = []
        for r in range(rounds):
            s = await single(c, 2 * r * n, n)
            b = await batch(c, (2 * r + 1) * n, n)
            rates.append((s, b))
            print(f"round {r + 1}: single {s:,.0f}/s, batch {b:,.0f}/s, batch / single {b / s:.1f}x", flush=True)
    ratio = statistics.median(b / s for s, b in rates)
    print(f"median of {rounds} rounds: single {statistics.median(s for s, _ in rates):,.0f}/s, "
          f"batch {statistics.median(b for _, b in rates):,.0f}/s, batch / single {ratio:.1f}x; "
          f"load average {os.getloadavg()[0]:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 round of 500, for CI")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--count", type=int, help="schedules per round and way")
    args = ap.parse_args()
    rounds = args.rounds or (1 if args.quick else 5)
    n = args.count or (500 if args.quick else 5000)
    etcd_bin = find_binary("etcd")
    assert etcd_bin, "etcd not found: run scripts/setup.sh"
    with tempfile.TemporaryDirectory() as tmp:
        cluster = EtcdCluster(Path(tmp) / "etcd", binary=etcd_bin).start()
        log = Path(tmp) / "server.log"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with log.open("wb") as f:
            server = subprocess.Popen([sys.executable, "-c", SERVE, cluster.endpoints[0]], stdout=f,
                                      stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + 60
            while "serving " not in log.read_text():
                assert server.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "the service did not start"
                time.sleep(0.1)
            address = log.read_text().split("serving ", 1)[1].split()[0]
            asyncio.run(run(address, rounds, n))
        finally:
            server.terminate()
            server.wait(20)
            cluster.close()


if __name__ == "__main__":
    main()
