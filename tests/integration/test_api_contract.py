"""Issue 5's API contract: every ScheduleService and AdminService method over a real gRPC channel
against real planner processes (two, so that "any node serves any schedule" is exercised), a real
etcd and a real worker, with the generated stubs directly. Success paths and error codes, malformed
and oversized input (the BadRequest field named in the rich status details), and that what a bad
request leaves behind is nothing.

The cluster is shared by the module (starting it is the slow part): tests use their own schedule
ids, and the drain test, which changes ownership, runs last.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.descriptor_pool import DescriptorPool
from google.protobuf.duration_pb2 import Duration
from google.protobuf.field_mask_pb2 import FieldMask
from google.protobuf.timestamp_pb2 import Timestamp
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from grpc_status import rpc_status

from chaos.infra.etcd import EtcdCluster
from scheduler._gen.scheduler.v1 import admin_service_pb2 as apb
from scheduler._gen.scheduler.v1 import cluster_pb2 as cpb
from scheduler._gen.scheduler.v1 import execution_pb2 as epb
from scheduler._gen.scheduler.v1 import schedule_pb2 as pb
from scheduler._gen.scheduler.v1 import schedule_service_pb2 as spb
from scheduler.execution import ErrorClass, ExecState, Execution, Trigger, dispatch, result
from scheduler.ids import FencingToken, execution_id
from scheduler.model import RetryPolicy
from scheduler.store.etcd import EtcdClient
from scheduler.store.keyspace import Keyspace, partition_for
from scheduler.store.ledger import Ledger
from tests.integration.api_cluster import PREFIX, ApiCluster, P, start_api_cluster, wait_until

pytestmark = pytest.mark.etcd


@pytest.fixture(scope="module")
def cluster(etcd_server: EtcdCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiCluster]:
    c = start_api_cluster(etcd_server, tmp_path_factory.mktemp("api"))
    try:
        yield c
    finally:
        c.close()


def sched(sid: str, **kw: object) -> pb.Schedule:
    fields: dict[str, object] = {"id": sid, "tenant": "acme", "spec": "*/5 * * * *", "worker_pool": "pool",
                                 "task_type": "effect"}
    fields.update(kw)
    return pb.Schedule(**fields)  # type: ignore[arg-type]


def ts(ms: int) -> Timestamp:
    t = Timestamp()
    t.FromMilliseconds(ms)
    return t


def fails(code: grpc.StatusCode, call: object, request: object, field: str | None = None) -> grpc.RpcError:
    """Call, expect `code`; for INVALID_ARGUMENT also the BadRequest field (when given)."""
    with pytest.raises(grpc.RpcError) as e:
        call(request, timeout=10)  # type: ignore[operator]
    err = e.value
    assert err.code() == code, f"{err.code()} {err.details()}"
    if field is not None:
        st = rpc_status.from_call(err)  # type: ignore[arg-type]
        assert st is not None, "INVALID_ARGUMENT without rich status details"
        br = error_details_pb2.BadRequest()
        assert st.details[0].Unpack(br)
        assert br.field_violations[0].field == field, br
    return err


# ---- health and reflection -------------------------------------------------------------------------


def test_health_and_reflection_list_every_service(cluster: ApiCluster) -> None:
    ch = cluster.channels["b"]
    health = health_pb2_grpc.HealthStub(ch)
    for name in ("", "scheduler.v1.ScheduleService", "scheduler.v1.AdminService", "scheduler.v1.WorkerService"):
        assert health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5).status == \
            health_pb2.HealthCheckResponse.SERVING
    fails(grpc.StatusCode.NOT_FOUND, health.Check, health_pb2.HealthCheckRequest(service="no.Such"))
    db = ProtoReflectionDescriptorDatabase(ch)
    services = set(db.get_services())
    assert {"scheduler.v1.ScheduleService", "scheduler.v1.AdminService", "scheduler.v1.WorkerService",
            "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= services
    pool = DescriptorPool(db)
    methods = {m.name for m in pool.FindServiceByName("scheduler.v1.ScheduleService").methods}
    assert {"CreateSchedule", "ListExecutions", "ListSkips", "Backfill", "DiscardDeadLetter"} <= methods
    assert {m.name for m in pool.FindServiceByName("scheduler.v1.AdminService").methods} == \
        {"GetClusterStatus", "Switchover", "SetWorkerAffinity", "DrainPlanner", "UndrainPlanner", "GetTime",
         "ListAuditEvents", "SetTenantQuota", "GetTenantQuota", "ListTenantQuotas", "DeleteTenantQuota"}


# ---- create / get --------------------------------------------------------------------------------------


def test_create_get_defaults_and_any_node(cluster: ApiCluster) -> None:
    a, b = cluster.schedules("a"), cluster.schedules("b")
    created = a.CreateSchedule(spb.CreateScheduleRequest(schedule=sched("c-1", labels={"team": "x"})), timeout=10)
    s = created.schedule
    assert s.version > 0 and s.HasField("created_at") and s.HasField("updated_at")
    assert s.state == pb.SCHEDULE_STATE_ACTIVE and s.time_zone == "UTC"
    assert s.policies.overlap == pb.OVERLAP_POLICY_SKIP and s.policies.retry.max_attempts == 3
    got = b.GetSchedule(spb.GetScheduleRequest(id="c-1"), timeout=10).schedule  # another node answers
    assert got == s
    fails(grpc.StatusCode.ALREADY_EXISTS, b.CreateSchedule, spb.CreateScheduleRequest(schedule=sched("c-1")))
    fails(grpc.StatusCode.NOT_FOUND, a.GetSchedule, spb.GetScheduleRequest(id="c-missing"))
    fails(grpc.StatusCode.INVALID_ARGUMENT, a.GetSchedule, spb.GetScheduleRequest(id="bad id"), "id")


def test_create_retry_with_request_id_is_idempotent(cluster: ApiCluster) -> None:
    a = cluster.schedules("a")
    req = spb.CreateScheduleRequest(schedule=sched("c-rid"), request_id="req-1")
    first = a.CreateSchedule(req, timeout=10).schedule
    again = cluster.schedules("b").CreateSchedule(req, timeout=10).schedule
    assert again == first
    other = spb.CreateScheduleRequest(schedule=sched("c-rid"), request_id="req-2")
    fails(grpc.StatusCode.ALREADY_EXISTS, a.CreateSchedule, other)
    # The same key with other fields is not a retry (an outside audit: it returned the first schedule as created).
    reused = spb.CreateScheduleRequest(schedule=sched("c-rid", spec="*/7 * * * *"), request_id="req-1")
    fails(grpc.StatusCode.ALREADY_EXISTS, a.CreateSchedule, reused)
    tz = sched("c-rid-tz", time_zone="Europe/Paris", labels={"a": "1"})
    tz.policies.retry.max_attempts = 1
    first_tz = a.CreateSchedule(spb.CreateScheduleRequest(schedule=tz, request_id="req-3"), timeout=10).schedule
    assert a.CreateSchedule(spb.CreateScheduleRequest(schedule=tz, request_id="req-3"), timeout=10).schedule == first_tz
    fails(grpc.StatusCode.INVALID_ARGUMENT, a.CreateSchedule,
          spb.CreateScheduleRequest(schedule=sched("c-rid2"), request_id="r" * 129), "request_id")


@pytest.mark.parametrize(("sid", "schedule", "field"), [
    ("bad-1", pb.Schedule(), "schedule.id"),
    ("bad-2", sched("bad-2", spec="61 * * * *"), "schedule.spec"),
    ("bad-3", sched("bad-3", payload=b"x" * (64 * 1024 + 1)), "schedule.payload"),
    ("bad-4", sched("bad-4", labels={f"k{i}": "v" for i in range(33)}), "schedule.labels"),
    ("bad-5", sched("bad-5", labels={"ok": "v" * 257}), "schedule.labels['ok']"),
    ("x" * 129, sched("x" * 129), "schedule.id"),
    ("a@b", sched("a@b"), "schedule.id"),
    ("bad-6", sched("bad-6", tenant=""), "schedule.tenant"),
    ("bad-7", sched("bad-7", time_zone="Mars/Olympus"), "schedule.time_zone"),
    ("bad-8", sched("bad-8", start_at=ts(2_000_000_000_000), end_at=ts(1_000_000_000_000)), "schedule.end_at"),
    ("bad-9", sched("bad-9", policies=pb.SchedulePolicies(overlap=42)), "schedule.policies.overlap"),  # type: ignore[arg-type]
    ("bad-10", sched("bad-10", policies=pb.SchedulePolicies(retry=pb.RetryPolicy(max_attempts=0))),
     "schedule.policies.retry.max_attempts"),
])
def test_create_refuses_malformed_input_and_stores_nothing(cluster: ApiCluster, sid: str, schedule: pb.Schedule,
                                                           field: str) -> None:
    a = cluster.schedules("a")
    err = fails(grpc.StatusCode.INVALID_ARGUMENT, a.CreateSchedule, spb.CreateScheduleRequest(schedule=schedule))
    st = rpc_status.from_call(err)  # type: ignore[arg-type]
    assert st is not None
    br = error_details_pb2.BadRequest()
    st.details[0].Unpack(br)
    assert br.field_violations[0].field.startswith(field), br
    assert br.field_violations[0].description
    if "@" not in sid and len(sid) <= 128 and sid:
        fails(grpc.StatusCode.NOT_FOUND, a.GetSchedule, spb.GetScheduleRequest(id=sid))


def test_missing_schedule_and_oversized_message(cluster: ApiCluster) -> None:
    a = cluster.schedules("a")
    fails(grpc.StatusCode.INVALID_ARGUMENT, a.CreateSchedule, spb.CreateScheduleRequest(), "schedule")
    # Over the server's 32 MiB message limit: refused by gRPC itself, and the server keeps serving.
    fails(grpc.StatusCode.RESOURCE_EXHAUSTED, a.CreateSchedule,
          spb.CreateScheduleRequest(schedule=sched("huge", payload=b"x" * (33 * 1024 * 1024))))
    fails(grpc.StatusCode.NOT_FOUND, a.GetSchedule, spb.GetScheduleRequest(id="huge"))
    assert cluster.admin("a").GetTime(apb.GetTimeRequest(), timeout=5).node_id == "a"


# ---- update / delete -------------------------------------------------------------------------------------


def test_update_mask_version_and_errors(cluster: ApiCluster) -> None:
    a, b = cluster.schedules("a"), cluster.schedules("b")
    v1 = a.CreateSchedule(spb.CreateScheduleRequest(schedule=sched("u-1", labels={"team": "x"})), timeout=10).schedule
    r = b.UpdateSchedule(spb.UpdateScheduleRequest(schedule=pb.Schedule(id="u-1", spec="*/10 * * * *"),
                                                   update_mask=FieldMask(paths=["spec"]),
                                                   expected_version=v1.version), timeout=10).schedule
    assert r.spec == "*/10 * * * *" and r.version != v1.version and dict(r.labels) == {"team": "x"}
    assert r.created_at == v1.created_at
    # Stale version: ABORTED, nothing changes.
    fails(grpc.StatusCode.ABORTED, a.UpdateSchedule, spb.UpdateScheduleRequest(
        schedule=pb.Schedule(id="u-1", spec="* * * * *"), update_mask=FieldMask(paths=["spec"]),
        expected_version=v1.version))
    # Empty mask: only the set fields (one policy leaf; the others stay).
    r2 = a.UpdateSchedule(spb.UpdateScheduleRequest(schedule=pb.Schedule(
        id="u-1", policies=pb.SchedulePolicies(overlap=pb.OVERLAP_POLICY_ALLOW_ALL))), timeout=10).schedule
    assert r2.policies.overlap == pb.OVERLAP_POLICY_ALLOW_ALL and r2.spec == "*/10 * * * *"
    assert r2.policies.retry == r.policies.retry
    for mask, field in ((["id"], "update_mask"), (["tenant"], "update_mask"), (["state"], "update_mask"),
                        (["no_such"], "update_mask")):
        fails(grpc.StatusCode.INVALID_ARGUMENT, a.UpdateSchedule, spb.UpdateScheduleRequest(
            schedule=pb.Schedule(id="u-1"), update_mask=FieldMask(paths=mask)), field)
    fails(grpc.StatusCode.INVALID_ARGUMENT, a.UpdateSchedule, spb.UpdateScheduleRequest(
        schedule=pb.Schedule(id="u-1", spec="nonsense"), update_mask=FieldMask(paths=["spec"])), None)
    fails(grpc.StatusCode.INVALID_ARGUMENT, a.UpdateSchedule, spb.UpdateScheduleRequest(
        schedule=pb.Schedule(id="u-1", payload=b"x" * 70_000), update_mask=FieldMask(paths=["payload"])),
        "schedule.payload")
    fails(grpc.StatusCode.NOT_FOUND, a.UpdateSchedule, spb.UpdateScheduleRequest(
        schedule=pb.Schedule(id="u-missing", spec="* * * * *"), update_mask=FieldMask(paths=["spec"])))
    # None of the refused updates changed the stored schedule.
    assert a.GetSchedule(spb.GetScheduleRequest(id="u-1"), timeout=10).schedule == r2


def test_delete_versions_missing_and_history_kept(cluster: ApiCluster) -> None:
    a = cluster.schedules("a")
    v = a.CreateSchedule(spb.CreateScheduleRequest(schedule=sched("d-1")), timeout=10).schedule.version
    fails(grpc.StatusCode.ABORTED, a.DeleteSchedule, spb.DeleteScheduleRequest(id="d-1", expected_version=v + 1000))
    a.GetSchedule(spb.GetScheduleRequest(id="d-1"), timeout=10)  # still there
    a.DeleteSchedule(spb.DeleteScheduleRequest(id="d-1", expected_version=v), timeout=10)
    fails(grpc.StatusCode.NOT_FOUND, a.GetSchedule, spb.GetScheduleRequest(id="d-1"))
    fails(grpc.StatusCode.NOT_FOUND, a.DeleteSchedule, spb.DeleteScheduleRequest(id="d-1"))
    a.DeleteSchedule(spb.DeleteScheduleRequest(id="d-1", allow_missing=True), timeout=10)
    # The id is free again.
    a.CreateSchedule(spb.CreateScheduleRequest(schedule=sched("d-1")), timeout=10)


# ---- list -----------------------------------------------------------------------------------------------


def test_list_filters_selector_and_paging(cluster: ApiCluster) -> None:
    a = cluster.schedules("a")
    for i in range(7):
        a.CreateSchedule(spb.CreateScheduleRequest(schedule=sched(
            f"l-{i}", tenant="listing", labels={"env": "prod" if i % 2 else "dev", "idx": str(i)})), timeout=10)
    a.PauseSchedule(spb.PauseScheduleRequest(id="l-3"), timeout=10)
    ids: list[str] = []
    token = ""
    pages = 0
    while True:
        r = a.ListSchedules(spb.ListSchedulesRequest(tenant="listing", page_size=3, page_token=token), timeout=10)
        ids += [s.id for s in r.schedules]
        pages += 1
        token = r.next_page_token
        if not token:
            break
    assert ids == [f"l-{i}" for i in range(7)] and pages == 3
    sel = a.ListSchedules(spb.ListSchedulesRequest(tenant="listing", label_selector="env=prod, idx notin (5)"),
                          timeout=10)
    assert [s.id for s in sel.schedules] == ["l-1", "l-3"]
    sel2 = a.ListSchedules(spb.ListSchedulesRequest(tenant="listing", label_selector="env in (dev),!nope"),
                           timeout=10)
    assert [s.id for s in sel2.schedules] == ["l-0", "l-2", "l-4", "l-6"]
    paused = a.ListSchedules(spb.ListSchedulesRequest(tenant="listing", state=pb.SCHEDULE_STATE_PAUSED), timeout=10)
    assert [s.id for s in paused.schedules] == ["l-3"]
    first = a.ListSchedules(spb.ListSchedulesRequest(tenant="listing", page_size=2), timeout=10)
    fails(grpc.StatusCode.INVALID_ARGUMENT, a.ListSchedules, spb.ListSchedulesRequest(
        tenant="other", page_size=2, page_token=first.next_page_token), "page_token")
    fails(grpc.StatusCode.INVALID_ARGUMENT, a.ListSchedules, spb.ListSchedulesRequest(page_token="garbage"),
          "page_token")
    fails(grpc.StatusCode.INVALID_ARGUMENT, a.ListSchedules, spb.ListSchedulesRequest(label_selector="env in (a"),
          "label_selector")
    fails(grpc.StatusCode.INVALID_ARGUMENT, a.ListSchedules, spb.ListSchedulesRequest(page_size=-1), "page_size")
    fails(grpc.StatusCode.INVALID_ARGUMENT, a.ListSchedules, spb.ListSchedulesRequest(tenant="a b"), "tenant")
    big = a.ListSchedules(spb.ListSchedulesRequest(tenant="listing", page_size=10**6), timeout=10)
    assert len(big.schedules) == 7 and not big.next_page_token  # clamped, not refused


# ---- pause / resume / preview ---------------------------------------------------------------------------


def test_pause_resume(cluster: ApiCluster) -> None:
    a, b = cluster.schedules("a"), cluster.schedules("b")
    v0 = a.CreateSchedule(spb.CreateScheduleRequest(schedule=sched("p-1")), timeout=10).schedule.version
    fails(grpc.StatusCode.ABORTED, a.PauseSchedule, spb.PauseScheduleRequest(id="p-1", expected_version=v0 + 999))
    p = b.PauseSchedule(spb.PauseScheduleRequest(id="p-1", reason="maintenance", expected_version=v0),
                        timeout=10).schedule
    assert p.state == pb.SCHEDULE_STATE_PAUSED and p.paused_reason == "maintenance"
    same = a.PauseSchedule(spb.PauseScheduleRequest(id="p-1", reason="maintenance"), timeout=10).schedule
    assert same.version == p.version  # nothing to change
    fails(grpc.StatusCode.INVALID_ARGUMENT, a.PauseSchedule, spb.PauseScheduleRequest(id="p-1", reason="x" * 1025),
          "reason")
    r = a.ResumeSchedule(spb.ResumeScheduleRequest(id="p-1"), timeout=10).schedule
    assert r.state == pb.SCHEDULE_STATE_ACTIVE and r.paused_reason == ""
    assert a.ResumeSchedule(spb.ResumeScheduleRequest(id="p-1"), timeout=10).schedule.version == r.version
    fails(grpc.StatusCode.NOT_FOUND, a.PauseSchedule, spb.PauseScheduleRequest(id="p-missing"))
    created_paused = a.CreateSchedule(spb.CreateScheduleRequest(schedule=sched(
        "p-2", state=pb.SCHEDULE_STATE_PAUSED, paused_reason="later")), timeout=10).schedule
    assert created_paused.state == pb.SCHEDULE_STATE_PAUSED and created_paused.paused_reason == "later"


def test_preview(cluster: ApiCluster) -> None:
    a = cluster.schedules("b")
    after = 1_795_946_400_000  # 2026-11-29T10:00:00Z
    r = a.PreviewSchedule(spb.PreviewScheduleRequest(spec=spb.PreviewSpec(spec="*/5 * * * *"), after=ts(after),
                                                     count=3), timeout=10)
    assert [t.ToMilliseconds() - after for t in r.planned_times] == [300_000, 600_000, 900_000]
    a.CreateSchedule(spb.CreateScheduleRequest(schedule=sched("pv-1", spec="0 12 * * *",
                                                              time_zone="Europe/London")), timeout=10)
    r2 = a.PreviewSchedule(spb.PreviewScheduleRequest(schedule_id="pv-1", after=ts(after)), timeout=10)
    assert len(r2.planned_times) == 10 and r2.planned_times[0].ToMilliseconds() == after + 2 * 3_600_000
    ended = a.PreviewSchedule(spb.PreviewScheduleRequest(
        spec=spb.PreviewSpec(spec="@every 1h", end_at=ts(after + 2 * 3_600_000)), after=ts(after)), timeout=10)
    assert len(ended.planned_times) == 2
    fails(grpc.StatusCode.INVALID_ARGUMENT, a.PreviewSchedule, spb.PreviewScheduleRequest(
        spec=spb.PreviewSpec(spec="61 * * * *")), None)
    fails(grpc.StatusCode.INVALID_ARGUMENT, a.PreviewSchedule, spb.PreviewScheduleRequest(
        schedule_id="pv-1", count=1001), "count")
    fails(grpc.StatusCode.INVALID_ARGUMENT, a.PreviewSchedule, spb.PreviewScheduleRequest(), "source")
    # H inside a list is hashed from the id too (an audit: only whole fields starting with H were caught).
    fails(grpc.StatusCode.INVALID_ARGUMENT, a.PreviewSchedule, spb.PreviewScheduleRequest(
        spec=spb.PreviewSpec(spec="0,H * * * *")), "spec.schedule_id")
    fails(grpc.StatusCode.INVALID_ARGUMENT, a.PreviewSchedule, spb.PreviewScheduleRequest(
        spec=spb.PreviewSpec(spec="* * * * *", time_zone="localtime")), "spec.time_zone")
    fails(grpc.StatusCode.NOT_FOUND, a.PreviewSchedule, spb.PreviewScheduleRequest(schedule_id="pv-missing"))
    # The planning window, 1900..9990 (docs/time.md), as offline preview: 1950 was refused naming 1970 (an audit).
    old = a.PreviewSchedule(spb.PreviewScheduleRequest(spec=spb.PreviewSpec(spec="0 0 1 1 *"), count=1,
                                                       after=ts(-631_152_000_000)), timeout=10)  # 1950-01-01
    assert [t.ToMilliseconds() for t in old.planned_times] == [-599_616_000_000]  # 1951-01-01
    fails(grpc.StatusCode.INVALID_ARGUMENT, a.PreviewSchedule, spb.PreviewScheduleRequest(
        spec=spb.PreviewSpec(spec="0 0 1 1 *"), after=ts(-2_240_524_800_000)), "after")  # 1899: before the window


# ---- executions (a real worker runs them) -------------------------------------------------------------


def test_executions_get_list_filters_paging(cluster: ApiCluster) -> None:
    a, b = cluster.schedules("a"), cluster.schedules("b")
    a.CreateSchedule(spb.CreateScheduleRequest(schedule=sched("e-1", spec="* * * * * *")), timeout=10)

    def succeeded() -> list[epb.Execution]:
        r = b.ListExecutions(spb.ListExecutionsRequest(schedule_id="e-1",
                                                       states=[epb.EXECUTION_STATE_SUCCEEDED]), timeout=10)
        return list(r.executions) if len(r.executions) >= 3 else []

    done = wait_until(succeeded, 30, "three succeeded executions of e-1")
    a.PauseSchedule(spb.PauseScheduleRequest(id="e-1"), timeout=10)  # stop the stream of new ones
    e0 = done[0]
    assert e0.schedule_id == "e-1" and e0.tenant == "acme" and e0.trigger == epb.TRIGGER_SCHEDULED
    assert e0.attempts[0].planner_id in ("a", "b") and e0.attempts[0].outcome == epb.ATTEMPT_OUTCOME_SUCCEEDED
    assert e0.attempts[0].worker_id == "w1"
    assert e0.attempts[0].fencing_token.revision > 0
    got = a.GetExecution(spb.GetExecutionRequest(execution_id=e0.execution_id), timeout=10).execution
    assert got.execution_id == e0.execution_id and got.state == epb.EXECUTION_STATE_SUCCEEDED
    planned = [e.planned_at.ToMilliseconds() for e in done]
    assert planned == sorted(planned)
    # Time range [second, third): exactly the second one.
    rng = a.ListExecutions(spb.ListExecutionsRequest(schedule_id="e-1", planned=spb.TimeRange(
        start=ts(planned[1]), end=ts(planned[2]))), timeout=10)
    assert [e.planned_at.ToMilliseconds() for e in rng.executions] == [planned[1]]
    # Paging, oldest first and newest first.
    seen: list[int] = []
    token = ""
    while True:
        r = a.ListExecutions(spb.ListExecutionsRequest(schedule_id="e-1", page_size=1, page_token=token,
                                                       newest_first=True), timeout=10)
        seen += [e.planned_at.ToMilliseconds() for e in r.executions]
        token = r.next_page_token
        if not token:
            break
    assert seen == sorted(seen, reverse=True) and len(seen) >= 3
    # Across schedules: storage order, bounded pages; following the tokens finds them all, each once.
    across: list[str] = []
    token = ""
    while True:
        r = a.ListExecutions(spb.ListExecutionsRequest(tenant="acme", states=[epb.EXECUTION_STATE_SUCCEEDED],
                                                       page_size=2, page_token=token), timeout=10)
        across += [e.execution_id for e in r.executions]
        token = r.next_page_token
        if not token:
            break
    assert {e.execution_id for e in done} <= set(across) and len(across) == len(set(across))
    fails(grpc.StatusCode.INVALID_ARGUMENT, a.ListExecutions, spb.ListExecutionsRequest(newest_first=True),
          "newest_first")
    # The pause above leaves planned times not run: ListSkips says so, with the reason.

    def paused_skips() -> list[spb.SkippedTime]:
        r = b.ListSkips(spb.ListSkipsRequest(schedule_id="e-1"), timeout=10)
        return [x for x in r.skips if x.reason == epb.SKIP_REASON_PAUSED]

    skipped = wait_until(paused_skips, 30, "a planned time of e-1 skipped as paused")
    assert all(x.schedule_id == "e-1" and x.HasField("planned_at") for x in skipped)
    fails(grpc.StatusCode.INVALID_ARGUMENT, a.ListSkips, spb.ListSkipsRequest(), "schedule_id")
    fails(grpc.StatusCode.NOT_FOUND, a.GetExecution, spb.GetExecutionRequest(
        execution_id="e-1@2001-01-01T00:00:00.000Z"))
    for bad in ("e-1", "e-1@2026-11-29T10:00:00Z", "e 1@2026-11-29T10:00:00.000Z", "x" * 1000):
        fails(grpc.StatusCode.INVALID_ARGUMENT, a.GetExecution, spb.GetExecutionRequest(execution_id=bad),
              "execution_id")
    fails(grpc.StatusCode.INVALID_ARGUMENT, a.ListExecutions, spb.ListExecutionsRequest(states=[77]),  # type: ignore[list-item]
          "states[0]")
    fails(grpc.StatusCode.INVALID_ARGUMENT, a.ListExecutions, spb.ListExecutionsRequest(
        planned=spb.TimeRange(start=ts(2000), end=ts(1000))), "planned.end")
    fails(grpc.StatusCode.INVALID_ARGUMENT, a.ListExecutions, spb.ListExecutionsRequest(
        schedule_id="e-1", page_token=r.next_page_token or "Zm9v"), "page_token")


# ---- dead letters -------------------------------------------------------------------------------------


async def _write_dead_letters(cluster: ApiCluster, n: int, sid: str = "dl-job", pool: str = "pool") -> list[str]:
    """Dead letters as the planner records them (the CAS into dead_letter writes the index too)."""
    ks, ledger = Keyspace(PREFIX), Ledger(Keyspace(PREFIX), P)
    ids = []
    async with EtcdClient(cluster.etcd.config()) as kv:
        for i in range(n):
            ms = 1_795_946_400_000 + i * 60_000
            e = Execution(execution_id(sid, ms), sid, "acme" if i < 2 else "other", pool,
                          "effect" if i != 1 else "mail", ms, ms, Trigger.SCHEDULED, RetryPolicy(max_attempts=1),
                          60_000)
            e = dispatch(e, worker="w", planner="a", token=FencingToken(1, 5), now_ms=ms)
            e, _ = result(e, 1, succeeded=False, error_class=ErrorClass.PERMANENT, message="bad payload", now_ms=ms)
            assert e.state is ExecState.DEAD_LETTER
            r = await kv.txn([], [ledger.cas_op(e, 0, payload=b"pay%d" % i, now_ms=ms + 10)])
            assert r.succeeded and all(Ledger.cas_results(r))
            ids.append(e.id)
    del ks
    return ids


def test_list_dead_letters(cluster: ApiCluster) -> None:
    ids = asyncio.run(_write_dead_letters(cluster, 3))
    a = cluster.schedules("b")
    r = a.ListDeadLetters(spb.ListDeadLettersRequest(schedule_id="dl-job"), timeout=10)
    assert [d.execution.execution_id for d in r.dead_letters] == ids  # oldest dead_lettered_at first
    d0 = r.dead_letters[0]
    assert d0.payload == b"pay0" and d0.reason == "permanent error"
    assert d0.execution.state == epb.EXECUTION_STATE_DEAD_LETTER
    assert d0.execution.attempts[0].error_class == epb.ERROR_CLASS_PERMANENT
    assert [d.execution.execution_id for d in a.ListDeadLetters(spb.ListDeadLettersRequest(
        tenant="acme", task_type="effect"), timeout=10).dead_letters] == [ids[0]]
    p1 = a.ListDeadLetters(spb.ListDeadLettersRequest(schedule_id="dl-job", page_size=2), timeout=10)
    p2 = a.ListDeadLetters(spb.ListDeadLettersRequest(schedule_id="dl-job", page_size=2,
                                                      page_token=p1.next_page_token), timeout=10)
    assert [d.execution.execution_id for d in (*p1.dead_letters, *p2.dead_letters)] == ids and not p2.next_page_token
    window = a.ListDeadLetters(spb.ListDeadLettersRequest(dead_lettered=spb.TimeRange(
        start=ts(1_795_946_400_000 + 60_000), end=ts(1_795_946_400_000 + 120_000))), timeout=10)
    assert [d.execution.execution_id for d in window.dead_letters] == [ids[1]]
    fails(grpc.StatusCode.INVALID_ARGUMENT, a.ListDeadLetters, spb.ListDeadLettersRequest(task_type="a/b"),
          "task_type")
    fails(grpc.StatusCode.INVALID_ARGUMENT, a.ListDeadLetters, spb.ListDeadLettersRequest(
        schedule_id="dl-job", page_token=p1.next_page_token, tenant="x"), "page_token")


# ---- pages within a default client's receive limit ------------------------------------------------------

DEFAULT_RECEIVE_LIMIT = 4 * 1024 * 1024  # what grpcurl and a channel made without options accept


async def _write_bulky(cluster: ApiCluster, sid: str, n: int) -> list[str]:
    """`n` records whose attempt kept 4 KiB of stdout and of stderr (a shell task's tails), and the same
    as dead letters with a 64 KiB payload: about 8.5 KiB an execution, 73 KiB a dead letter."""
    ledger = Ledger(Keyspace(PREFIX), P)
    ids = []
    async with EtcdClient(cluster.etcd.config()) as kv:
        ops = []
        for i in range(n):
            ms = 1_795_946_400_000 + i * 1000
            e = Execution(execution_id(sid, ms), sid, "bulky", "pool", "effect", ms, ms, Trigger.SCHEDULED,
                          RetryPolicy(max_attempts=1), 60_000)
            e = dispatch(e, worker="w", planner="a", token=FencingToken(1, 5), now_ms=ms)
            e, _ = result(e, 1, succeeded=False, error_class=ErrorClass.PERMANENT, message="bad", now_ms=ms,
                          output=("o" * 4096, "e" * 4096, 1))
            assert e.state is ExecState.DEAD_LETTER
            ops.append(ledger.cas_op(e, 0, payload=bytes([i % 256]) * 65536, now_ms=ms + 10))
            ids.append(e.id)
        for i in range(0, len(ops), 10):  # (etcd takes at most 1.5 MiB a request)
            r = await kv.txn([], ops[i:i + 10])
            assert r.succeeded and all(Ledger.cas_results(r))
    return ids


def _all_pages(call: object, request: object, entries: str) -> list[object]:
    got: list[object] = []
    while True:
        r = call(request, timeout=30)  # type: ignore[operator]
        assert r.ByteSize() < DEFAULT_RECEIVE_LIMIT
        got += list(getattr(r, entries))
        if not r.next_page_token:
            return got
        request.page_token = r.next_page_token  # type: ignore[attr-defined]


def test_a_page_of_large_entries_fits_a_default_clients_receive_limit(cluster: ApiCluster) -> None:
    """A page of 100 schedules or dead letters with 64 KiB payloads was 6.5 MiB: past the 4 MiB a default
    gRPC client accepts, the call failed RESOURCE_EXHAUSTED at the default page size, and `grpcurl` could
    not list them at all. A page now ends early with a token; every entry is listed once, in order."""
    a = cluster.schedules("a")  # a channel made without options: 4 MiB
    big = bytes(range(256)) * 256  # 64 KiB, the limit
    sids = [f"bulky-{i:03d}" for i in range(120)]
    for sid in sids:
        a.CreateSchedule(spb.CreateScheduleRequest(schedule=sched(sid, tenant="bulky", payload=big)), timeout=10)
    for size in (0, 1000):
        listed = _all_pages(a.ListSchedules, spb.ListSchedulesRequest(tenant="bulky", page_size=size), "schedules")
        assert [x.id for x in listed] == sids  # type: ignore[attr-defined]
    ids = asyncio.run(_write_bulky(cluster, "bulky-dl", 600))
    dead = _all_pages(a.ListDeadLetters, spb.ListDeadLettersRequest(schedule_id="bulky-dl", page_size=1000),
                      "dead_letters")
    assert [d.execution.execution_id for d in dead] == ids  # type: ignore[attr-defined]
    for req in (spb.ListExecutionsRequest(schedule_id="bulky-dl", page_size=1000),
                spb.ListExecutionsRequest(tenant="bulky", page_size=1000)):  # (every schedule's: key order)
        execs = _all_pages(a.ListExecutions, req, "executions")
        assert [x.execution_id for x in execs] == ids  # type: ignore[attr-defined]
    for sid in sids:
        a.DeleteSchedule(spb.DeleteScheduleRequest(id=sid), timeout=10)


# ---- operations behind the adapters -------------------------------------------------------------------


def test_operation_calls_validate_input_first(cluster: ApiCluster) -> None:
    """Input errors are answered at the edge, before the operations behind them run."""
    a = cluster.schedules("a")
    fails(grpc.StatusCode.INVALID_ARGUMENT, a.TriggerSchedule, spb.TriggerScheduleRequest(id=""), "id")
    fails(grpc.StatusCode.INVALID_ARGUMENT, a.RerunExecution, spb.RerunExecutionRequest(schedule_id="x"),
          "planned_at")
    fails(grpc.StatusCode.INVALID_ARGUMENT, a.CancelExecution, spb.CancelExecutionRequest(execution_id="x@y"),
          "execution_id")
    fails(grpc.StatusCode.INVALID_ARGUMENT, a.ReplayDeadLetter, spb.ReplayDeadLetterRequest(execution_id="x"),
          "execution_id")
    fails(grpc.StatusCode.INVALID_ARGUMENT, a.DiscardDeadLetter, spb.DiscardDeadLetterRequest(execution_id="x"),
          "execution_id")
    with pytest.raises(grpc.RpcError) as e:
        list(a.Backfill(spb.BackfillRequest(schedule_id="x", start_time=ts(5000), end_time=ts(1000)), timeout=10))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def now_ms() -> int:
    return int(time.time() * 1000)


def wait_state(stub: object, eid: str, state: int, timeout: float = 30) -> epb.Execution:
    def got() -> epb.Execution | None:
        e = stub.GetExecution(spb.GetExecutionRequest(execution_id=eid), timeout=10).execution  # type: ignore[attr-defined]
        return e if e.state == state else None

    return wait_until(got, timeout, f"{eid} to be {epb.ExecutionState.Name(state)}")


def test_trigger_runs_now_and_retries_are_idempotent(cluster: ApiCluster) -> None:
    a, b = cluster.schedules("a"), cluster.schedules("b")
    a.CreateSchedule(spb.CreateScheduleRequest(schedule=sched("op-t", spec="0 0 1 1 *")), timeout=10)
    e = b.TriggerSchedule(spb.TriggerScheduleRequest(id="op-t"), timeout=10).execution
    assert e.trigger == epb.TRIGGER_MANUAL and e.execution_id.startswith("op-t@")
    done = wait_state(a, e.execution_id, epb.EXECUTION_STATE_SUCCEEDED)  # the worker ran it
    assert done.attempts[0].outcome == epb.ATTEMPT_OUTCOME_SUCCEEDED
    at = ts(now_ms() // 1000 * 1000)
    first = a.TriggerSchedule(spb.TriggerScheduleRequest(id="op-t", trigger_time=at), timeout=10).execution
    again = b.TriggerSchedule(spb.TriggerScheduleRequest(id="op-t", trigger_time=at), timeout=10).execution
    assert first.execution_id == again.execution_id
    fails(grpc.StatusCode.INVALID_ARGUMENT, a.TriggerSchedule, spb.TriggerScheduleRequest(
        id="op-t", trigger_time=ts(now_ms() - 3_600_000)), "trigger_time")  # beyond the skew allowance
    fails(grpc.StatusCode.NOT_FOUND, a.TriggerSchedule, spb.TriggerScheduleRequest(id="op-missing"))
    a.PauseSchedule(spb.PauseScheduleRequest(id="op-t"), timeout=10)
    fails(grpc.StatusCode.FAILED_PRECONDITION, a.TriggerSchedule, spb.TriggerScheduleRequest(id="op-t"))


def test_rerun_a_planned_time(cluster: ApiCluster) -> None:
    a = cluster.schedules("a")
    a.CreateSchedule(spb.CreateScheduleRequest(schedule=sched("op-r", spec="*/5 * * * *")), timeout=10)
    planned = now_ms() // 300_000 * 300_000 - 300_000  # a past planned time, before the schedule existed
    e = a.RerunExecution(spb.RerunExecutionRequest(schedule_id="op-r", planned_at=ts(planned)), timeout=10).execution
    assert e.execution_id == execution_id("op-r", planned)
    wait_state(a, e.execution_id, epb.EXECUTION_STATE_SUCCEEDED)
    again = a.RerunExecution(spb.RerunExecutionRequest(schedule_id="op-r", planned_at=ts(planned)),
                             timeout=10).execution  # the same id, a new attempt
    assert again.execution_id == e.execution_id
    ran = wait_state(a, e.execution_id, epb.EXECUTION_STATE_SUCCEEDED)
    assert ran.attempt == 2 and len(ran.attempts) == 2
    fails(grpc.StatusCode.INVALID_ARGUMENT, a.RerunExecution, spb.RerunExecutionRequest(
        schedule_id="op-r", planned_at=ts(planned + 60_000)), "planned_at")  # not a planned time
    fails(grpc.StatusCode.INVALID_ARGUMENT, a.RerunExecution, spb.RerunExecutionRequest(
        schedule_id="op-r", planned_at=ts(planned + 3_600_000)), "planned_at")  # in the future
    fails(grpc.StatusCode.NOT_FOUND, a.RerunExecution, spb.RerunExecutionRequest(
        schedule_id="op-none", planned_at=ts(planned)))


def test_rerun_of_a_scheduled_run_records_the_run_per_attempt(cluster: ApiCluster) -> None:
    a = cluster.schedules("b")
    a.CreateSchedule(spb.CreateScheduleRequest(schedule=sched("op-r2", spec="* * * * * *")), timeout=10)

    def one_done() -> epb.Execution | None:
        r = a.ListExecutions(spb.ListExecutionsRequest(schedule_id="op-r2", states=[epb.EXECUTION_STATE_SUCCEEDED]),
                             timeout=10)
        return r.executions[0] if r.executions else None

    first = wait_until(one_done, 30, "a succeeded execution of op-r2")
    assert first.trigger == epb.TRIGGER_SCHEDULED
    a.RerunExecution(spb.RerunExecutionRequest(schedule_id="op-r2", planned_at=first.planned_at), timeout=10)

    def rerun_done() -> epb.Execution | None:
        e = a.GetExecution(spb.GetExecutionRequest(execution_id=first.execution_id), timeout=10).execution
        return e if e.state == epb.EXECUTION_STATE_SUCCEEDED and e.attempt == 2 else None

    again = wait_until(rerun_done, 30, "the rerun to succeed")
    a.PauseSchedule(spb.PauseScheduleRequest(id="op-r2"), timeout=10)
    assert again.trigger == epb.TRIGGER_SCHEDULED  # how it came to exist never changes
    assert [x.trigger for x in again.attempts] == [epb.TRIGGER_SCHEDULED, epb.TRIGGER_RERUN]


def test_backfill_streams_progress_and_is_safe_to_repeat(cluster: ApiCluster) -> None:
    a = cluster.schedules("b")
    a.CreateSchedule(spb.CreateScheduleRequest(schedule=sched("op-b", spec="* * * * *", worker_pool="nopool")),
                     timeout=10)
    end = now_ms() // 60_000 * 60_000 - 60_000
    start = end - 250 * 60_000  # 250 planned times: more than one batch
    req = spb.BackfillRequest(schedule_id="op-b", start_time=ts(start), end_time=ts(end), dry_run=True)
    dry = list(a.Backfill(req, timeout=30))
    # The backfill's own default (BUFFER_ALL), not the schedule's SKIP: every planned time (issue 9, item 6).
    assert (dry[-1].done, dry[-1].planned, dry[-1].created, dry[-1].skipped) == (True, 250, 250, 0)
    req.overlap_policy = pb.OVERLAP_POLICY_SKIP  # asked for: all but the first skipped
    skipping = list(a.Backfill(req, timeout=30))
    assert (skipping[-1].planned, skipping[-1].created, skipping[-1].skipped) == (250, 1, 249)
    assert len(dry) > 1 and [m.planned for m in dry] == sorted(m.planned for m in dry)
    # The schedule's own runs (a minute boundary can pass during the test) are not the backfill's.
    def backfilled() -> list[epb.Execution]:
        got = a.ListExecutions(spb.ListExecutionsRequest(schedule_id="op-b", page_size=1000), timeout=10)
        return [e for e in got.executions if e.trigger != epb.TRIGGER_SCHEDULED]

    assert not backfilled()  # a dry run writes nothing
    req.dry_run = False
    req.overlap_policy = pb.OVERLAP_POLICY_ALLOW_ALL  # this backfill's own policy
    real = list(a.Backfill(req, timeout=30))
    assert (real[-1].planned, real[-1].created, real[-1].existing, real[-1].done) == (250, 250, 0, True)
    assert real[-1].processed_until.ToMilliseconds() == end
    repeat = list(a.Backfill(req, timeout=30))
    assert (repeat[-1].created, repeat[-1].existing) == (0, 250)
    got = backfilled()
    assert len(got) == 250 and {e.trigger for e in got} == {epb.TRIGGER_BACKFILL}
    with pytest.raises(grpc.RpcError) as e:
        list(a.Backfill(spb.BackfillRequest(schedule_id="op-b", start_time=ts(start), end_time=ts(now_ms() + 600_000)),
                        timeout=30))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    a.CreateSchedule(spb.CreateScheduleRequest(schedule=sched("op-b2", spec="* * * * * *")), timeout=10)
    with pytest.raises(grpc.RpcError) as e2:  # two days of seconds: over the backfill limit
        list(a.Backfill(spb.BackfillRequest(schedule_id="op-b2", start_time=ts(end - 2 * 86_400_000),
                                            end_time=ts(end)), timeout=30))
    assert e2.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert not a.ListExecutions(spb.ListExecutionsRequest(schedule_id="op-b2", planned=spb.TimeRange(
        end=ts(end))), timeout=10).executions  # refused before writing anything


def test_cancel_execution(cluster: ApiCluster) -> None:
    a = cluster.schedules("a")
    a.CreateSchedule(spb.CreateScheduleRequest(schedule=sched("op-c", spec="0 0 1 1 *", worker_pool="nopool")),
                     timeout=10)
    e = a.TriggerSchedule(spb.TriggerScheduleRequest(id="op-c"), timeout=10).execution  # no worker: it waits
    c = a.CancelExecution(spb.CancelExecutionRequest(execution_id=e.execution_id, reason="not needed"),
                          timeout=10).execution
    assert c.state == epb.EXECUTION_STATE_CANCELLED and c.state_message == "not needed"
    fails(grpc.StatusCode.FAILED_PRECONDITION, a.CancelExecution,
          spb.CancelExecutionRequest(execution_id=e.execution_id))
    fails(grpc.StatusCode.NOT_FOUND, a.CancelExecution,
          spb.CancelExecutionRequest(execution_id="op-c@2001-01-01T00:00:00.000Z"))


def test_replay_and_discard_dead_letters(cluster: ApiCluster) -> None:
    a = cluster.schedules("a")
    a.CreateSchedule(spb.CreateScheduleRequest(schedule=sched("dl-ops", spec="0 0 1 1 *", worker_pool="nopool")),
                     timeout=10)
    # Pool without workers: the replayed run waits (a worker would run it at once, and the test
    # worker fails on this payload, so it would be a dead letter again before we look).
    ids = asyncio.run(_write_dead_letters(cluster, 2, sid="dl-ops", pool="nopool"))
    r = a.ReplayDeadLetter(spb.ReplayDeadLetterRequest(execution_id=ids[0], reason="fixed the bug"),
                           timeout=10).execution
    assert r.state in (epb.EXECUTION_STATE_SCHEDULED, epb.EXECUTION_STATE_RETRY_WAIT)
    assert r.state_message == "fixed the bug"
    fails(grpc.StatusCode.NOT_FOUND, a.ReplayDeadLetter, spb.ReplayDeadLetterRequest(execution_id=ids[0]))
    d = a.DiscardDeadLetter(spb.DiscardDeadLetterRequest(execution_id=ids[1]), timeout=10).execution
    assert d.state == epb.EXECUTION_STATE_FAILED
    fails(grpc.StatusCode.NOT_FOUND, a.DiscardDeadLetter, spb.DiscardDeadLetterRequest(execution_id=ids[1]))
    left = a.ListDeadLetters(spb.ListDeadLettersRequest(schedule_id="dl-ops"), timeout=10)
    assert not left.dead_letters


def test_pause_with_cancel_running(cluster: ApiCluster) -> None:
    a = cluster.schedules("a")
    a.CreateSchedule(spb.CreateScheduleRequest(schedule=sched("op-p", spec="0 0 1 1 *")), timeout=10)
    p = a.PauseSchedule(spb.PauseScheduleRequest(id="op-p", reason="stop", cancel_running=True), timeout=10)
    assert p.schedule.state == pb.SCHEDULE_STATE_PAUSED
    a.DeleteSchedule(spb.DeleteScheduleRequest(id="op-p", cancel_running=True), timeout=10)
    fails(grpc.StatusCode.NOT_FOUND, a.GetSchedule, spb.GetScheduleRequest(id="op-p"))


# ---- admin -------------------------------------------------------------------------------------------------


def test_get_time_and_cluster_status(cluster: ApiCluster) -> None:
    adm = cluster.admin("b")
    t0 = time.time()
    r = adm.GetTime(apb.GetTimeRequest(), timeout=5)
    assert r.node_id == "b" and r.region == "default"
    assert abs(r.server_time.ToMilliseconds() / 1000 - t0) < 60  # same machine: same clock, give or take
    def measured() -> apb.GetClusterStatusResponse | None:
        # A peer that does not answer within its short deadline (a loaded machine) is listed without
        # an offset: ask again rather than fail on the first try.
        st = adm.GetClusterStatus(apb.GetClusterStatusRequest(), timeout=10)
        return st if all(p.HasField("clock_offset") for p in st.planners if p.planner.node_id == "a") else None

    st = wait_until(measured, 30, "b to measure a's clock offset")
    assert st.answered_by == "b" and st.partition_count == P and len(st.partitions) == P
    assert [p.planner.node_id for p in st.planners] == ["a", "b"]
    assert all(p.planner.liveness == cpb.PLANNER_LIVENESS_ALIVE and p.planner.api_address for p in st.planners)
    assert sum(p.partitions_owned for p in st.planners) == P
    for part in st.partitions:
        assert part.owner in ("a", "b") and part.owner_region == "default"
        assert part.fencing_token.partition == part.partition and part.fencing_token.revision > 0
        assert part.HasField("watermark") and part.lag.seconds < 30
    pools = {(w.pool, w.region): w for w in st.worker_pools}
    assert pools[("pool", "default")].connected_workers == 1 and pools[("pool", "default")].capacity > 0


def test_switchover_stores_the_region_policy(cluster: ApiCluster) -> None:
    adm = cluster.admin("a")
    r = adm.Switchover(apb.SwitchoverRequest(target_region="default", reason="drill"), timeout=10).region_policy
    assert r.primary_region == "default" and r.reason == "drill" and r.version > 0
    fails(grpc.StatusCode.ABORTED, adm.Switchover, apb.SwitchoverRequest(target_region="default",
                                                                         expected_version=r.version + 1000))
    r2 = adm.Switchover(apb.SwitchoverRequest(target_region="default", expected_version=r.version), timeout=10)
    assert r2.region_policy.version > r.version
    # Issue 11: an unknown region is a state the call cannot act on (FAILED_PRECONDITION naming it), a
    # bad grace is bad input naming the field; neither changes the policy.
    err = fails(grpc.StatusCode.FAILED_PRECONDITION, adm.Switchover, apb.SwitchoverRequest(target_region="mars"))
    assert "'mars'" in (err.details() or ""), err.details()
    fails(grpc.StatusCode.INVALID_ARGUMENT, adm.Switchover, apb.SwitchoverRequest(), "target_region")
    fails(grpc.StatusCode.INVALID_ARGUMENT, adm.Switchover, apb.SwitchoverRequest(
        target_region="default", failover_grace=Duration(seconds=-1)), "failover_grace")
    fails(grpc.StatusCode.INVALID_ARGUMENT, adm.Switchover, apb.SwitchoverRequest(
        target_region="default", failover_grace=Duration(seconds=0)), "failover_grace")
    st = cluster.admin("b").GetClusterStatus(apb.GetClusterStatusRequest(), timeout=10)
    assert st.region_policy.primary_region == "default" and st.region_policy.version == r2.region_policy.version


async def _known_region(cluster: ApiCluster, region: str) -> None:
    async with EtcdClient(cluster.etcd.config()) as kv:
        await kv.put(Keyspace(PREFIX).region(region), b"{}")


def test_switchover_to_a_region_without_live_planners(cluster: ApiCluster) -> None:
    asyncio.run(_known_region(cluster, "gone-region"))
    fails(grpc.StatusCode.FAILED_PRECONDITION, cluster.admin("a").Switchover,
          apb.SwitchoverRequest(target_region="gone-region"))


FRESH_CLIENT = """
import json, sys, time
import grpc
from scheduler.v1 import schedule_pb2, schedule_service_pb2 as sspb, schedule_service_pb2_grpc as ssgrpc

# Nothing of the project: `scheduler` here is the package protoc just generated.
assert "scheduler._gen" not in sys.modules and "scheduler.api" not in sys.modules
assert all(p.startswith(sys.argv[2]) for p in sys.modules["scheduler"].__path__), sys.modules["scheduler"].__path__
stub = ssgrpc.ScheduleServiceStub(grpc.insecure_channel(sys.argv[1]))
s = stub.CreateSchedule(sspb.CreateScheduleRequest(schedule=schedule_pb2.Schedule(
    id="fresh-1", tenant="newcomer", spec="* * * * * *", worker_pool="pool", task_type="effect",
    policies=schedule_pb2.SchedulePolicies(overlap=schedule_pb2.OVERLAP_POLICY_ALLOW_ALL))), timeout=10)
deadline = time.time() + 60
while time.time() < deadline:
    r = stub.ListExecutions(sspb.ListExecutionsRequest(schedule_id="fresh-1"), timeout=10)
    if len(r.executions) >= 2:
        break
    time.sleep(0.2)
stub.PauseSchedule(sspb.PauseScheduleRequest(id="fresh-1"), timeout=10)
print(json.dumps({"version": s.schedule.version, "executions": [e.execution_id for e in r.executions]}))
"""


def test_client_generated_from_the_protos_alone(cluster: ApiCluster, tmp_path: Path) -> None:
    """protoc (grpc_tools) into a temp dir, then a client that imports only that generated code,
    in a Python without the project on its path (-S: no site, so no editable install either)."""
    import grpc_tools

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "gen"
    out.mkdir()
    site = str(Path(grpc_tools.__file__).resolve().parents[1])  # grpcio, protobuf, grpc_tools live here
    env = {"PYTHONPATH": site, "PATH": os.environ.get("PATH", "")}
    protos = sorted(str(p.relative_to(root / "proto")) for p in (root / "proto" / "scheduler" / "v1").glob("*.proto"))
    subprocess.run([sys.executable, "-S", "-m", "grpc_tools.protoc", f"-I{root / 'proto'}", f"--python_out={out}",
                    f"--grpc_python_out={out}", *protos], check=True, env=env, cwd=root / "proto", timeout=120)
    script = out / "client.py"
    script.write_text(FRESH_CLIENT)
    run = subprocess.run([sys.executable, "-S", str(script), cluster.addresses["b"], str(out)], env={
        **env, "PYTHONPATH": f"{out}{os.pathsep}{site}"}, cwd=out, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    assert got["version"] > 0 and len(got["executions"]) >= 2, got
    assert all(e.startswith("fresh-1@") for e in got["executions"])
    # The project's own stubs see the same executions.
    seen = cluster.schedules("a").ListExecutions(spb.ListExecutionsRequest(schedule_id="fresh-1"), timeout=10)
    assert set(got["executions"]) <= {e.execution_id for e in seen.executions}


def test_zz_drain_planner_through_another_node(cluster: ApiCluster) -> None:
    """Runs last: b is asked (through a) to drain; a ends up owning every partition, b keeps serving."""
    adm = cluster.admin("a")
    fails(grpc.StatusCode.NOT_FOUND, adm.DrainPlanner, apb.DrainPlannerRequest(node_id="nobody"))
    fails(grpc.StatusCode.INVALID_ARGUMENT, adm.DrainPlanner, apb.DrainPlannerRequest(node_id=""), "node_id")
    r = adm.DrainPlanner(apb.DrainPlannerRequest(node_id="b", reason="kernel update"), timeout=10).planner
    assert r.node_id == "b" and r.liveness == cpb.PLANNER_LIVENESS_DRAINING
    again = adm.DrainPlanner(apb.DrainPlannerRequest(node_id="b"), timeout=10).planner
    assert again.liveness == cpb.PLANNER_LIVENESS_DRAINING
    # a is now the only planner left to own partitions: draining it too needs force.
    fails(grpc.StatusCode.FAILED_PRECONDITION, adm.DrainPlanner, apb.DrainPlannerRequest(node_id="a"))

    def drained() -> apb.GetClusterStatusResponse | None:
        st = cluster.admin("b").GetClusterStatus(apb.GetClusterStatusRequest(), timeout=10)
        return st if all(p.owner == "a" for p in st.partitions) else None

    st = wait_until(drained, 30, "a to own every partition after b's drain")
    by = {p.planner.node_id: p for p in st.planners}
    assert by["b"].planner.liveness == cpb.PLANNER_LIVENESS_DRAINING and by["b"].partitions_owned == 0
    assert by["a"].planner.liveness == cpb.PLANNER_LIVENESS_ALIVE and by["a"].partitions_owned == P
    # b still serves the API.
    cluster.schedules("b").CreateSchedule(spb.CreateScheduleRequest(schedule=sched("drain-probe")), timeout=10)
    assert cluster.schedules("b").GetSchedule(spb.GetScheduleRequest(id="drain-probe"), timeout=10).schedule.id
    # ... and keeps claiming nothing (a few rounds later, still all a's).
    time.sleep(1.0)
    assert drained() is not None
    # It did own partitions before the drain (a drain of an idle node would prove nothing).
    assert cluster.planners["b"].events("acquired")
    # Undrain: b takes its share back.
    u = adm.UndrainPlanner(apb.UndrainPlannerRequest(node_id="b"), timeout=10).planner
    assert u.liveness == cpb.PLANNER_LIVENESS_ALIVE

    def shared() -> bool:
        st = cluster.admin("a").GetClusterStatus(apb.GetClusterStatusRequest(), timeout=10)
        return {p.owner for p in st.partitions} == {"a", "b"}

    wait_until(shared, 30, "b to claim partitions again after the undrain")
    fails(grpc.StatusCode.NOT_FOUND, adm.UndrainPlanner, apb.UndrainPlannerRequest(node_id="nobody"))


def test_nothing_crashed(cluster: ApiCluster) -> None:
    """After every malformed request above, both planner processes are still running, and no call
    ended in INTERNAL (the server logs each one as an unexpected error)."""
    assert all(p.running for p in cluster.planners.planners.values()), cluster.planners.logs()
    for p in cluster.planners.planners.values():
        internal = [r for r in p.log_records() if r.get("logger") == "scheduler.api"]
        assert not internal, internal


def test_cluster_status_shows_the_oldest_run_waiting_for_a_worker(cluster: ApiCluster) -> None:
    """Issue 9 item 12: a checkpoint can be fresh while runs wait; the owner reports how long the oldest
    due execution of each partition has waited, through whichever node answers."""
    a = cluster.schedules("a")
    a.CreateSchedule(spb.CreateScheduleRequest(schedule=sched("waits", spec="* * * * * *", worker_pool="nobody")),
                     timeout=10)
    p = partition_for("waits", P)

    def waiting() -> apb.PartitionStatus | None:
        st = cluster.admin("b").GetClusterStatus(apb.GetClusterStatusRequest(), timeout=10)
        part = st.partitions[p]
        return part if part.HasField("oldest_waiting") and part.oldest_waiting.seconds >= 2 else None

    part = wait_until(waiting, 30, "the waiting run to show in cluster status")
    assert part.owner in ("a", "b") and part.lag.seconds < 30
    a.DeleteSchedule(spb.DeleteScheduleRequest(id="waits"), timeout=10)
