"""A small real cluster for API contract tests: etcd, two planner processes serving the API on
loopback ports of their own choosing (read back from their logs), and one worker process
(tests/integration/effect_worker.py, pool `pool`, task type `effect`). Everything is started through
chaos/infra/procs.py (backstops) and stopped by pid.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chaos.infra.etcd import EtcdCluster
from chaos.infra.planners import API, PlannerSet
from chaos.infra.procs import forget, spawn
from scheduler._gen.scheduler.v1 import admin_service_pb2 as apb
from scheduler._gen.scheduler.v1 import admin_service_pb2_grpc as agrpc
from scheduler._gen.scheduler.v1 import schedule_service_pb2_grpc as sgrpc

P = 8
PREFIX = "/api"
WORKER = str(Path(__file__).with_name("effect_worker.py"))
T = TypeVar("T")


def wait_until(fn: Callable[[], T | None], timeout: float, what: str, pause: float = 0.1) -> T:
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            got = fn()
            if got:
                return got
        except grpc.RpcError as e:
            last = e
        time.sleep(pause)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last error: {last})")


@dataclass
class ApiCluster:
    etcd: EtcdCluster
    planners: PlannerSet
    addresses: dict[str, str]
    channels: dict[str, grpc.Channel]
    worker: subprocess.Popen[bytes] | None = None

    def schedules(self, node: str = "a") -> sgrpc.ScheduleServiceStub:
        return sgrpc.ScheduleServiceStub(self.channels[node])

    def admin(self, node: str = "a") -> agrpc.AdminServiceStub:
        return agrpc.AdminServiceStub(self.channels[node])

    def close(self) -> None:
        for ch in self.channels.values():
            ch.close()
        if self.worker is not None and self.worker.poll() is None:
            os.kill(self.worker.pid, signal.SIGTERM)
            try:
                self.worker.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.worker.pid, signal.SIGKILL)
                self.worker.wait()
        if self.worker is not None:
            forget(self.worker.pid)
        self.planners.stop_all(10)
        self.planners.close()


def start_api_cluster(etcd: EtcdCluster, base: Path) -> ApiCluster:
    planners = PlannerSet(base / "planners", etcd.endpoints, PREFIX, partitions=P, settings=dict(API))
    addresses: dict[str, str] = {}
    cluster = ApiCluster(etcd, planners, addresses, {})
    try:
        for n in ("a", "b"):
            planners.start(n, settings={"api_port": "0"})
        for n in ("a", "b"):
            addresses[n] = planners[n].wait_serving()
        cluster.channels = {n: grpc.insecure_channel(a) for n, a in addresses.items()}
        for n, ch in cluster.channels.items():
            health = health_pb2_grpc.HealthStub(ch)
            wait_until(lambda h=health: h.Check(health_pb2.HealthCheckRequest(), timeout=1).status  # type: ignore[misc]
                       == health_pb2.HealthCheckResponse.SERVING, 30, f"planner {n} to serve")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SCHED_")}
        cluster.worker = spawn([sys.executable, WORKER, "--id", "w1", "--planners", ",".join(addresses.values()),
                                "--effects", str(base / "effects.log")], base / "worker.log", env=env)

        def ready() -> bool:
            st = cluster.admin().GetClusterStatus(apb.GetClusterStatusRequest(), timeout=5)
            return all(p.owner for p in st.partitions) and len(st.planners) == 2 and \
                any(w.connected_workers for w in st.worker_pools)

        wait_until(ready, 30, "every partition owned and the worker connected", pause=0.3)
    except BaseException:
        cluster.close()
        raise
    return cluster
