"""ScheduleService over a real gRPC socket, backed by the in-memory etcd twin and a fake operations
port: the adapters (trigger, rerun, backfill, cancel, dead letters) and the error mapping, fast.
The same calls against real etcd and planner processes are in tests/integration/test_api_contract.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.field_mask_pb2 import FieldMask
from google.protobuf.timestamp_pb2 import Timestamp
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from scheduler._gen.scheduler.v1 import execution_pb2 as epb
from scheduler._gen.scheduler.v1 import schedule_pb2 as pb
from scheduler._gen.scheduler.v1 import schedule_service_pb2 as spb
from scheduler._gen.scheduler.v1 import schedule_service_pb2_grpc as sgrpc
from scheduler.api.schedule_service import ScheduleService
from scheduler.clock import FakeClock
from scheduler.errors import FailedPrecondition, NotFound, OutcomeUnknown, ResourceExhausted
from scheduler.execution import Execution, Trigger
from scheduler.ids import execution_id, schedule_of
from scheduler.model import RetryPolicy
from scheduler.store.keyspace import Keyspace
from scheduler.store.ledger import Ledger
from scheduler.store.memory import MemoryKV
from scheduler.store.schedules import ScheduleStore
from scheduler.timeplan import Overlap

NOW = 1_795_946_400_000
P = 8


@dataclass
class Counts:
    planned: int
    created: int
    existing: int
    skipped: int
    processed_until_ms: int | None
    done: bool


def _exec(sid: str, ms: int, trigger: Trigger = Trigger.MANUAL) -> Execution:
    return Execution(execution_id(sid, ms), sid, "t", "pool", "task", ms, ms, trigger, RetryPolicy(), 60_000)


class FakeOps:
    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []
        self.fail: BaseException | None = None

    def _check(self) -> None:
        if self.fail is not None:
            raise self.fail

    async def trigger(self, schedule_id: str, at_ms: int | None, overlap: Overlap | None) -> Execution:
        self.calls.append(("trigger", schedule_id, at_ms, overlap))
        self._check()
        return _exec(schedule_id, at_ms or NOW)

    async def rerun(self, schedule_id: str, planned_ms: int) -> Execution:
        self.calls.append(("rerun", schedule_id, planned_ms))
        self._check()
        return _exec(schedule_id, planned_ms, Trigger.SCHEDULED)

    async def backfill(self, schedule_id: str, start_ms: int, end_ms: int, overlap: Overlap | None,
                       dry_run: bool) -> AsyncIterator[Counts]:
        self.calls.append(("backfill", schedule_id, start_ms, end_ms, overlap, dry_run))
        yield Counts(2, 2, 0, 0, start_ms + 1000, False)
        self._check()
        yield Counts(3, 2, 1, 0, end_ms, True)

    async def cancel_execution(self, execution_id: str, reason: str = "") -> Execution:
        self.calls.append(("cancel", execution_id, reason))
        self._check()
        return _exec(schedule_of(execution_id), NOW)

    async def cancel_running(self, schedule_id: str, reason: str) -> int:
        self.calls.append(("cancel_running", schedule_id, reason))
        return 0

    async def replay_dead_letter(self, execution_id: str, reason: str = "",
                                 use_current_schedule: bool = False) -> Execution:
        self.calls.append(("replay", execution_id, reason) + (("current",) if use_current_schedule else ()))
        self._check()
        return _exec(schedule_of(execution_id), NOW)

    async def discard_dead_letter(self, execution_id: str, reason: str = "") -> Execution:
        self.calls.append(("discard", execution_id, reason))
        self._check()
        return _exec(schedule_of(execution_id), NOW)


@pytest.fixture
async def env() -> AsyncIterator[tuple[sgrpc.ScheduleServiceStub, FakeOps, MemoryKV]]:
    kv, ks, ops = MemoryKV(), Keyspace("/u"), FakeOps()
    svc = ScheduleService(kv=kv, ks=ks, store=ScheduleStore(kv, ks, P), ledger=Ledger(ks, P),
                          clock=FakeClock(NOW), ops=ops, rpc_timeout=1.0)
    server = grpc.aio.server()
    sgrpc.add_ScheduleServiceServicer_to_server(svc, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        yield sgrpc.ScheduleServiceStub(ch), ops, kv
    await server.stop(None)


def bad_field(e: grpc.aio.AioRpcError) -> str:
    st = rpc_status.from_call(e)  # type: ignore[arg-type]  # AioRpcError carries the same trailers
    assert st is not None, "no rich status details"
    br = error_details_pb2.BadRequest()
    assert st.details[0].Unpack(br)
    return str(br.field_violations[0].field)


def last(ops: FakeOps) -> tuple[object, ...]:
    return ops.calls[-1]


def ts(ms: int) -> Timestamp:
    t = Timestamp()
    t.FromMilliseconds(ms)
    return t


async def test_adapters_pass_converted_arguments(env: tuple[sgrpc.ScheduleServiceStub, FakeOps, MemoryKV]) -> None:
    stub, ops, _ = env
    r = await stub.TriggerSchedule(spb.TriggerScheduleRequest(id="job", trigger_time=ts(NOW + 5),
                                                              overlap_policy=pb.OVERLAP_POLICY_ALLOW_ALL))
    assert r.execution.execution_id == execution_id("job", NOW + 5)
    assert r.execution.trigger == epb.TRIGGER_MANUAL
    assert last(ops) == ("trigger", "job", NOW + 5, Overlap.ALLOW_ALL)
    await stub.TriggerSchedule(spb.TriggerScheduleRequest(id="job"))
    assert last(ops) == ("trigger", "job", None, None)
    r2 = await stub.RerunExecution(spb.RerunExecutionRequest(schedule_id="job", planned_at=ts(NOW - 60_000)))
    assert r2.execution.planned_at.ToMilliseconds() == NOW - 60_000
    progress = [m async for m in stub.Backfill(spb.BackfillRequest(schedule_id="job", start_time=ts(NOW - 10_000),
                                                                    end_time=ts(NOW), dry_run=True))]
    assert [(m.planned, m.created, m.existing, m.done) for m in progress] == [(2, 2, 0, False), (3, 2, 1, True)]
    assert progress[-1].processed_until.ToMilliseconds() == NOW
    assert last(ops) == ("backfill", "job", NOW - 10_000, NOW, None, True)
    eid = execution_id("job", NOW)
    await stub.CancelExecution(spb.CancelExecutionRequest(execution_id=eid, reason="because"))
    assert last(ops) == ("cancel", eid, "because")
    await stub.ReplayDeadLetter(spb.ReplayDeadLetterRequest(execution_id=eid, reason="fixed"))
    await stub.DiscardDeadLetter(spb.DiscardDeadLetterRequest(execution_id=eid))
    assert ops.calls[-2:] == [("replay", eid, "fixed"), ("discard", eid, "")]


@pytest.mark.parametrize(("request_", "method", "field"), [
    (spb.TriggerScheduleRequest(id="a@b"), "TriggerSchedule", "id"),
    (spb.TriggerScheduleRequest(id="a", trigger_time=Timestamp(seconds=1, nanos=5)), "TriggerSchedule",
     "trigger_time"),
    (spb.TriggerScheduleRequest(id="a", overlap_policy=99), "TriggerSchedule", "overlap_policy"),  # type: ignore[arg-type]
    (spb.RerunExecutionRequest(schedule_id="a"), "RerunExecution", "planned_at"),
    (spb.CancelExecutionRequest(execution_id="nope"), "CancelExecution", "execution_id"),
    (spb.CancelExecutionRequest(execution_id="a@2026-11-29T10:00:00.000Z", reason="x" * 1025), "CancelExecution",
     "reason"),
    (spb.ReplayDeadLetterRequest(execution_id=""), "ReplayDeadLetter", "execution_id"),
    (spb.DiscardDeadLetterRequest(execution_id="a@2026-11-29"), "DiscardDeadLetter", "execution_id"),
])
async def test_adapter_input_errors(env: tuple[sgrpc.ScheduleServiceStub, FakeOps, MemoryKV], request_: object,
                                    method: str, field: str) -> None:
    stub, ops, _ = env
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await getattr(stub, method)(request_)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_field(e.value) == field
    assert ops.calls == []  # refused at the edge: the operation never ran


async def test_backfill_range_errors(env: tuple[sgrpc.ScheduleServiceStub, FakeOps, MemoryKV]) -> None:
    stub, _ops, _ = env
    for req, field in ((spb.BackfillRequest(schedule_id="a", end_time=ts(NOW)), "start_time"),
                       (spb.BackfillRequest(schedule_id="a", start_time=ts(NOW), end_time=ts(NOW)), "end_time")):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            _ = [m async for m in stub.Backfill(req)]
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert bad_field(e.value) == field


@pytest.mark.parametrize(("exc", "code"), [
    (NotFound("no such schedule"), grpc.StatusCode.NOT_FOUND),
    (FailedPrecondition("paused"), grpc.StatusCode.FAILED_PRECONDITION),
    (ResourceExhausted("too many"), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (OutcomeUnknown("timeout"), grpc.StatusCode.UNAVAILABLE),
    (RuntimeError("bug"), grpc.StatusCode.INTERNAL),
])
async def test_operation_errors_map_to_codes(env: tuple[sgrpc.ScheduleServiceStub, FakeOps, MemoryKV],
                                             exc: BaseException, code: grpc.StatusCode) -> None:
    stub, ops, _ = env
    ops.fail = exc
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.TriggerSchedule(spb.TriggerScheduleRequest(id="job"))
    assert e.value.code() == code
    if code is grpc.StatusCode.UNAVAILABLE:
        assert "outcome is unknown" in (e.value.details() or "")
    if code is grpc.StatusCode.INTERNAL:
        assert "bug" not in (e.value.details() or "")  # internals are logged, not leaked
    # A failure part-way through a stream ends it with the status, after the progress so far.
    got: list[spb.BackfillProgress] = []

    async def drain() -> None:
        async for m in stub.Backfill(spb.BackfillRequest(schedule_id="a", start_time=ts(NOW - 5000),
                                                         end_time=ts(NOW))):
            got.append(m)

    with pytest.raises(grpc.aio.AioRpcError) as e2:
        await drain()
    assert e2.value.code() == code
    assert len(got) == 1
    ops.fail = None
    assert (await stub.TriggerSchedule(spb.TriggerScheduleRequest(id="job"))).execution.execution_id  # still serving


async def test_etcd_unreachable_is_unavailable_and_writes_nothing(
        env: tuple[sgrpc.ScheduleServiceStub, FakeOps, MemoryKV]) -> None:
    stub, _, kv = env
    s = pb.Schedule(id="u1", tenant="t", spec="* * * * *", worker_pool="p", task_type="x")
    kv.fail_next("txn")
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.CreateSchedule(spb.CreateScheduleRequest(schedule=s, request_id="r1"))
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "read again" in (e.value.details() or "")
    # The outcome was unknown; a retry with the same request_id is safe either way.
    kv.fail_next("txn", after_apply=True)
    with pytest.raises(grpc.aio.AioRpcError):
        await stub.CreateSchedule(spb.CreateScheduleRequest(schedule=pb.Schedule(
            id="u2", tenant="t", spec="* * * * *", worker_pool="p", task_type="x"), request_id="r2"))
    again = await stub.CreateSchedule(spb.CreateScheduleRequest(schedule=pb.Schedule(
        id="u2", tenant="t", spec="* * * * *", worker_pool="p", task_type="x"), request_id="r2"))
    assert again.schedule.id == "u2"


async def test_pause_and_delete_cancel_running_through_the_port(
        env: tuple[sgrpc.ScheduleServiceStub, FakeOps, MemoryKV]) -> None:
    stub, ops, _ = env
    s = pb.Schedule(id="cr", tenant="t", spec="* * * * *", worker_pool="p", task_type="x")
    await stub.CreateSchedule(spb.CreateScheduleRequest(schedule=s))
    await stub.PauseSchedule(spb.PauseScheduleRequest(id="cr", reason="db down", cancel_running=True))
    assert last(ops) == ("cancel_running", "cr", "schedule paused: db down")
    await stub.PauseSchedule(spb.PauseScheduleRequest(id="cr", reason="db down"))
    assert last(ops) == ("cancel_running", "cr", "schedule paused: db down")  # not again without the flag
    await stub.DeleteSchedule(spb.DeleteScheduleRequest(id="cr", cancel_running=True))
    assert last(ops) == ("cancel_running", "cr", "schedule deleted")


async def test_update_with_nothing_to_change_writes_nothing(
        env: tuple[sgrpc.ScheduleServiceStub, FakeOps, MemoryKV]) -> None:
    stub, _, _ = env
    s = pb.Schedule(id="nc", tenant="t", spec="* * * * *", worker_pool="p", task_type="x")
    v = (await stub.CreateSchedule(spb.CreateScheduleRequest(schedule=s))).schedule.version
    same = (await stub.UpdateSchedule(spb.UpdateScheduleRequest(schedule=pb.Schedule(id="nc", tenant="t")))).schedule
    assert same.version == v
    changed = (await stub.UpdateSchedule(spb.UpdateScheduleRequest(schedule=pb.Schedule(
        id="nc", labels={"a": "b"})))).schedule
    assert changed.version != v and dict(changed.labels) == {"a": "b"}


async def test_errors_quoting_huge_input_stay_small(env: tuple[sgrpc.ScheduleServiceStub, FakeOps, MemoryKV]) -> None:
    """A 1 MB mask path or selector is echoed in the error: clipped, so the status still arrives."""
    stub, _, _ = env
    s = pb.Schedule(id="big", tenant="t", spec="* * * * *", worker_pool="p", task_type="x")
    await stub.CreateSchedule(spb.CreateScheduleRequest(schedule=s))
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.UpdateSchedule(spb.UpdateScheduleRequest(schedule=pb.Schedule(id="big"),
                                                            update_mask=FieldMask(paths=["x" * 1_000_000])))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_field(e.value) == "update_mask"
    with pytest.raises(grpc.aio.AioRpcError) as e2:
        await stub.ListSchedules(spb.ListSchedulesRequest(label_selector="k in (" + "v," * 1000 + ")"))
    assert e2.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(e2.value.details() or "") <= 1024


_BASE = {"id": "odd", "tenant": "t", "spec": "* * * * *", "worker_pool": "p", "task_type": "x"}


@pytest.mark.parametrize(("changes", "field"), [
    ({"time_zone": "x" * 100_000}, "schedule.time_zone"),  # once an OSError (name too long): INTERNAL
    ({"time_zone": "Europe"}, "schedule.time_zone"),  # a directory of the zone database
    ({"time_zone": "../../etc/passwd"}, "schedule.time_zone"),
    ({"start_at": Timestamp(seconds=-62135596800)}, "schedule.start_at"),
    ({"start_at": Timestamp(seconds=-62135596801)}, "schedule.start_at"),  # found by test_fuzz: was INTERNAL
    ({"end_at": Timestamp(seconds=10**12)}, "schedule.end_at"),
    ({"policies": pb.SchedulePolicies(jitter=Duration(seconds=10**12))}, "schedule.policies.jitter"),
    ({"spec": "1," * 200_000 + "1 * * * *"}, "schedule.spec"),
    ({"spec": "@every 1ms"}, "schedule.spec.every"),
    ({"id": "ідентифікатор"}, "schedule.id"),
])
async def test_odd_schedules_are_invalid_argument_not_internal(
        env: tuple[sgrpc.ScheduleServiceStub, FakeOps, MemoryKV], changes: dict[str, object], field: str) -> None:
    stub, _, _ = env
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.CreateSchedule(spb.CreateScheduleRequest(schedule=pb.Schedule(**{**_BASE, **changes})))  # type: ignore[arg-type]
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
    assert bad_field(e.value) == field


async def test_preview_of_an_H_spec_needs_the_schedule_id(
        env: tuple[sgrpc.ScheduleServiceStub, FakeOps, MemoryKV]) -> None:
    stub, _, _ = env
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.PreviewSchedule(spb.PreviewScheduleRequest(spec=spb.PreviewSpec(spec="H * * * *")))
    assert bad_field(e.value) == "spec.schedule_id"
    r = await stub.PreviewSchedule(spb.PreviewScheduleRequest(spec=spb.PreviewSpec(spec="H * * * *", schedule_id="j"),
                                                              count=2))
    assert len(r.planned_times) == 2
