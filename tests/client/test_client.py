"""The async client and its sync wrapper against the fake API over a real gRPC socket."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import grpc
import pytest

from chaos.infra.ports import unused_port
from scheduler._gen.scheduler.v1 import cluster_pb2 as cpb
from scheduler._gen.scheduler.v1 import execution_pb2 as epb
from scheduler._gen.scheduler.v1 import schedule_pb2 as spb
from scheduler._gen.scheduler.v1 import schedule_service_pb2 as sspb
from scheduler.client import ClientError, FieldViolation, RetryPolicy, SchedulerClient, SyncSchedulerClient
from tests.client.fake_server import FakeApi, start_fake

T0 = 1_780_000_000_000


def sched(sid: str = "s1", **kw: object) -> spb.Schedule:
    base: dict[str, object] = {"id": sid, "tenant": "t", "spec": "*/5 * * * * *", "worker_pool": "default",
                               "task_type": "shell", "payload": b'{"command": "true"}'}
    base.update(kw)
    return spb.Schedule(**base)  # type: ignore[arg-type]


async def test_schedule_lifecycle(client: SchedulerClient) -> None:
    s = await client.create_schedule(sched())
    assert (s.id, s.version, s.state) == ("s1", 1, spb.SCHEDULE_STATE_ACTIVE)
    assert (await client.get_schedule("s1")).spec == "*/5 * * * * *"
    u = await client.update_schedule(spb.Schedule(id="s1", spec="@hourly"), update_mask=["spec"],
                                     expected_version=1)
    assert (u.spec, u.version) == ("@hourly", 2)
    p = await client.pause_schedule("s1", reason="maintenance")
    assert (p.state, p.paused_reason) == (spb.SCHEDULE_STATE_PAUSED, "maintenance")
    assert (await client.resume_schedule("s1")).state == spb.SCHEDULE_STATE_ACTIVE
    assert await client.delete_schedule("s1") is True
    assert await client.delete_schedule("s1", allow_missing=True) is False  # a retried delete is harmless
    with pytest.raises(ClientError) as ei:
        await client.get_schedule("s1")
    assert ei.value.code is grpc.StatusCode.NOT_FOUND and "not found" in str(ei.value)


async def test_tenant_and_pool_default_like_the_cli(client: SchedulerClient) -> None:
    mine = spb.Schedule(id="d1", spec="@hourly", task_type="shell")
    s = await client.create_schedule(mine)
    assert (s.tenant, s.worker_pool) == ("default", "default")
    assert (mine.tenant, mine.worker_pool) == ("", ""), "the caller's message is left alone"
    s = await client.create_schedule(spb.Schedule(id="d2", spec="@hourly", task_type="shell", tenant="t",
                                                  worker_pool="p"))
    assert (s.tenant, s.worker_pool) == ("t", "p")


async def test_invalid_argument_carries_the_field_violations(client: SchedulerClient) -> None:
    with pytest.raises(ClientError) as ei:
        await client.create_schedule(sched(spec="61 * * * *"))
    err = ei.value
    assert err.code is grpc.StatusCode.INVALID_ARGUMENT
    assert err.violations == (FieldViolation("schedule.spec.minute", "61 is outside 0-59"),)
    assert str(err) == "schedule.spec.minute: 61 is outside 0-59"


async def test_conflicts_surface_their_codes(client: SchedulerClient) -> None:
    await client.create_schedule(sched())
    with pytest.raises(ClientError) as ei:
        await client.create_schedule(sched())
    assert ei.value.code is grpc.StatusCode.ALREADY_EXISTS
    with pytest.raises(ClientError) as ei:
        await client.update_schedule(sched(spec="@daily"), update_mask=["spec"], expected_version=7)
    assert ei.value.code is grpc.StatusCode.ABORTED


async def test_pagination_iterates_every_page(fake: tuple[FakeApi, str], client: SchedulerClient) -> None:
    for i in range(25):
        await client.create_schedule(sched(f"s{i:02d}"))
    page = await client.list_schedules(page_size=10)
    assert len(page.schedules) == 10 and page.next_page_token
    ids = [s.id async for s in client.iter_schedules(page_size=10)]
    assert ids == [f"s{i:02d}" for i in range(25)]
    assert sum(1 for m, _ in fake[0].calls if m == "ListSchedules") == 1 + 3


async def test_reads_retry_on_unavailable_writes_do_not(fake: tuple[FakeApi, str]) -> None:
    api, address = fake
    async with SchedulerClient(address, retry=RetryPolicy(max_attempts=3, initial_backoff=0.01)) as c:
        await c.create_schedule(sched())
        api.fail_next["GetSchedule"] = [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAVAILABLE]
        assert (await c.get_schedule("s1")).id == "s1"
        assert sum(1 for m, _ in api.calls if m == "GetSchedule") == 3
        # Exhausted: the last UNAVAILABLE is raised.
        api.fail_next["GetSchedule"] = [grpc.StatusCode.UNAVAILABLE] * 3
        with pytest.raises(ClientError) as ei:
            await c.get_schedule("s1")
        assert ei.value.code is grpc.StatusCode.UNAVAILABLE
        # A write may have been applied: never retried.
        api.fail_next["PauseSchedule"] = [grpc.StatusCode.UNAVAILABLE]
        with pytest.raises(ClientError) as ei:
            await c.pause_schedule("s1")
        assert ei.value.code is grpc.StatusCode.UNAVAILABLE
        assert sum(1 for m, _ in api.calls if m == "PauseSchedule") == 1
        # Other codes are answers, not outages: not retried either.
        api.fail_next["GetSchedule"] = [grpc.StatusCode.INTERNAL]
        with pytest.raises(ClientError):
            await c.get_schedule("s1")
        assert sum(1 for m, _ in api.calls if m == "GetSchedule") == 3 + 3 + 1


async def test_no_server_is_unavailable_within_the_deadline() -> None:
    # A port nobody listens on (nor can start to): every retry fails fast, the call ends by its deadline.
    with unused_port() as port:
        async with SchedulerClient(f"127.0.0.1:{port}", timeout=1.0,
                                   retry=RetryPolicy(max_attempts=2, initial_backoff=0.01)) as c:
            with pytest.raises(ClientError) as ei:
                await c.get_schedule("x")
    assert ei.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


async def test_deadline_is_sent_with_the_call(fake: tuple[FakeApi, str]) -> None:
    api = fake[0]
    seen: list[float | None] = []
    original = api.GetTime

    async def slow(request: object, context: grpc.aio.ServicerContext[object, object]) -> object:
        seen.append(context.time_remaining())
        await asyncio.sleep(2)
        return await original(request, context)

    api.__dict__["GetTime"] = slow
    server, addr = await start_fake(api)
    try:
        async with SchedulerClient(addr, retry=RetryPolicy(max_attempts=1)) as c:
            with pytest.raises(ClientError) as ei:
                await c.get_time(timeout=0.3)
        assert ei.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
        # The wire format rounds the deadline up a little (0.3006 s seen): the 0.3 s was sent, not a default.
        assert seen and seen[0] is not None and seen[0] <= 0.35
    finally:
        await server.stop(grace=None)


async def test_operations(fake: tuple[FakeApi, str], client: SchedulerClient) -> None:
    api = fake[0]
    await client.create_schedule(sched())
    e = await client.trigger_schedule("s1", trigger_time=T0)
    assert (e.execution_id, e.trigger) == ("s1@2026-05-28T20:26:40.000Z", epb.TRIGGER_MANUAL)
    again = await client.trigger_schedule("s1", trigger_time=datetime.fromtimestamp(T0 / 1000, tz=UTC))
    assert again.execution_id == e.execution_id
    assert (await client.get_execution(e.execution_id)).schedule_id == "s1"
    c = await client.cancel_execution(e.execution_id, reason="no longer needed")
    assert c.state == epb.EXECUTION_STATE_CANCELLED
    r = await client.rerun_execution("s1", T0)
    assert (r.execution_id, r.state) == (e.execution_id, epb.EXECUTION_STATE_SCHEDULED)
    page = await client.list_executions(schedule_id="s1", states=[epb.EXECUTION_STATE_SCHEDULED])
    assert [x.execution_id for x in page.executions] == [e.execution_id]
    req = api.calls[-1][1]
    assert list(req.states) == [epb.EXECUTION_STATE_SCHEDULED]
    times = await client.preview_schedule(schedule_id="s1", after=T0, count=3)
    assert len(times) == 3 and times[0].ToMilliseconds() > T0
    inline = await client.preview_schedule(spec=sspb.PreviewSpec(spec="@hourly"), count=2)
    assert len(inline) == 2
    with pytest.raises(ValueError, match="exactly one"):
        await client.preview_schedule()


async def test_backfill_streams_progress_until_done(client: SchedulerClient) -> None:
    await client.create_schedule(sched())
    seen = [p async for p in client.backfill("s1", T0, T0 + 35 * 60_000)]
    assert len(seen) == 4 and seen[-1].done and not any(p.done for p in seen[:-1])
    assert [p.planned for p in seen] == [10, 20, 30, 35]
    assert seen[-1].created == 35
    again = [p async for p in client.backfill("s1", T0, T0 + 35 * 60_000)]
    assert (again[-1].created, again[-1].existing) == (0, 35)  # idempotent: nothing created twice
    with pytest.raises(ClientError) as ei:
        async for _ in client.backfill("s1", T0, T0):
            pass
    assert ei.value.violations == (FieldViolation("end_time", "must be after start_time"),)


async def test_dead_letters_and_admin(fake: tuple[FakeApi, str], client: SchedulerClient) -> None:
    api = fake[0]
    await client.create_schedule(sched())
    a, b = api.add_dead_letter("s1", T0), api.add_dead_letter("s1", T0 + 60_000)
    assert [d.execution.execution_id async for d in client.iter_dead_letters(schedule_id="s1")] == [a, b]
    assert (await client.replay_dead_letter(a, reason="fixed")).state == epb.EXECUTION_STATE_SCHEDULED
    assert (await client.discard_dead_letter(b)).state == epb.EXECUTION_STATE_FAILED
    with pytest.raises(ClientError) as ei:
        await client.replay_dead_letter(a)
    assert ei.value.code is grpc.StatusCode.NOT_FOUND
    status = await client.cluster_status()
    assert status.answered_by == "p1" and len(status.partitions) == 2
    policy = await client.switchover("default", reason="drill", expected_version=1)
    assert policy.version == 2
    with pytest.raises(ClientError) as ei:
        await client.switchover("mars")  # a region no planner has registered in: refused, naming it
    assert ei.value.code is grpc.StatusCode.FAILED_PRECONDITION and "'mars'" in str(ei.value)
    with pytest.raises(ClientError) as ei:
        await client.drain_planner("p1")  # the only planner
    assert ei.value.code is grpc.StatusCode.FAILED_PRECONDITION
    assert (await client.drain_planner("p1", force=True)).liveness == cpb.PLANNER_LIVENESS_DRAINING
    assert (await client.undrain_planner("p1")).liveness == cpb.PLANNER_LIVENESS_ALIVE
    assert (await client.get_time()).node_id == "p1"


def test_sync_wrapper(fake_server_process: str) -> None:
    with SyncSchedulerClient(fake_server_process, timeout=5.0) as c:
        c.create_schedule(sched())
        assert c.get_schedule("s1").id == "s1"
        progress = list(c.backfill("s1", T0, T0 + 15 * 60_000))
        assert progress[-1].done and progress[-1].created == 15
        with pytest.raises(ClientError) as ei:
            c.get_schedule("nope")
        assert ei.value.code is grpc.StatusCode.NOT_FOUND
        assert list(c.list_skips("s1").skips) == []
        assert c.undrain_planner("p1").liveness == cpb.PLANNER_LIVENESS_ALIVE


async def test_plain_status_without_details() -> None:
    # A server with only the admin service: ScheduleService calls end UNIMPLEMENTED, no rich details.
    from scheduler._gen.scheduler.v1 import admin_service_pb2_grpc as agrpc
    server = grpc.aio.server()
    agrpc.add_AdminServiceServicer_to_server(FakeApi(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with SchedulerClient(f"127.0.0.1:{port}") as c:
            with pytest.raises(ClientError) as ei:
                await c.get_schedule("x")
            assert (ei.value.code, ei.value.violations) == (grpc.StatusCode.UNIMPLEMENTED, ())
            assert (await c.get_time()).node_id == "p1"
    finally:
        await server.stop(grace=None)
