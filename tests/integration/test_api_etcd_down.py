"""UNAVAILABLE when etcd cannot be reached: a planner process serving the API keeps answering, with
the status that tells a client a write's outcome may be unknown, and serves again once etcd is back."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from chaos.infra.etcd import EtcdFactory
from chaos.infra.planners import PlannerSet
from scheduler._gen.scheduler.v1 import admin_service_pb2 as apb
from scheduler._gen.scheduler.v1 import admin_service_pb2_grpc as agrpc
from scheduler._gen.scheduler.v1 import schedule_pb2 as pb
from scheduler._gen.scheduler.v1 import schedule_service_pb2 as spb
from scheduler._gen.scheduler.v1 import schedule_service_pb2_grpc as sgrpc
from tests.integration.api_cluster import wait_until

pytestmark = pytest.mark.etcd


def test_etcd_down_is_unavailable_then_recovers(etcd_factory: EtcdFactory, tmp_path: Path) -> None:
    etcd = etcd_factory()
    planners = PlannerSet(tmp_path / "p", etcd.endpoints, "/down", partitions=4)
    try:
        _, address = planners.start_serving("solo")  # on a port of its own choosing
        with grpc.insecure_channel(address) as ch:
            stub, admin = sgrpc.ScheduleServiceStub(ch), agrpc.AdminServiceStub(ch)
            s = pb.Schedule(id="d1", tenant="t", spec="* * * * *", worker_pool="p", task_type="x")
            wait_until(lambda: stub.CreateSchedule(spb.CreateScheduleRequest(schedule=s), timeout=5), 30,
                       "the planner to serve")
            etcd.stop(0)
            for call, req in ((stub.GetSchedule, spb.GetScheduleRequest(id="d1")),
                              (stub.CreateSchedule, spb.CreateScheduleRequest(schedule=pb.Schedule(
                                  id="d2", tenant="t", spec="* * * * *", worker_pool="p", task_type="x"))),
                              (stub.ListSchedules, spb.ListSchedulesRequest())):
                with pytest.raises(grpc.RpcError) as e:
                    call(req, timeout=20)
                assert e.value.code() == grpc.StatusCode.UNAVAILABLE, e.value.details()
                assert "outcome is unknown" in (e.value.details() or "")
            # Validation does not need etcd: still INVALID_ARGUMENT, not UNAVAILABLE.
            with pytest.raises(grpc.RpcError) as bad:
                stub.GetSchedule(spb.GetScheduleRequest(id="no spaces"), timeout=20)
            assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert admin.GetTime(apb.GetTimeRequest(), timeout=5).node_id == "solo"
            etcd.restart(0)
            got = wait_until(lambda: stub.GetSchedule(spb.GetScheduleRequest(id="d1"), timeout=5), 30,
                             "the API to serve again")
            assert got.schedule.id == "d1"
            assert planners["solo"].running, planners.logs()
    finally:
        planners.stop_all(10)
        planners.close()
