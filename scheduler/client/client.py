"""`SchedulerClient`: the async client for ScheduleService and AdminService over grpc.aio.

Every method takes an optional `timeout` (seconds, default the client's); it bounds the whole call,
retries included. Reads are retried on UNAVAILABLE (scheduler/client/retry.py); every failure is
raised as `ClientError` with the status code, the message and the fields the server named. Methods
return the generated protobuf messages (scheduler._gen.scheduler.v1), so nothing is lost between
the wire and the caller.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc
from google.protobuf.duration_pb2 import Duration
from google.protobuf.field_mask_pb2 import FieldMask

from scheduler._gen.scheduler.v1 import admin_service_pb2 as apb
from scheduler._gen.scheduler.v1 import admin_service_pb2_grpc as agrpc
from scheduler._gen.scheduler.v1 import execution_pb2 as epb
from scheduler._gen.scheduler.v1 import schedule_pb2 as spb
from scheduler._gen.scheduler.v1 import schedule_service_pb2 as sspb
from scheduler._gen.scheduler.v1 import schedule_service_pb2_grpc as ssgrpc
from scheduler.auth.bearer import bearer_interceptors
from scheduler.client.errors import ClientError, from_rpc_error
from scheduler.client.instants import Instant, timestamp
from scheduler.client.retry import READS, RETRYABLE, RetryPolicy
from scheduler.client.settings import DEFAULT_SERVER
from scheduler.tls import ClientTls, Dialer

T = TypeVar("T")
# Payloads up to 64 KiB and pages of 1,000 schedules fit well below this.
_MAX_MESSAGE = 32 * 1024 * 1024


DEFAULT_NAME = "default"  # tenant and worker pool when the caller gives none (as the CLI)


def _time_range(start: Instant | None, end: Instant | None) -> Any:
    r = sspb.TimeRange()
    if start is not None:
        r.start.CopyFrom(timestamp(start))
    if end is not None:
        r.end.CopyFrom(timestamp(end))
    return r


class SchedulerClient:
    """One channel to one planner node (any node answers for any schedule)."""

    def __init__(self, address: str = DEFAULT_SERVER, *, timeout: float = 10.0,
                 retry: RetryPolicy | None = None, channel: grpc.aio.Channel | None = None,
                 tls: ClientTls | None = None, token: str | None = None) -> None:
        """`tls`: TLS (mutual with a certificate) with files read now; a client made after a certificate
        rotation uses the new files (scheduler/tls.py). None: plaintext. `token`: a bearer token sent on
        every call (`authorization: Bearer <token>`), for a cluster with auth on (docs/operations.md,
        "Security"); `read_token_file` reads one from a file."""
        self.address = address
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self._channel = channel or Dialer(tls).aio_channel(address, interceptors=bearer_interceptors(token), options=[
            ("grpc.max_receive_message_length", _MAX_MESSAGE),
            ("grpc.max_send_message_length", _MAX_MESSAGE),
        ])
        self._schedules = ssgrpc.ScheduleServiceStub(self._channel)
        self._admin = agrpc.AdminServiceStub(self._channel)

    async def __aenter__(self) -> SchedulerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close(None)

    async def _call(self, method: str, rpc: Callable[..., Awaitable[T]], request: Any,
                    timeout: float | None) -> T:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        attempts = self.retry.max_attempts if method in READS else 1
        attempt = 0
        while True:
            attempt += 1
            remaining = deadline - time.monotonic()
            try:
                if remaining <= 0:
                    raise ClientError(grpc.StatusCode.DEADLINE_EXCEEDED, f"{method}: deadline exceeded")
                return await rpc(request, timeout=remaining)
            except grpc.RpcError as e:
                err = from_rpc_error(e)
                pause = self.retry.backoff(attempt)
                if err.code not in RETRYABLE or attempt >= attempts or time.monotonic() + pause >= deadline:
                    raise err from None
                await asyncio.sleep(pause)

    # ---- schedules ------------------------------------------------------------------------------

    async def create_schedule(self, schedule: Any, *, request_id: str = "", timeout: float | None = None) -> Any:
        """Create `schedule` (a `Schedule` message); returns the stored one. ALREADY_EXISTS if taken.
        An empty `tenant` or `worker_pool` is sent as `default`, as `schedctl schedule create` does (the
        API itself requires both); the caller's message is not modified."""
        if not schedule.tenant or not schedule.worker_pool:
            filled = type(schedule)()
            filled.CopyFrom(schedule)
            filled.tenant = filled.tenant or DEFAULT_NAME
            filled.worker_pool = filled.worker_pool or DEFAULT_NAME
            schedule = filled
        req = sspb.CreateScheduleRequest(schedule=schedule, request_id=request_id)
        return (await self._call("CreateSchedule", self._schedules.CreateSchedule, req, timeout)).schedule

    async def batch_create_schedules(self, schedules: Sequence[Any], *, request_id: str = "",
                                     timeout: float | None = None) -> list[Any]:
        """Create up to 1000 `Schedule` messages in one call; returns one `BatchCreateResult` per schedule
        (`schedule` set when created, `already_exists` when the id was taken). INVALID_ARGUMENT names
        `schedules[i].<field>` and writes nothing. Empty `tenant`/`worker_pool` are sent as `default`."""
        filled = []
        for schedule in schedules:
            if not schedule.tenant or not schedule.worker_pool:
                copy = type(schedule)()
                copy.CopyFrom(schedule)
                copy.tenant = copy.tenant or DEFAULT_NAME
                copy.worker_pool = copy.worker_pool or DEFAULT_NAME
                schedule = copy
            filled.append(schedule)
        req = sspb.BatchCreateSchedulesRequest(schedules=filled, request_id=request_id)
        return list((await self._call("BatchCreateSchedules", self._schedules.BatchCreateSchedules, req,
                                      timeout)).results)

    async def get_schedule(self, schedule_id: str, *, timeout: float | None = None) -> Any:
        req = sspb.GetScheduleRequest(id=schedule_id)
        return (await self._call("GetSchedule", self._schedules.GetSchedule, req, timeout)).schedule

    async def update_schedule(self, schedule: Any, *, update_mask: Sequence[str] = (),
                              expected_version: int | None = None, timeout: float | None = None) -> Any:
        """Change the fields named in `update_mask` (empty: every non-default field of `schedule`)."""
        req = sspb.UpdateScheduleRequest(schedule=schedule, update_mask=FieldMask(paths=list(update_mask)))
        if expected_version is not None:
            req.expected_version = expected_version
        return (await self._call("UpdateSchedule", self._schedules.UpdateSchedule, req, timeout)).schedule

    async def delete_schedule(self, schedule_id: str, *, expected_version: int | None = None,
                              cancel_running: bool = False, allow_missing: bool = False,
                              timeout: float | None = None) -> bool:
        """Whether a schedule was deleted (False: none of that id, with `allow_missing`)."""
        req = sspb.DeleteScheduleRequest(id=schedule_id, cancel_running=cancel_running, allow_missing=allow_missing)
        if expected_version is not None:
            req.expected_version = expected_version
        r = await self._call("DeleteSchedule", self._schedules.DeleteSchedule, req, timeout)
        return bool(r.deleted)

    async def list_schedules(self, *, tenant: str = "", label_selector: str = "",
                             state: spb.ScheduleState = spb.SCHEDULE_STATE_UNSPECIFIED,
                             page_size: int = 0, page_token: str = "", timeout: float | None = None) -> Any:
        """One page: a `ListSchedulesResponse` (schedules, next_page_token)."""
        req = sspb.ListSchedulesRequest(tenant=tenant, label_selector=label_selector, state=state,
                                        page_size=page_size, page_token=page_token)
        return await self._call("ListSchedules", self._schedules.ListSchedules, req, timeout)

    async def iter_schedules(self, *, tenant: str = "", label_selector: str = "",
                             state: spb.ScheduleState = spb.SCHEDULE_STATE_UNSPECIFIED,
                             page_size: int = 0, timeout: float | None = None) -> AsyncIterator[Any]:
        """Every matching schedule, page after page (each page with its own deadline)."""
        token = ""
        while True:
            page = await self.list_schedules(tenant=tenant, label_selector=label_selector, state=state,
                                             page_size=page_size, page_token=token, timeout=timeout)
            for s in page.schedules:
                yield s
            token = page.next_page_token
            if not token:
                return

    async def pause_schedule(self, schedule_id: str, *, reason: str = "", cancel_running: bool = False,
                             expected_version: int | None = None, timeout: float | None = None) -> Any:
        req = sspb.PauseScheduleRequest(id=schedule_id, reason=reason, cancel_running=cancel_running)
        if expected_version is not None:
            req.expected_version = expected_version
        return (await self._call("PauseSchedule", self._schedules.PauseSchedule, req, timeout)).schedule

    async def resume_schedule(self, schedule_id: str, *, expected_version: int | None = None,
                              timeout: float | None = None) -> Any:
        req = sspb.ResumeScheduleRequest(id=schedule_id)
        if expected_version is not None:
            req.expected_version = expected_version
        return (await self._call("ResumeSchedule", self._schedules.ResumeSchedule, req, timeout)).schedule

    async def trigger_schedule(self, schedule_id: str, *, trigger_time: Instant | None = None,
                               overlap_policy: spb.OverlapPolicy = spb.OVERLAP_POLICY_UNSPECIFIED,
                               timeout: float | None = None) -> Any:
        """Run now; returns the MANUAL execution. Pass `trigger_time` to make a retry idempotent."""
        req = sspb.TriggerScheduleRequest(id=schedule_id, overlap_policy=overlap_policy)
        if trigger_time is not None:
            req.trigger_time.CopyFrom(timestamp(trigger_time))
        return (await self._call("TriggerSchedule", self._schedules.TriggerSchedule, req, timeout)).execution

    async def rerun_execution(self, schedule_id: str, planned_at: Instant, *, timeout: float | None = None) -> Any:
        req = sspb.RerunExecutionRequest(schedule_id=schedule_id, planned_at=timestamp(planned_at))
        return (await self._call("RerunExecution", self._schedules.RerunExecution, req, timeout)).execution

    async def backfill(self, schedule_id: str, start: Instant, end: Instant, *,
                       overlap_policy: spb.OverlapPolicy = spb.OVERLAP_POLICY_UNSPECIFIED, dry_run: bool = False,
                       timeout: float | None = None) -> AsyncIterator[Any]:
        """Yield `BackfillProgress` messages until the one with `done`. Not retried: run it again after
        an interruption (planned times that already have an execution are left alone).

        `timeout` (default: none) bounds the whole stream: a big range takes as long as it takes.
        Leaving the loop early cancels the call, which stops the backfill after the batch in flight."""
        req = sspb.BackfillRequest(schedule_id=schedule_id, start_time=timestamp(start), end_time=timestamp(end),
                                   overlap_policy=overlap_policy, dry_run=dry_run)
        call = self._schedules.Backfill(req, timeout=timeout)
        try:
            async for progress in call:
                yield progress
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        finally:
            call.cancel()  # no-op once the stream has ended

    async def preview_schedule(self, *, schedule_id: str | None = None, spec: Any = None,
                               after: Instant | None = None, count: int = 0,
                               timeout: float | None = None) -> list[Any]:
        """Next planned times (Timestamps) of a stored schedule or of an inline `PreviewSpec`."""
        if (schedule_id is None) == (spec is None):
            raise ValueError("pass exactly one of schedule_id and spec")
        req = sspb.PreviewScheduleRequest(count=count)
        if schedule_id is not None:
            req.schedule_id = schedule_id
        else:
            req.spec.CopyFrom(spec)
        if after is not None:
            req.after.CopyFrom(timestamp(after))
        return list((await self._call("PreviewSchedule", self._schedules.PreviewSchedule, req,
                                      timeout)).planned_times)

    # ---- executions -----------------------------------------------------------------------------

    async def get_execution(self, execution_id: str, *, timeout: float | None = None) -> Any:
        req = sspb.GetExecutionRequest(execution_id=execution_id)
        return (await self._call("GetExecution", self._schedules.GetExecution, req, timeout)).execution

    async def list_executions(self, *, schedule_id: str = "", tenant: str = "",
                              states: Sequence[epb.ExecutionState] = (),
                              planned_start: Instant | None = None, planned_end: Instant | None = None,
                              newest_first: bool = False, page_size: int = 0, page_token: str = "",
                              timeout: float | None = None) -> Any:
        """One page: a `ListExecutionsResponse` (executions, next_page_token)."""
        req = sspb.ListExecutionsRequest(schedule_id=schedule_id, tenant=tenant, states=list(states),
                                         newest_first=newest_first, page_size=page_size, page_token=page_token)
        if planned_start is not None or planned_end is not None:
            req.planned.CopyFrom(_time_range(planned_start, planned_end))
        return await self._call("ListExecutions", self._schedules.ListExecutions, req, timeout)

    async def iter_executions(self, *, limit: int | None = None, **filters: Any) -> AsyncIterator[Any]:
        """Every matching execution (at most `limit`), page after page; filters as list_executions."""
        async for x in _pages(lambda token: self.list_executions(page_token=token, **filters), "executions", limit):
            yield x

    async def list_skips(self, schedule_id: str, *, planned_start: Instant | None = None,
                         planned_end: Instant | None = None, page_size: int = 0, page_token: str = "",
                         timeout: float | None = None) -> Any:
        """One page: a `ListSkipsResponse` (skips, next_page_token), the planned times not run and why."""
        req = sspb.ListSkipsRequest(schedule_id=schedule_id, page_size=page_size, page_token=page_token)
        if planned_start is not None or planned_end is not None:
            req.planned.CopyFrom(_time_range(planned_start, planned_end))
        return await self._call("ListSkips", self._schedules.ListSkips, req, timeout)

    async def iter_skips(self, schedule_id: str, *, limit: int | None = None, **filters: Any) -> AsyncIterator[Any]:
        """Every skipped planned time (at most `limit`), page after page; filters as list_skips."""
        async for x in _pages(lambda token: self.list_skips(schedule_id, page_token=token, **filters), "skips", limit):
            yield x

    async def cancel_execution(self, execution_id: str, *, reason: str = "", timeout: float | None = None) -> Any:
        req = sspb.CancelExecutionRequest(execution_id=execution_id, reason=reason)
        return (await self._call("CancelExecution", self._schedules.CancelExecution, req, timeout)).execution

    # ---- dead letters ---------------------------------------------------------------------------

    async def list_dead_letters(self, *, schedule_id: str = "", tenant: str = "", task_type: str = "",
                                start: Instant | None = None, end: Instant | None = None, page_size: int = 0,
                                page_token: str = "", timeout: float | None = None) -> Any:
        """One page: a `ListDeadLettersResponse` (dead_letters, next_page_token)."""
        req = sspb.ListDeadLettersRequest(schedule_id=schedule_id, tenant=tenant, task_type=task_type,
                                          page_size=page_size, page_token=page_token)
        if start is not None or end is not None:
            req.dead_lettered.CopyFrom(_time_range(start, end))
        return await self._call("ListDeadLetters", self._schedules.ListDeadLetters, req, timeout)

    async def iter_dead_letters(self, *, limit: int | None = None, **filters: Any) -> AsyncIterator[Any]:
        async for x in _pages(lambda token: self.list_dead_letters(page_token=token, **filters), "dead_letters", limit):
            yield x

    async def replay_dead_letter(self, execution_id: str, *, reason: str = "", use_current_schedule: bool = False,
                                 timeout: float | None = None) -> Any:
        """Run a dead letter again: as it died (default) or with the schedule's current payload, task type,
        pool, retry policy and timeout (`use_current_schedule`)."""
        req = sspb.ReplayDeadLetterRequest(execution_id=execution_id, reason=reason,
                                           use_current_schedule=use_current_schedule)
        return (await self._call("ReplayDeadLetter", self._schedules.ReplayDeadLetter, req, timeout)).execution

    async def discard_dead_letter(self, execution_id: str, *, reason: str = "", timeout: float | None = None) -> Any:
        req = sspb.DiscardDeadLetterRequest(execution_id=execution_id, reason=reason)
        return (await self._call("DiscardDeadLetter", self._schedules.DiscardDeadLetter, req, timeout)).execution

    # ---- admin ----------------------------------------------------------------------------------

    async def cluster_status(self, *, timeout: float | None = None) -> Any:
        """A `GetClusterStatusResponse` as the answering node sees the cluster."""
        return await self._call("GetClusterStatus", self._admin.GetClusterStatus, apb.GetClusterStatusRequest(),
                                timeout)

    async def switchover(self, target_region: str, *, reason: str = "", expected_version: int | None = None,
                         standby: Sequence[str] = (), failover_grace_ms: int | None = None, failback: str = "",
                         failback_stable_ms: int | None = None, timeout: float | None = None) -> Any:
        """Make `target_region` primary (and set the policy's settings given); returns the `RegionPolicy`
        now in force."""
        req = apb.SwitchoverRequest(target_region=target_region, reason=reason, standby_regions=list(standby),
                                    failback=failback)
        if expected_version is not None:
            req.expected_version = expected_version
        if failover_grace_ms is not None:
            req.failover_grace.CopyFrom(_ms(failover_grace_ms))
        if failback_stable_ms is not None:
            req.failback_stable.CopyFrom(_ms(failback_stable_ms))
        return (await self._call("Switchover", self._admin.Switchover, req, timeout)).region_policy

    async def set_worker_affinity(self, pool: str, mode: str, *, default: bool = False,
                                  prefer_wait_ms: int | None = None, clear: bool = False, reason: str = "",
                                  expected_version: int | None = None, timeout: float | None = None) -> Any:
        """Set `pool`'s worker affinity (`default`: the default's) in the region policy; `clear` removes
        the pool's override. Returns the `RegionPolicy` now in force."""
        req = apb.SetWorkerAffinityRequest(pool=pool, default_affinity=default, mode=mode, clear=clear, reason=reason)
        if prefer_wait_ms is not None:
            req.prefer_wait.CopyFrom(_ms(prefer_wait_ms))
        if expected_version is not None:
            req.expected_version = expected_version
        return (await self._call("SetWorkerAffinity", self._admin.SetWorkerAffinity, req, timeout)).region_policy

    async def drain_planner(self, node_id: str, *, reason: str = "", force: bool = False,
                            timeout: float | None = None) -> Any:
        """Tell planner `node_id` to hand its partitions over; returns its `PlannerInfo` (DRAINING).
        Refused (FAILED_PRECONDITION) when it would leave no planner to own partitions, unless `force`."""
        req = apb.DrainPlannerRequest(node_id=node_id, reason=reason, force=force)
        return (await self._call("DrainPlanner", self._admin.DrainPlanner, req, timeout)).planner

    async def undrain_planner(self, node_id: str, *, timeout: float | None = None) -> Any:
        """Withdraw a drain request: the planner claims partitions again; returns its `PlannerInfo`."""
        req = apb.UndrainPlannerRequest(node_id=node_id)
        return (await self._call("UndrainPlanner", self._admin.UndrainPlanner, req, timeout)).planner

    async def get_time(self, *, timeout: float | None = None) -> Any:
        return await self._call("GetTime", self._admin.GetTime, apb.GetTimeRequest(), timeout)

    def iter_audit_events(self, *, limit: int | None = None, newest_first: bool = False, page_size: int = 0,
                          timeout: float | None = None) -> AsyncIterator[Any]:
        """The audit log's `AuditEvent`s (system:admin), oldest first unless `newest_first`, at most `limit`."""
        async def fetch(token: str) -> Any:
            req = apb.ListAuditEventsRequest(page_size=page_size, page_token=token, newest_first=newest_first)
            return await self._call("ListAuditEvents", self._admin.ListAuditEvents, req, timeout)
        return _pages(fetch, "events", limit)

    # ---- tenant quotas (docs/operations.md, "Quotas") ----------------------------------------------------

    async def set_tenant_quota(self, tenant: str | None, *, schedules: int | None = None,
                               executions_per_second: float | None = None, backfill: int | None = None,
                               labels: int | None = None, payload_bytes: int | None = None, reason: str = "",
                               expected_version: int | None = None, timeout: float | None = None) -> Any:
        """Set the given limits (None: unchanged; 0: unlimited) of `tenant`, or of the default (None);
        returns the `TenantQuota` written. Needs system:admin."""
        given = {"max_schedules": schedules, "max_executions_per_second": executions_per_second,
                 "max_backfill": backfill, "max_labels": labels, "max_payload_bytes": payload_bytes}
        q = apb.TenantQuota()
        for k, v in given.items():
            if v is not None:
                setattr(q, k, v)
        req = apb.SetTenantQuotaRequest(tenant=tenant or "", default_quota=tenant is None, quota=q, reason=reason)
        req.update_mask.paths.extend(k for k, v in given.items() if v is not None)
        if not req.update_mask.paths:
            raise ValueError("give at least one limit to set")
        if expected_version is not None:
            req.expected_version = expected_version
        return (await self._call("SetTenantQuota", self._admin.SetTenantQuota, req, timeout)).quota

    async def get_tenant_quota(self, tenant: str | None, *, timeout: float | None = None) -> Any:
        """The `GetTenantQuotaResponse` of `tenant` (its limits, own_record, schedules_held), or the default's."""
        req = apb.GetTenantQuotaRequest(tenant=tenant or "", default_quota=tenant is None)
        return await self._call("GetTenantQuota", self._admin.GetTenantQuota, req, timeout)

    async def list_tenant_quotas(self, *, timeout: float | None = None) -> tuple[list[Any], Any | None]:
        """(every tenant's own `TenantQuota`, the default's or None)."""
        out: list[Any] = []
        token, default = "", None
        while True:
            req = apb.ListTenantQuotasRequest(page_token=token)
            page = await self._call("ListTenantQuotas", self._admin.ListTenantQuotas, req, timeout)
            out += list(page.quotas)
            if page.HasField("default_quota"):
                default = page.default_quota
            token = page.next_page_token
            if not token:
                return out, default

    async def delete_tenant_quota(self, tenant: str | None, *, timeout: float | None = None) -> bool:
        req = apb.DeleteTenantQuotaRequest(tenant=tenant or "", default_quota=tenant is None)
        return bool((await self._call("DeleteTenantQuota", self._admin.DeleteTenantQuota, req, timeout)).deleted)


__all__ = ["ClientError", "SchedulerClient"]


async def _pages(fetch: Callable[[str], Awaitable[Any]], field: str, limit: int | None) -> AsyncIterator[Any]:
    """The items of `field` of every page `fetch(page_token)` returns, at most `limit`."""
    token, n = "", 0
    while True:
        page = await fetch(token)
        for x in getattr(page, field):
            if limit is not None and n >= limit:
                return
            n += 1
            yield x
        token = page.next_page_token
        if not token:
            return


def _ms(ms: int) -> Duration:
    d = Duration()
    d.FromMilliseconds(ms)  # keeps seconds and nanos of one sign (a negative grace reaches the server's check)
    return d
