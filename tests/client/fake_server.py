"""An in-memory ScheduleService + AdminService on a real grpc.aio server (loopback socket), for the
client and CLI tests. It implements the contract's visible behaviour (codes, BadRequest details,
versions as etags, pagination, backfill progress), not the engine: nothing runs.

`FakeApi.calls` records (method, request) so tests can check what reached the wire, and
`fail_next[method]` queues status codes to answer with first (to test retries).
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from scheduler._gen.scheduler.v1 import admin_service_pb2 as apb
from scheduler._gen.scheduler.v1 import admin_service_pb2_grpc as agrpc
from scheduler._gen.scheduler.v1 import cluster_pb2 as cpb
from scheduler._gen.scheduler.v1 import execution_pb2 as epb
from scheduler._gen.scheduler.v1 import schedule_pb2 as spb
from scheduler._gen.scheduler.v1 import schedule_service_pb2 as sspb
from scheduler._gen.scheduler.v1 import schedule_service_pb2_grpc as ssgrpc
from scheduler.ids import execution_id

PAGE_MAX = 1000


class Abort(Exception):
    def __init__(self, code: grpc.StatusCode, message: str, fields: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.code, self.message, self.fields = code, message, fields


def invalid(field: str, reason: str) -> Abort:
    return Abort(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {reason}", ((field, reason),))


async def _abort(context: grpc.aio.ServicerContext[Any, Any], e: Abort) -> None:
    status = status_pb2.Status(code=getattr(code_pb2, e.code.name), message=e.message)
    if e.fields:
        bad = error_details_pb2.BadRequest(field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=f, description=d) for f, d in e.fields])
        detail = any_pb2.Any()
        detail.Pack(bad)
        status.details.append(detail)
    await context.abort(e.code, e.message,
                        trailing_metadata=(("grpc-status-details-bin", status.SerializeToString()),))


def _page(items: list[Any], size: int, token: str) -> tuple[list[Any], str]:
    size = PAGE_MAX if size > PAGE_MAX else (size or 100)
    start = int(token or 0)
    chunk = items[start:start + size]
    return chunk, str(start + size) if start + size < len(items) else ""


class FakeApi(ssgrpc.ScheduleServiceServicer, agrpc.AdminServiceServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.schedules: dict[str, Any] = {}
        self.executions: dict[str, Any] = {}
        self.dead: dict[str, Any] = {}
        self.calls: list[tuple[str, Any]] = []
        self.fail_next: dict[str, list[grpc.StatusCode]] = {}
        self.region = cpb.RegionPolicy(primary_region="default", version=1)
        self.skips: dict[str, list[Any]] = {}  # schedule id -> SkippedTime, by planned time
        self.planners = {"p1": cpb.PlannerInfo(node_id="p1", region="default", api_address="127.0.0.1:1",
                                               liveness=cpb.PLANNER_LIVENESS_ALIVE)}
        self.clock_ms = 1_780_000_000_000

    async def _enter(self, method: str, request: Any) -> None:
        self.calls.append((method, request))
        queued = self.fail_next.get(method)
        if queued:
            raise Abort(queued.pop(0), f"injected {method} failure")

    def _schedule(self, sid: str) -> Any:
        if sid not in self.schedules:
            raise Abort(grpc.StatusCode.NOT_FOUND, f"schedule {sid!r} not found")
        return self.schedules[sid]

    def _check_version(self, stored: Any, request: Any) -> None:
        if request.HasField("expected_version") and request.expected_version != stored.version:
            raise Abort(grpc.StatusCode.ABORTED,
                        f"version {request.expected_version} is stale (stored {stored.version})")

    def _new_execution(self, s: Any, ms: int, trigger: epb.Trigger) -> Any:
        e = epb.Execution(execution_id=execution_id(s.id, ms), schedule_id=s.id, tenant=s.tenant,
                          trigger=trigger, state=epb.EXECUTION_STATE_SCHEDULED, task_type=s.task_type,
                          worker_pool=s.worker_pool)
        e.planned_at.FromMilliseconds(ms)
        self.executions[e.execution_id] = e
        return e

    # Every handler runs under one wrapper that turns Abort into a rich status.
    def __getattribute__(self, name: str) -> Any:
        attr = object.__getattribute__(self, name)
        if name[:1].isupper() and name != "Backfill":
            async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                try:
                    await self._enter(name, request)
                    return await attr(request, context)
                except Abort as e:
                    await _abort(context, e)
            return call
        return attr

    async def CreateSchedule(self, request: Any, context: Any) -> Any:
        s = copy.deepcopy(request.schedule)
        for field in ("id", "tenant", "spec", "worker_pool", "task_type"):
            if not getattr(s, field):
                raise invalid(f"schedule.{field}", "is required")
        if s.spec.startswith("61 "):
            raise invalid("schedule.spec.minute", "61 is outside 0-59")
        if s.id in self.schedules:
            raise Abort(grpc.StatusCode.ALREADY_EXISTS, f"schedule {s.id!r} already exists")
        s.version, s.state = 1, spb.SCHEDULE_STATE_ACTIVE
        s.time_zone = s.time_zone or "UTC"
        s.created_at.FromMilliseconds(self.clock_ms)
        self.schedules[s.id] = s
        return sspb.CreateScheduleResponse(schedule=s)

    async def GetSchedule(self, request: Any, context: Any) -> Any:
        return sspb.GetScheduleResponse(schedule=self._schedule(request.id))

    async def UpdateSchedule(self, request: Any, context: Any) -> Any:
        s = self._schedule(request.schedule.id)
        self._check_version(s, request)
        paths = list(request.update_mask.paths)
        for p in paths:
            if p in ("id", "tenant", "state"):
                raise invalid(f"update_mask.{p}", "cannot be changed by UpdateSchedule")
        new = copy.deepcopy(s)
        for p in paths:
            top = p.split(".")[0]
            if top == "labels":
                new.labels.clear()
                new.labels.update(request.schedule.labels)
            elif top == "policies":
                new.policies.CopyFrom(request.schedule.policies)
            else:
                setattr(new, top, getattr(request.schedule, top))
        new.version = s.version + 1
        self.schedules[s.id] = new
        return sspb.UpdateScheduleResponse(schedule=new)

    async def DeleteSchedule(self, request: Any, context: Any) -> Any:
        if request.id not in self.schedules and request.allow_missing:
            return sspb.DeleteScheduleResponse()
        s = self._schedule(request.id)
        self._check_version(s, request)
        del self.schedules[request.id]
        return sspb.DeleteScheduleResponse(deleted=True)

    async def ListSchedules(self, request: Any, context: Any) -> Any:
        items = [s for _, s in sorted(self.schedules.items())
                 if (not request.tenant or s.tenant == request.tenant)
                 and (not request.state or s.state == request.state)]
        chunk, token = _page(items, request.page_size, request.page_token)
        return sspb.ListSchedulesResponse(schedules=chunk, next_page_token=token)

    async def PauseSchedule(self, request: Any, context: Any) -> Any:
        s = self._schedule(request.id)
        self._check_version(s, request)
        s.state, s.paused_reason, s.version = spb.SCHEDULE_STATE_PAUSED, request.reason, s.version + 1
        return sspb.PauseScheduleResponse(schedule=s)

    async def ResumeSchedule(self, request: Any, context: Any) -> Any:
        s = self._schedule(request.id)
        self._check_version(s, request)
        if s.state == spb.SCHEDULE_STATE_PAUSED:
            s.state, s.paused_reason, s.version = spb.SCHEDULE_STATE_ACTIVE, "", s.version + 1
        return sspb.ResumeScheduleResponse(schedule=s)

    async def TriggerSchedule(self, request: Any, context: Any) -> Any:
        s = self._schedule(request.id)
        if s.state == spb.SCHEDULE_STATE_PAUSED:
            raise Abort(grpc.StatusCode.FAILED_PRECONDITION, f"schedule {s.id!r} is paused: resume it first")
        ms = request.trigger_time.ToMilliseconds() if request.HasField("trigger_time") else self.clock_ms
        eid = execution_id(s.id, ms)
        e = self.executions.get(eid) or self._new_execution(s, ms, epb.TRIGGER_MANUAL)
        return sspb.TriggerScheduleResponse(execution=e)

    async def RerunExecution(self, request: Any, context: Any) -> Any:
        s = self._schedule(request.schedule_id)
        ms = request.planned_at.ToMilliseconds()
        e = self.executions.get(execution_id(s.id, ms))
        if e is None:
            e = self._new_execution(s, ms, epb.TRIGGER_RERUN)
        elif e.state not in (epb.EXECUTION_STATE_SUCCEEDED, epb.EXECUTION_STATE_FAILED,
                             epb.EXECUTION_STATE_SKIPPED, epb.EXECUTION_STATE_CANCELLED):
            raise Abort(grpc.StatusCode.FAILED_PRECONDITION, f"execution {e.execution_id} is not terminal")
        e.state, e.trigger = epb.EXECUTION_STATE_SCHEDULED, epb.TRIGGER_RERUN
        return sspb.RerunExecutionResponse(execution=e)

    async def Backfill(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        try:
            await self._enter("Backfill", request)
            s = self._schedule(request.schedule_id)
            start, end = request.start_time.ToMilliseconds(), request.end_time.ToMilliseconds()
            if end <= start:
                raise invalid("end_time", "must be after start_time")
        except Abort as e:
            await _abort(context, e)
            return
        # One planned time per minute, in batches of 10.
        times = list(range(start - start % 60_000 + (60_000 if start % 60_000 else 0), end, 60_000))
        p = sspb.BackfillProgress()
        for i in range(0, len(times), 10):
            for ms in times[i:i + 10]:
                p.planned += 1
                if execution_id(s.id, ms) in self.executions:
                    p.existing += 1
                else:
                    p.created += 1
                    if not request.dry_run:
                        self._new_execution(s, ms, epb.TRIGGER_BACKFILL)
            p.processed_until.FromMilliseconds(min(times[i:i + 10][-1] + 1, end))
            if i + 10 < len(times):
                yield copy.deepcopy(p)
        p.done = True
        p.processed_until.FromMilliseconds(end)
        yield p

    async def PreviewSchedule(self, request: Any, context: Any) -> Any:
        after = request.after.ToMilliseconds() if request.HasField("after") else self.clock_ms
        end = None
        if request.WhichOneof("source") == "schedule_id":
            s = self._schedule(request.schedule_id)
            end = s.end_at.ToMilliseconds() if s.HasField("end_at") else None
        elif not request.spec.spec:
            raise invalid("spec.spec", "is required")
        out = []
        for i in range(1, (request.count or 10) + 1):
            t = type(request.after)()
            t.FromMilliseconds(after - after % 60_000 + i * 60_000)
            if end is not None and t.ToMilliseconds() > end:
                break
            out.append(t)
        return sspb.PreviewScheduleResponse(planned_times=out)

    async def GetExecution(self, request: Any, context: Any) -> Any:
        e = self.executions.get(request.execution_id)
        if e is None:
            raise Abort(grpc.StatusCode.NOT_FOUND, f"execution {request.execution_id!r} not found")
        return sspb.GetExecutionResponse(execution=e)

    async def ListExecutions(self, request: Any, context: Any) -> Any:
        items = [e for _, e in sorted(self.executions.items(), reverse=request.newest_first)
                 if (not request.schedule_id or e.schedule_id == request.schedule_id)
                 and (not request.states or e.state in request.states)]
        chunk, token = _page(items, request.page_size, request.page_token)
        return sspb.ListExecutionsResponse(executions=chunk, next_page_token=token)

    async def ListSkips(self, request: Any, context: Any) -> Any:
        if not request.schedule_id:
            raise invalid("schedule_id", "is required")
        chunk, token = _page(self.skips.get(request.schedule_id, []), request.page_size, request.page_token)
        return sspb.ListSkipsResponse(skips=chunk, next_page_token=token)

    async def CancelExecution(self, request: Any, context: Any) -> Any:
        e = self.executions.get(request.execution_id)
        if e is None:
            raise Abort(grpc.StatusCode.NOT_FOUND, f"execution {request.execution_id!r} not found")
        if e.state in (epb.EXECUTION_STATE_SUCCEEDED, epb.EXECUTION_STATE_FAILED, epb.EXECUTION_STATE_CANCELLED):
            raise Abort(grpc.StatusCode.FAILED_PRECONDITION, f"execution {e.execution_id} is already terminal")
        e.state, e.state_message = epb.EXECUTION_STATE_CANCELLED, request.reason
        return sspb.CancelExecutionResponse(execution=e)

    async def ListDeadLetters(self, request: Any, context: Any) -> Any:
        items = [d for _, d in sorted(self.dead.items())
                 if not request.schedule_id or d.execution.schedule_id == request.schedule_id]
        chunk, token = _page(items, request.page_size, request.page_token)
        return sspb.ListDeadLettersResponse(dead_letters=chunk, next_page_token=token)

    def _take_dead(self, eid: str) -> Any:
        d = self.dead.pop(eid, None)
        if d is None:
            raise Abort(grpc.StatusCode.NOT_FOUND, f"{eid!r} is not a dead letter")
        return d

    async def ReplayDeadLetter(self, request: Any, context: Any) -> Any:
        d = self._take_dead(request.execution_id)
        e = self.executions[request.execution_id]
        e.state, e.trigger, e.state_message = epb.EXECUTION_STATE_SCHEDULED, epb.TRIGGER_REPLAY, request.reason
        if request.use_current_schedule:
            e.task_type = self._schedule(e.schedule_id).task_type
        del d
        return sspb.ReplayDeadLetterResponse(execution=e)

    async def DiscardDeadLetter(self, request: Any, context: Any) -> Any:
        self._take_dead(request.execution_id)
        e = self.executions[request.execution_id]
        e.state, e.state_message = epb.EXECUTION_STATE_FAILED, request.reason
        return sspb.DiscardDeadLetterResponse(execution=e)

    def add_dead_letter(self, schedule_id: str, ms: int, reason: str = "exit status 1") -> str:
        s = self._schedule(schedule_id)
        e = self._new_execution(s, ms, epb.TRIGGER_SCHEDULED)
        e.state, e.attempt = epb.EXECUTION_STATE_DEAD_LETTER, 3
        d = epb.DeadLetter(execution=e, payload=s.payload, reason=reason)
        d.dead_lettered_at.FromMilliseconds(ms + 1000)
        self.dead[e.execution_id] = d
        return str(e.execution_id)

    # ---- admin ------------------------------------------------------------------------------------

    async def GetClusterStatus(self, request: Any, context: Any) -> Any:
        r = apb.GetClusterStatusResponse(answered_by="p1", region_policy=self.region, partition_count=2)
        r.server_time.FromMilliseconds(self.clock_ms)
        for info in self.planners.values():
            r.planners.append(apb.PlannerStatus(planner=info, partitions_owned=2, connected_workers=1))
        for p in range(2):
            ps = apb.PartitionStatus(partition=p, owner="p1", owner_region="default",
                                     fencing_token=epb.FencingToken(partition=p, revision=10 + p))
            ps.lag.FromMilliseconds(50)
            r.partitions.append(ps)
        r.worker_pools.append(apb.WorkerPoolStatus(pool="default", region="default", connected_workers=1,
                                                   capacity=8, running=0))
        return r

    async def Switchover(self, request: Any, context: Any) -> Any:
        if not request.target_region:
            raise invalid("target_region", "is required")
        if request.target_region not in {p.region for p in self.planners.values()}:
            raise Abort(grpc.StatusCode.FAILED_PRECONDITION,
                        f"region {request.target_region!r}: no planner has ever registered in it")
        if request.HasField("expected_version") and request.expected_version != self.region.version:
            raise Abort(grpc.StatusCode.ABORTED, "region policy version is stale")
        self.region = cpb.RegionPolicy(primary_region=request.target_region, version=self.region.version + 1,
                                       reason=request.reason)
        return apb.SwitchoverResponse(region_policy=self.region)

    async def DrainPlanner(self, request: Any, context: Any) -> Any:
        info = self.planners.get(request.node_id)
        if info is None:
            raise Abort(grpc.StatusCode.NOT_FOUND, f"no planner {request.node_id!r}")
        others = [p for p in self.planners.values() if p.node_id != info.node_id
                  and p.liveness != cpb.PLANNER_LIVENESS_DRAINING]
        if not others and info.liveness != cpb.PLANNER_LIVENESS_DRAINING and not request.force:
            raise Abort(grpc.StatusCode.FAILED_PRECONDITION,
                        f"{info.node_id!r} is the only live planner that is not draining; pass force")
        info.liveness = cpb.PLANNER_LIVENESS_DRAINING
        return apb.DrainPlannerResponse(planner=info)

    async def UndrainPlanner(self, request: Any, context: Any) -> Any:
        info = self.planners.get(request.node_id)
        if info is None:
            raise Abort(grpc.StatusCode.NOT_FOUND, f"no planner {request.node_id!r}")
        info.liveness = cpb.PLANNER_LIVENESS_ALIVE
        return apb.UndrainPlannerResponse(planner=info)

    async def GetTime(self, request: Any, context: Any) -> Any:
        r = apb.GetTimeResponse(node_id="p1", region="default")
        r.server_time.FromMilliseconds(self.clock_ms)
        return r


async def start_fake(api: FakeApi) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    ssgrpc.add_ScheduleServiceServicer_to_server(api, server)
    agrpc.add_AdminServiceServicer_to_server(api, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


async def _serve_until_terminated() -> None:
    """`python tests/client/fake_server.py`: serve a fresh FakeApi on a free port, print
    `serving HOST:PORT`, stop on SIGTERM (tests/client/conftest.py's `fake_server_process`)."""
    import asyncio
    import signal

    server, address = await start_fake(FakeApi())
    print(f"serving {address}", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.stop(grace=None)


if __name__ == "__main__":
    import asyncio

    asyncio.run(_serve_until_terminated())
