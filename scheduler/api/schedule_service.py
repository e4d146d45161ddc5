"""ScheduleService: the gRPC edge over the schedule store, the ledger and the operations.

Handlers validate and convert at the edge (requests -> domain objects, errors -> statuses via
api/errors.py), then call the store (schedules: compare-and-swap on the schedule key, so any node
may serve any schedule) or the operations port (trigger, rerun, backfill, cancel, dead letters).
Read-modify-write calls (update, pause, resume) re-read and re-apply on a concurrent change unless
the caller pinned expected_version, so an unconditional update never writes back a stale copy of
fields it did not mean to change.
"""

from __future__ import annotations

import contextlib
import heapq
import json
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from scheduler._gen.scheduler.v1 import schedule_pb2 as pb
from scheduler._gen.scheduler.v1 import schedule_service_pb2 as spb
from scheduler.api import inputs, masks, paging
from scheduler.api.convert import (
    dead_letter_to_pb,
    execution_state_from_pb,
    execution_to_pb,
    overlap_from_pb,
    schedule_from_pb,
    schedule_to_pb,
    skip_reason_pb,
    timestamp_ms,
)
from scheduler.api.errors import Context, grpc_errors, grpc_stream_errors
from scheduler.api.ports import OperationsPort
from scheduler.api.quota_checks import check_backfill, check_shape
from scheduler.api.reads import page, prefix_range, scan
from scheduler.api.selector import parse_selector
from scheduler.auth.access import OPEN, Access, Authz
from scheduler.auth.principal import Role
from scheduler.clock import Clock
from scheduler.errors import AlreadyExists, InvalidArgument, NotFound, SchedError, VersionMismatch
from scheduler.execution import ExecState, Execution, dead_reason
from scheduler.ids import ExecutionId, execution_id
from scheduler.model import Schedule, ScheduleState, plan_for, validate_schedule
from scheduler.quota import store as quota_store
from scheduler.quota.record import Quota
from scheduler.store.codec import decode_execution, peek_state
from scheduler.store.keyspace import Keyspace, partition_for
from scheduler.store.kv import KV
from scheduler.store.ledger import DeadLetterEntry, Ledger
from scheduler.store.schedules import ScheduleStore, StoredSchedule, over_quota
from scheduler.timeconv import ms_to_timestamp
from scheduler.timeplan import DstGap, DstOverlap, Plan, parse_spec
from scheduler.timeplan.hashing import uses_hash
from scheduler.timeplan.plan import check_in_window
from scheduler.timeplan.zone import check_zone_name

_E = TypeVar("_E", DstGap, DstOverlap)
PREVIEW_DEFAULT, PREVIEW_MAX = 10, 1000
# Schedules one BatchCreateSchedules call may carry: about 0.6-1 MB of request at typical sizes. With large
# payloads the message limit (32 MiB here, 4 MiB on a default client) comes first: callers cut by size too
# (`schedctl schedule apply`: cli/apply.py).
BATCH_MAX = 1000
_RMW_ATTEMPTS = 8  # re-reads of an unconditional read-modify-write racing other writers
# Records one page of a listing across every schedule (ListExecutions without schedule_id) reads at most.
CROSS_SCHEDULE_SCAN = 10_000


def stored_to_pb(st: StoredSchedule) -> pb.Schedule:
    out = schedule_to_pb(st.schedule)
    if st.meta.created_ms:
        out.created_at.CopyFrom(ms_to_timestamp(st.meta.created_ms))
    if st.meta.updated_ms:
        out.updated_at.CopyFrom(ms_to_timestamp(st.meta.updated_ms))
    return out


class ScheduleService:
    """Registered with schedule_service_pb2_grpc.add_ScheduleServiceServicer_to_server."""

    def __init__(self, *, kv: KV, ks: Keyspace, store: ScheduleStore, ledger: Ledger, clock: Clock,
                 ops: OperationsPort, rpc_timeout: float, authz: Authz = OPEN) -> None:
        self.kv, self.ks, self.store, self.ledger, self.clock = kv, ks, store, ledger, clock
        self.ops, self.timeout, self.authz = ops, rpc_timeout, authz

    # ---- tenant checks (scheduler/auth/access.py) --------------------------------------------------------

    async def _check_schedule(self, acc: Access, sid: str, role: Role) -> None:
        """For the operations (trigger, rerun, backfill), which read the schedule themselves: the tenant check
        alone, and no extra read with auth off."""
        if acc.enforcing:
            await self._schedule_for(acc, sid, role)

    async def _schedule_for(self, acc: Access, sid: str, role: Role) -> StoredSchedule:
        """The stored schedule, if the caller may act as `role` on its tenant; another tenant's is NOT_FOUND
        with the store's own message for a missing id."""
        st = await self.store.get(sid)
        acc.require_on(role, st.schedule.tenant, f"schedule {sid!r} not found")
        return st

    async def _execution_for(self, acc: Access, execution_id: str, role: Role, missing: str) -> Execution | None:
        """Check the caller's `role` on the execution's tenant (NOT_FOUND `missing` for another tenant's);
        None when there is no such record (the operation then says so itself), or auth is off (no read)."""
        eid = ExecutionId.parse(execution_id)
        if not acc.enforcing:
            return None
        e = await self.ledger.get(self.kv, eid.schedule_id, eid.planned_ms, timeout=self.timeout)
        if e is not None:
            acc.require_on(role, e.tenant, missing)
        return e

    # ---- schedules --------------------------------------------------------------------------------

    @grpc_errors
    async def CreateSchedule(self, request: spb.CreateScheduleRequest, context: Context) -> spb.CreateScheduleResponse:
        if not request.HasField("schedule"):
            raise InvalidArgument("schedule", "is required")
        rid = inputs.request_id(request.request_id)
        s = _domain(request.schedule)
        s = replace(s, version=0, paused_reason=s.paused_reason if s.state is ScheduleState.PAUSED else "")
        inputs.reason(s.paused_reason, "schedule.paused_reason")
        _validate(s)
        acc = self.authz.access()
        acc.require_named(Role.WRITER, s.tenant)
        acc.check_pool(s.worker_pool, s.tenant)
        q, held = await quota_store.effective_and_usage(self.kv, self.ks, s.tenant, timeout=self.timeout)
        check_shape(q, s)
        st = await self.store.create(s, self.clock.wall_ms(), request_id=rid, limit=q.schedules, usage=held)
        if acc.enforcing and st.schedule.tenant != s.tenant:
            # A "retry" (same request_id) of a create another tenant made: never hand its schedule over.
            raise AlreadyExists(f"schedule {s.id!r} already exists")
        return spb.CreateScheduleResponse(schedule=stored_to_pb(st))

    @grpc_errors
    async def BatchCreateSchedules(self, request: spb.BatchCreateSchedulesRequest,
                                   context: Context) -> spb.BatchCreateSchedulesResponse:
        """Validation all or nothing (the first invalid item fails the call, nothing written), then each
        free id created; a taken one is reported per item (docs/api.md, "Batch create")."""
        n = len(request.schedules)
        if not 1 <= n <= BATCH_MAX:
            raise InvalidArgument("schedules", f"has {n} items; send 1-{BATCH_MAX}")
        rid = inputs.request_id(request.request_id)
        items: list[Schedule] = []
        seen: dict[str, int] = {}
        for i, m in enumerate(request.schedules):
            try:
                s = _domain(m)
                s = replace(s, version=0, paused_reason=s.paused_reason if s.state is ScheduleState.PAUSED else "")
                inputs.reason(s.paused_reason, "schedule.paused_reason")
                _validate(s)
            except InvalidArgument as e:
                raise _item_error(e, i) from None
            if s.id in seen:
                raise InvalidArgument(f"schedules[{i}].id", f"{s.id!r} is also item {seen[s.id]}")
            seen[s.id] = i
            items.append(s)
        # Every item's tenant and pool, before anything is written (all or nothing, as validation).
        acc = self.authz.access()
        for s in items:
            acc.require_named(Role.WRITER, s.tenant)
            acc.check_pool(s.worker_pool, s.tenant)
        # Quotas too, before anything is written: create_many writes in several txns (each one checks the
        # tenant's counter again, so a race with another create still cannot pass a limit).
        quotas = {t: await self._quota(t) for t in sorted({s.tenant for s in items})}
        for i, s in enumerate(items):
            check_shape(quotas[s.tenant], s, f"schedules[{i}]")
        limits = {t: q.schedules for t, q in quotas.items() if q.schedules}
        for t, limit in limits.items():
            await self._check_room(t, limit, [s for s in items if s.tenant == t])
        got = await self.store.create_many(items, self.clock.wall_ms(), request_id=rid, limits=limits)
        # As CreateSchedule: a "retry" of a create another tenant made never hands its schedule over.
        return spb.BatchCreateSchedulesResponse(results=[
            spb.BatchCreateResult(already_exists=True)
            if st is None or (acc.enforcing and st.schedule.tenant != s.tenant)
            else spb.BatchCreateResult(schedule=stored_to_pb(st)) for s, st in zip(items, got, strict=True)])

    async def _quota(self, tenant: str) -> Quota:
        """The limits that apply to `tenant` now, read from etcd (one txn): a change applies to the next call."""
        return await quota_store.effective(self.kv, self.ks, tenant, timeout=self.timeout)

    async def _check_room(self, tenant: str, limit: int, items: list[Schedule]) -> None:
        """A batch's items of one tenant fit under its schedules quota (ids already taken do not count)."""
        u = await self.store.usage(tenant, limit)
        if u.schedules + len(items) <= limit:
            return
        taken = 0
        for s in items:
            taken += await self.kv.get(self.ks.schedule(self.store.partition(s.id), s.id),
                                       timeout=self.timeout) is not None
        if u.schedules + len(items) - taken > limit:
            raise over_quota(tenant, limit, u.schedules, len(items) - taken)

    @grpc_errors
    async def GetSchedule(self, request: spb.GetScheduleRequest, context: Context) -> spb.GetScheduleResponse:
        st = await self._schedule_for(self.authz.access(), inputs.schedule_id(request.id), Role.READER)
        return spb.GetScheduleResponse(schedule=stored_to_pb(st))

    async def _rmw(self, sid: str, expected: int | None,
                   change: Callable[[StoredSchedule], Schedule | None]) -> StoredSchedule:
        """Read, change, compare-and-swap; on a concurrent write re-read (only if `expected` is None).
        The caller must hold the writer role on the schedule's tenant (checked on every read: the tenant
        cannot change, but the schedule may be deleted and created again by another tenant meanwhile)."""
        acc = self.authz.access()
        for _ in range(_RMW_ATTEMPTS):
            cur = await self._schedule_for(acc, sid, Role.WRITER)
            if expected is not None and cur.schedule.version != expected:
                raise VersionMismatch(f"schedule {sid!r} is at version {cur.schedule.version}, not {expected}")
            new = change(cur)
            if new is None:
                return cur  # nothing to change
            try:
                return await self.store.update(new, cur.schedule.version, self.clock.wall_ms())
            except VersionMismatch:
                if expected is not None:
                    raise
        raise VersionMismatch(f"schedule {sid!r} keeps changing concurrently; try again")

    @grpc_errors
    async def UpdateSchedule(self, request: spb.UpdateScheduleRequest, context: Context) -> spb.UpdateScheduleResponse:
        if not request.HasField("schedule"):
            raise InvalidArgument("schedule", "is required")
        sid = inputs.schedule_id(request.schedule.id, "schedule.id")
        expected = request.expected_version if request.HasField("expected_version") else None
        paths = list(request.update_mask.paths)
        quotas: dict[str, Quota] = {}

        def change(cur: StoredSchedule) -> Schedule | None:
            stored = schedule_to_pb(cur.schedule)
            effective = masks.effective_paths(request.schedule, stored, paths)
            if not effective:
                return None  # an empty mask and nothing set: nothing to change, no new version
            s = replace(_domain(masks.apply(stored, request.schedule, effective)), version=cur.schedule.version)
            _validate(s)
            self.authz.access().check_pool(s.worker_pool, s.tenant)
            if s.tenant in quotas:
                check_shape(quotas[s.tenant], s)
            return s

        # The tenant's limits, read before the read-modify-write, when the update can change what they bound
        # (labels, payload): other updates cost no extra reads.
        touched = {p.split(".")[0] for p in paths} if paths else {
            f.name for f, _ in request.schedule.ListFields()}
        if touched & {"labels", "payload", "*"}:
            with contextlib.suppress(NotFound):
                cur = await self.store.get(sid)
                quotas[cur.schedule.tenant] = await self._quota(cur.schedule.tenant)

        st = await self._rmw(sid, expected, change)
        return spb.UpdateScheduleResponse(schedule=stored_to_pb(st))

    @grpc_errors
    async def DeleteSchedule(self, request: spb.DeleteScheduleRequest, context: Context) -> spb.DeleteScheduleResponse:
        sid = inputs.schedule_id(request.id)
        expected = request.expected_version if request.HasField("expected_version") else None
        try:
            cur = await self._schedule_for(self.authz.access(), sid, Role.WRITER)
            if expected is not None and cur.schedule.version != expected:
                raise VersionMismatch(f"schedule {sid!r} is at version {cur.schedule.version}, not {expected}")
            try:
                await self.store.delete(sid, expected if expected is not None else cur.schedule.version,
                                        now_ms=self.clock.wall_ms())
            except VersionMismatch:
                if expected is not None:
                    raise
                # changed since our read, and the caller did not pin a version
                await self.store.delete(sid, now_ms=self.clock.wall_ms())
        except NotFound:
            if not request.allow_missing:
                raise
            return spb.DeleteScheduleResponse(deleted=False)
        if request.cancel_running:
            await self.ops.cancel_running(sid, "schedule deleted")
        return spb.DeleteScheduleResponse(deleted=True)

    @grpc_errors
    async def ListSchedules(self, request: spb.ListSchedulesRequest, context: Context) -> spb.ListSchedulesResponse:
        tenant = inputs.optional_name(request.tenant, "tenant")
        acc = self.authz.access()
        if tenant:
            acc.require_named(Role.READER, tenant)
        selector = parse_selector(request.label_selector)
        if request.state not in (pb.SCHEDULE_STATE_UNSPECIFIED, pb.SCHEDULE_STATE_ACTIVE, pb.SCHEDULE_STATE_PAUSED):
            raise InvalidArgument("state", f"unknown schedule state {request.state}")
        want = {pb.SCHEDULE_STATE_ACTIVE: ScheduleState.ACTIVE, pb.SCHEDULE_STATE_PAUSED: ScheduleState.PAUSED}.get(
            request.state)
        size = paging.page_size(request.page_size)
        filters = ["schedules", tenant, request.label_selector, int(request.state)]
        after = paging.decode_token(request.page_token, filters)
        if after is not None and not isinstance(after, str):
            raise InvalidArgument("page_token", "is not a token this server issued")
        matches: list[StoredSchedule] = []
        cursor = b""
        while True:
            chunk, cursor = await self.store.scan(after_key=cursor)
            matches += [st for st in chunk if (not tenant or st.schedule.tenant == tenant)
                        and acc.readable(st.schedule.tenant)
                        and (want is None or st.schedule.state is want) and selector.matches(st.schedule.labels)
                        and (after is None or st.schedule.id > after)]
            if not cursor:
                break
        got, more = page(matches, lambda st: st.schedule.id, None, size)
        out = [stored_to_pb(st) for st in got]
        if (n := paging.fitting(out)) < len(out):
            got, out, more = got[:n], out[:n], True
        token = paging.encode_token(filters, got[-1].schedule.id) if more else ""
        return spb.ListSchedulesResponse(schedules=out, next_page_token=token)

    @grpc_errors
    async def PauseSchedule(self, request: spb.PauseScheduleRequest, context: Context) -> spb.PauseScheduleResponse:
        sid = inputs.schedule_id(request.id)
        why = inputs.reason(request.reason)
        expected = request.expected_version if request.HasField("expected_version") else None

        def change(cur: StoredSchedule) -> Schedule | None:
            s = cur.schedule
            if s.state is ScheduleState.PAUSED and s.paused_reason == why:
                return None
            return replace(s, state=ScheduleState.PAUSED, paused_reason=why)

        st = await self._rmw(sid, expected, change)
        if request.cancel_running:
            await self.ops.cancel_running(sid, f"schedule paused: {why}" if why else "schedule paused")
        return spb.PauseScheduleResponse(schedule=stored_to_pb(st))

    @grpc_errors
    async def ResumeSchedule(self, request: spb.ResumeScheduleRequest, context: Context) -> spb.ResumeScheduleResponse:
        sid = inputs.schedule_id(request.id)
        expected = request.expected_version if request.HasField("expected_version") else None

        def change(cur: StoredSchedule) -> Schedule | None:
            if cur.schedule.state is ScheduleState.ACTIVE:
                return None
            return replace(cur.schedule, state=ScheduleState.ACTIVE, paused_reason="")

        st = await self._rmw(sid, expected, change)
        return spb.ResumeScheduleResponse(schedule=stored_to_pb(st))

    async def _deleted_tenant(self, partition: int, sid: str) -> str | None:
        """The tenant of a deleted schedule: from its tombstone while it lasts, else from one of its
        execution records (each carries the tenant); None when neither is left."""
        stone = await self.kv.get(self.ks.tombstone(partition, sid), timeout=self.timeout)
        if stone is not None:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                return str(json.loads(stone.value)["schedule"]["tenant"])
        r = await self.kv.range(self.ks.executions(partition, sid), prefix=True, limit=1, timeout=self.timeout)
        return decode_execution(r.kvs[0].value, r.kvs[0].mod_revision).tenant if r.kvs else None

    # ---- operations (thin adapters over the operations port) ----------------------------------------

    @grpc_errors
    async def TriggerSchedule(self, request: spb.TriggerScheduleRequest,
                              context: Context) -> spb.TriggerScheduleResponse:
        sid = inputs.schedule_id(request.id)
        at = inputs.timestamp_ms(request.trigger_time, "trigger_time") if request.HasField("trigger_time") else None
        overlap = overlap_from_pb("overlap_policy", request.overlap_policy)
        await self._check_schedule(self.authz.access(), sid, Role.OPERATOR)
        e = await self.ops.trigger(sid, at, overlap)
        return spb.TriggerScheduleResponse(execution=execution_to_pb(e))

    @grpc_errors
    async def RerunExecution(self, request: spb.RerunExecutionRequest, context: Context) -> spb.RerunExecutionResponse:
        sid = inputs.schedule_id(request.schedule_id, "schedule_id")
        if not request.HasField("planned_at"):
            raise InvalidArgument("planned_at", "is required")
        planned = inputs.timestamp_ms(request.planned_at, "planned_at")
        acc = self.authz.access()
        await self._check_schedule(acc, sid, Role.OPERATOR)
        # The record's own tenant too: a schedule id deleted and created again by another tenant has the old
        # one's execution ids, and a rerun took another tenant's record over, attempts and output included (an
        # outside audit). Another tenant's record answers as a missing one.
        eid = execution_id(sid, planned)
        await self._execution_for(acc, str(eid), Role.OPERATOR, f"execution {eid} not found")
        e = await self.ops.rerun(sid, planned)
        return spb.RerunExecutionResponse(execution=execution_to_pb(e))

    @grpc_stream_errors
    async def Backfill(self, request: spb.BackfillRequest, context: Context) -> AsyncIterator[spb.BackfillProgress]:
        sid = inputs.schedule_id(request.schedule_id, "schedule_id")
        for name in ("start_time", "end_time"):
            if not request.HasField(name):
                raise InvalidArgument(name, "is required")
        start = inputs.timestamp_ms(request.start_time, "start_time")
        end = inputs.timestamp_ms(request.end_time, "end_time")
        if end <= start:
            raise InvalidArgument("end_time", "must be after start_time")
        overlap = overlap_from_pb("overlap_policy", request.overlap_policy)
        await self._check_schedule(self.authz.access(), sid, Role.OPERATOR)
        with contextlib.suppress(NotFound):  # a missing schedule: the operation says so itself
            st = await self.store.get(sid)
            q = await self._quota(st.schedule.tenant)
            if q.backfill:
                check_backfill(q, st.schedule.tenant, st.schedule.plan(), start, end)
        async for c in self.ops.backfill(sid, start, end, overlap, request.dry_run):
            msg = spb.BackfillProgress(planned=c.planned, created=c.created, existing=c.existing, skipped=c.skipped,
                                       done=c.done)
            if c.processed_until_ms is not None:
                msg.processed_until.CopyFrom(ms_to_timestamp(c.processed_until_ms))
            yield msg

    @grpc_errors
    async def CancelExecution(self, request: spb.CancelExecutionRequest,
                              context: Context) -> spb.CancelExecutionResponse:
        why = inputs.reason(request.reason) or "cancelled by an operator"
        await self._execution_for(self.authz.access(), request.execution_id, Role.OPERATOR,
                                  f"execution {request.execution_id} not found")
        e = await self.ops.cancel_execution(request.execution_id, reason=why)
        return spb.CancelExecutionResponse(execution=execution_to_pb(e))

    @grpc_errors
    async def ReplayDeadLetter(self, request: spb.ReplayDeadLetterRequest,
                               context: Context) -> spb.ReplayDeadLetterResponse:
        await self._execution_for(self.authz.access(), request.execution_id, Role.OPERATOR,
                                  f"{request.execution_id} is not a dead letter")
        e = await self.ops.replay_dead_letter(request.execution_id, reason=inputs.reason(request.reason),
                                              use_current_schedule=request.use_current_schedule)
        return spb.ReplayDeadLetterResponse(execution=execution_to_pb(e))

    @grpc_errors
    async def DiscardDeadLetter(self, request: spb.DiscardDeadLetterRequest,
                                context: Context) -> spb.DiscardDeadLetterResponse:
        await self._execution_for(self.authz.access(), request.execution_id, Role.OPERATOR,
                                  f"{request.execution_id} is not a dead letter")
        e = await self.ops.discard_dead_letter(request.execution_id, reason=inputs.reason(request.reason))
        return spb.DiscardDeadLetterResponse(execution=execution_to_pb(e))

    # ---- preview ---------------------------------------------------------------------------------

    @grpc_errors
    async def PreviewSchedule(self, request: spb.PreviewScheduleRequest,
                              context: Context) -> spb.PreviewScheduleResponse:
        count = request.count or PREVIEW_DEFAULT
        if count > PREVIEW_MAX:
            raise InvalidArgument("count", f"{count} is above the limit of {PREVIEW_MAX}")
        # The planning window (1900..9990, docs/time.md), not the ledger's 1970..9999: a preview plans, it stores
        # nothing (an audit: after=1950 was refused naming 1970, while offline preview took it).
        after = check_in_window(timestamp_ms("after", request.after), "after") \
            if request.HasField("after") else self.clock.wall_ms()
        which = request.WhichOneof("source")
        if which == "schedule_id":
            sid = inputs.schedule_id(request.schedule_id, "schedule_id")
            plan = (await self._schedule_for(self.authz.access(), sid, Role.READER)).schedule.plan()
        elif which == "spec":
            ps = request.spec
            if ps.schedule_id:
                inputs.schedule_id(ps.schedule_id, "spec.schedule_id")
            elif uses_hash(ps.spec):  # `0,H` too, which a test of whole fields missed (an audit)
                raise InvalidArgument("spec.schedule_id", "is required when the spec uses H (it is hashed from the id)")
            if len(ps.spec) > 1024:
                raise InvalidArgument("spec.spec", f"is {len(ps.spec)} characters; the limit is 1024")
            gap = _enum("spec.dst_gap", ps.dst_gap, {1: DstGap.SHIFT, 2: DstGap.SKIP})
            fold = _enum("spec.dst_overlap", ps.dst_overlap,
                         {1: DstOverlap.FIRST, 2: DstOverlap.LAST, 3: DstOverlap.BOTH})
            check_zone_name(ps.time_zone or "UTC", "spec.time_zone")
            try:
                plan = parse_spec(ps.spec, schedule_id=ps.schedule_id, tz=ps.time_zone or "UTC", dst_gap=gap,
                                  dst_overlap=fold,
                                  start_ms=timestamp_ms("spec.start_at", ps.start_at, ceil=True)
                                  if ps.HasField("start_at") else None,
                                  end_ms=timestamp_ms("spec.end_at", ps.end_at) if ps.HasField("end_at") else None)
            except InvalidArgument as e:
                raise e if e.field.startswith("spec.") else e.nested("spec") from None
        else:
            raise InvalidArgument("source", "set schedule_id or spec")
        times: list[int] = []
        t = after
        while len(times) < count:
            nxt = plan.next_after_ms(t)
            if nxt is None:
                break
            times.append(nxt)
            t = nxt
        return spb.PreviewScheduleResponse(planned_times=[ms_to_timestamp(x) for x in times])

    # ---- executions --------------------------------------------------------------------------------

    @grpc_errors
    async def GetExecution(self, request: spb.GetExecutionRequest, context: Context) -> spb.GetExecutionResponse:
        eid = ExecutionId.parse(request.execution_id)
        e = await self.ledger.get(self.kv, eid.schedule_id, eid.planned_ms, timeout=self.timeout)
        if e is None or not self.authz.access().readable(e.tenant):
            raise NotFound(f"execution {request.execution_id!r} not found")
        return spb.GetExecutionResponse(execution=execution_to_pb(e))

    @grpc_errors
    async def ListExecutions(self, request: spb.ListExecutionsRequest,
                             context: Context) -> spb.ListExecutionsResponse:
        sid = inputs.optional_name(request.schedule_id, "schedule_id")
        tenant = inputs.optional_name(request.tenant, "tenant")
        acc = self.authz.access()
        if tenant:
            acc.require_named(Role.READER, tenant)
        states = {execution_state_from_pb(f"states[{i}]", s) for i, s in enumerate(request.states)}
        lo, hi = _time_range(request.planned, "planned")
        size = paging.page_size(request.page_size)
        filters = ["executions", sid, tenant, sorted(states), lo, hi, request.newest_first]
        after = paging.decode_token(request.page_token, filters)
        if after is not None and not (isinstance(after, list) and len(after) == 2):
            raise InvalidArgument("page_token", "is not a token this server issued")
        if not sid:
            if request.newest_first:
                raise InvalidArgument("newest_first", "needs schedule_id: a listing of every schedule's executions is "
                                      "in storage order (partition, schedule id, planned time)")
            return await self._list_all_executions(acc, tenant, states, lo, hi, size, filters, after)
        sign = -1 if request.newest_first else 1

        def order(e: Execution) -> tuple[str, int]:
            return (e.schedule_id, sign * e.planned_ms)

        p = partition_for(sid, self.store.partitions)
        start = self.ks.execution(p, sid, lo) if lo is not None else self.ks.executions(p, sid)
        end = self.ks.execution(p, sid, hi) if hi is not None else prefix_range(self.ks.executions(p, sid))[1]
        matches: list[Execution] = []
        pos = None if after is None else (str(after[0]), int(after[1]))
        async for x in scan(self.kv, start, end, timeout=self.timeout):
            if states and peek_state(x.value) not in states:
                continue
            e = decode_execution(x.value, x.mod_revision)
            if (tenant and e.tenant != tenant) or not acc.readable(e.tenant) or (pos is not None and order(e) <= pos):
                continue
            matches.append(e)
        got, more = page(matches, order, None, size)
        out = [execution_to_pb(e) for e in got]
        if (n := paging.fitting(out)) < len(out):
            got, out, more = got[:n], out[:n], True
        token = paging.encode_token(filters, list(order(got[-1]))) if more else ""
        return spb.ListExecutionsResponse(executions=out, next_page_token=token)

    async def _list_all_executions(self, acc: Access, tenant: str, states: set[ExecState], lo: int | None,
                                   hi: int | None, size: int, filters: Sequence[object],
                                   after: object) -> spb.ListExecutionsResponse:
        """Every schedule's executions in key order, resuming after the token's key and reading at most
        CROSS_SCHEDULE_SCAN records per page: a page costs what it returns plus a bounded scan, never a
        scan of the whole ledger (issue 9). A page cut short by the budget may hold fewer than `size`
        (even none) and still carry a token.

        A caller limited to some tenants must not find another tenant's key in its token, so its page
        never stops on one: a cut that falls among other tenants' records scans on (past the budget, at
        most to the end of that partition) to the caller's next record (the token resumes *at* it, `a`)
        or to the next partition (`p`: partitions are shared by every tenant, their numbers say nothing).
        """
        base_start, end = prefix_range(self.ks.all_executions)
        start = base_start
        if after is not None:
            if not (isinstance(after, list) and len(after) == 2 and after[0] in ("k", "a", "p")):
                raise InvalidArgument("page_token", "is not a token this server issued")
            if after[0] == "p":
                if not (isinstance(after[1], int) and 0 <= after[1] < self.store.partitions):
                    raise InvalidArgument("page_token", "is not a token this server issued")
                start = self.ks.executions(after[1])
            else:
                if not isinstance(after[1], str):
                    raise InvalidArgument("page_token", "is not a token this server issued")
                resume = after[1].encode()
                if not base_start <= resume < end:
                    raise InvalidArgument("page_token", "is not a token this server issued")
                start = resume + b"\x00" if after[0] == "k" else resume
        restricted = not acc.all_tenants
        got: list[Execution] = []
        last: bytes | None = None
        last_ok = True  # the last scanned record is the caller's to see (always, unless restricted)
        scanned = 0
        position: list[object] | None = None
        skipping_in: int | None = None  # restricted, past the budget: the partition being skipped through
        async for x in scan(self.kv, start, end, timeout=self.timeout):
            if skipping_in is None and (scanned >= CROSS_SCHEDULE_SCAN or len(got) >= size):
                if last is not None and last_ok:
                    position = ["k", last.decode()]
                    break
                skipping_in = self._execution_partition(last or x.key)
            if skipping_in is not None:
                part = self._execution_partition(x.key)
                if part != skipping_in:
                    position = ["p", part]
                    break
                if acc.readable(_record_tenant(x.value)):
                    position = ["a", x.key.decode()]
                    break
                continue
            scanned += 1
            last = x.key
            if restricted:
                # The tenant needs the record parsed: decoded once here, not once for it and once after.
                d = _decoded(x.value, x.mod_revision)
                last_ok = d is not None and acc.readable(d.tenant)
                if d is None or not last_ok or (states and d.state not in states):
                    continue
                e = d
            else:
                if states and peek_state(x.value) not in states:
                    continue
                e = decode_execution(x.value, x.mod_revision)
            if (tenant and e.tenant != tenant) or (lo is not None and e.planned_ms < lo) \
                    or (hi is not None and e.planned_ms >= hi):
                continue
            got.append(e)
        out = [execution_to_pb(e) for e in got]
        if (n := paging.fitting(out)) < len(out):
            # Resume after the last record shown (the caller's own: a restricted caller's token names no other).
            e, out = got[n - 1], out[:n]
            position = ["k", self.ks.execution(partition_for(e.schedule_id, self.store.partitions), e.schedule_id,
                                               e.planned_ms).decode()]
        token = paging.encode_token(filters, position) if position is not None else ""
        return spb.ListExecutionsResponse(executions=out, next_page_token=token)

    def _execution_partition(self, key: bytes) -> int:
        return int(key[len(self.ks.all_executions):].split(b"/", 1)[0])

    @grpc_errors
    async def ListSkips(self, request: spb.ListSkipsRequest, context: Context) -> spb.ListSkipsResponse:
        """Planned times of one schedule that were not run: executions in state SKIPPED and skip records
        (ranges (after, through], expanded with the plan recorded with them, else the schedule's current
        one), merged by planned time."""
        sid = inputs.schedule_id(request.schedule_id, "schedule_id")
        lo, hi = _time_range(request.planned, "planned")
        size = paging.page_size(request.page_size)
        filters = ["skips", sid, lo, hi]
        after = paging.decode_token(request.page_token, filters)
        if after is not None and not isinstance(after, int):
            raise InvalidArgument("page_token", "is not a token this server issued")
        floor = max(x for x in (after, None if lo is None else lo - 1, -1) if x is not None)  # exclusive
        ceil = inputs.MAX_MS if hi is None else hi - 1  # inclusive
        acc = self.authz.access()
        p = partition_for(sid, self.store.partitions)
        try:
            stored = await self.store.get(sid)
            plan: Plan | None = stored.schedule.plan()
            tenant: str | None = stored.schedule.tenant
        except NotFound:
            plan = None  # deleted: its records stay, its ranges are listed unexpanded
            tenant = None if acc.all_tenants else await self._deleted_tenant(p, sid)
        if (tenant is None and not acc.all_tenants) or (tenant is not None and not acc.readable(tenant)):
            # Another tenant's schedule, or one whose tenant is unknown: as a schedule nobody ever had.
            return spb.ListSkipsResponse()
        sources: list[Iterator[tuple[int, int, spb.SkippedTime]]] = []
        recorded: list[tuple[int, int, spb.SkippedTime]] = []
        ran: set[int] = set()  # planned times with a record that is not a skip: not listed from a range either
        async for x in scan(self.kv, self.ks.execution(p, sid, floor + 1),
                            self.ks.execution(p, sid, ceil + 1), timeout=self.timeout):
            e: Execution | None = None
            if not acc.all_tenants:
                e = _decoded(x.value, x.mod_revision)  # its tenant is needed anyway: one parse, not two
                if e is None or not acc.readable(e.tenant):
                    continue  # an earlier schedule of this id, another tenant's (deleted, the id used again)
            if (peek_state(x.value) if e is None else e.state) is not ExecState.SKIPPED:
                # A range covers it, yet it has a run: an operator's backfill (or trigger at that instant) of a
                # time the policy had skipped. It did run: listing it as skipped told an audit it had not.
                with contextlib.suppress(ValueError):
                    ran.add(int(Keyspace.last_segment(x.key)))
                continue
            e = e or decode_execution(x.value, x.mod_revision)
            recorded.append((e.planned_ms, 0, spb.SkippedTime(
                schedule_id=sid, planned_at=ms_to_timestamp(e.planned_ms), reason=skip_reason_pb(e.skip_reason),
                execution_id=e.id, message=e.skip_reason)))
        sources.append(iter(recorded))
        async for x in scan(self.kv, *prefix_range(self.ks.skips(p, sid)), timeout=self.timeout):
            r = _skip_record(x.key, x.value)
            if r is None or r[1] <= floor or r[0] >= ceil:
                continue
            # Expanded with the plan that made it when it says (a spec changed since: the current spec listed
            # instants never planned and left out real ones), else with the current one.
            sources.append(_expand(sid, _recorded_plan(sid, r[3]) or plan, *r[:3], floor, ceil))
        out: list[spb.SkippedTime] = []
        seen = floor
        more = False
        for ms, _, item in heapq.merge(*sources, key=lambda t: (t[0], t[1])):
            if ms <= seen or (ms in ran and item.HasField("planned_at")):  # (a deleted one's range: unexpanded)
                continue  # one entry per planned time: the execution record's, when there is one
            if len(out) >= size:
                more = True
                break
            out.append(item)
            seen = ms
        token = paging.encode_token(filters, seen) if more else ""
        return spb.ListSkipsResponse(skips=out, next_page_token=token)

    @grpc_errors
    async def ListDeadLetters(self, request: spb.ListDeadLettersRequest,
                              context: Context) -> spb.ListDeadLettersResponse:
        sid = inputs.optional_name(request.schedule_id, "schedule_id")
        tenant = inputs.optional_name(request.tenant, "tenant")
        acc = self.authz.access()
        if tenant:
            acc.require_named(Role.READER, tenant)
        task = inputs.optional_name(request.task_type, "task_type")
        lo, hi = _time_range(request.dead_lettered, "dead_lettered", exact=False)
        size = paging.page_size(request.page_size)
        filters = ["dead", sid, tenant, task, lo, hi]
        after = paging.decode_token(request.page_token, filters)
        if after is not None and not (isinstance(after, list) and len(after) == 2):
            raise InvalidArgument("page_token", "is not a token this server issued")
        prefix = self.ks.dead_letters(partition_for(sid, self.store.partitions), sid) if sid else self.ks.dead_letters()
        pos = None if after is None else (int(after[0]), str(after[1]))
        matches: list[DeadLetterEntry] = []
        async for x in scan(self.kv, *prefix_range(prefix), timeout=self.timeout):
            d = DeadLetterEntry.decode(self.ks, x.key, x.value)
            if (tenant and d.tenant != tenant) or not acc.readable(d.tenant) or (task and d.task_type != task) \
                    or (lo is not None and d.dead_ms < lo) or (hi is not None and d.dead_ms >= hi) \
                    or (pos is not None and (d.dead_ms, d.execution_id) <= pos):
                continue
            matches.append(d)
        got, more = page(matches, lambda d: (d.dead_ms, d.execution_id), None, size)
        out = []
        shown = []  # got's entries with their record, in order
        for d in got:
            e = await self.ledger.get(self.kv, d.id.schedule_id, d.id.planned_ms, timeout=self.timeout)
            if e is not None:
                out.append(dead_letter_to_pb(e, d.payload, d.dead_ms, dead_reason(e)))
                shown.append(d)
        if (n := paging.fitting(out)) < len(out):
            got, out, more = shown[:n], out[:n], True  # resumes after the last one shown
        token = paging.encode_token(filters, [got[-1].dead_ms, got[-1].execution_id]) if more else ""
        return spb.ListDeadLettersResponse(dead_letters=out, next_page_token=token)


def _record_tenant(value: bytes) -> str:
    """The tenant of a stored execution record without building the rest (store/codec.py's `ten`)."""
    try:
        return str(json.loads(value).get("ten", ""))
    except (ValueError, AttributeError):
        return ""


def _decoded(value: bytes, mod_revision: int) -> Execution | None:
    """A stored execution record; None for one this build cannot read (listed to nobody restricted to tenants)."""
    try:
        return decode_execution(value, mod_revision)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _domain(m: pb.Schedule) -> Schedule:
    try:
        return schedule_from_pb(m)
    except InvalidArgument as e:
        raise e.nested("schedule") from None


def _item_error(e: InvalidArgument, i: int) -> InvalidArgument:
    """`schedule.spec.minute` of item i -> `schedules[i].spec.minute`."""
    rest = e.field.removeprefix("schedule").lstrip(".")
    return InvalidArgument(f"schedules[{i}].{rest}" if rest else f"schedules[{i}]", e.reason)


def _validate(s: Schedule) -> None:
    for name, ms in (("start_at", s.start_ms), ("end_at", s.end_ms)):
        if ms is not None and not 0 <= ms <= inputs.MAX_MS:
            raise InvalidArgument(f"schedule.{name}", "is outside 1970-01-01 .. 9999-12-31")
    try:
        validate_schedule(s)
    except InvalidArgument as e:
        raise e.nested("schedule") from None


def _enum(field: str, value: int, table: dict[int, _E]) -> _E | None:
    if value == 0:
        return None
    if value not in table:
        raise InvalidArgument(field, f"unknown enum value {value}")
    return table[value]


def _time_range(r: spb.TimeRange, field: str, *, exact: bool = False) -> tuple[int | None, int | None]:
    lo = inputs.timestamp_ms(r.start, f"{field}.start", exact=exact) if r.HasField("start") else None
    hi = inputs.timestamp_ms(r.end, f"{field}.end", exact=exact) if r.HasField("end") else None
    if lo is not None and hi is not None and hi < lo:
        raise InvalidArgument(f"{field}.end", "is before start")
    return lo, hi



def _skip_record(key: bytes, value: bytes) -> tuple[int, int, str, dict[str, Any]] | None:
    """(after, through, reason, the whole value) of a skip record (Ledger.skip_op); None for one this build
    cannot read."""
    try:
        after, _, through = Keyspace.last_segment(key).partition("-")
        d = json.loads(value)
        return int(after), int(through), str(d.get("reason", "")), d
    except (ValueError, AttributeError):
        return None


def _recorded_plan(sid: str, d: dict[str, Any]) -> Plan | None:
    """The plan a skip record says planned its instants (Ledger.skip_op); None: it does not say, or it
    cannot be compiled here."""
    spec = d.get("spec")
    if not isinstance(spec, str) or not spec:
        return None
    try:
        gap, fold = d.get("gap"), d.get("fold")
        return plan_for(spec, sid, str(d.get("tz", "UTC")), DstGap(gap) if gap else None,
                        DstOverlap(fold) if fold else None)
    except (SchedError, ValueError):
        return None


def _expand(sid: str, plan: Plan | None, after: int, through: int, reason: str, floor: int,
            ceil: int) -> Iterator[tuple[int, int, spb.SkippedTime]]:
    """The planned times of one skip record in (floor, ceil], lazily (a week of per-second misses is
    one record, and a page takes only what it shows). Without a plan (the schedule was deleted): the
    record itself, once, at its `through`."""
    def entry(ms: int | None) -> spb.SkippedTime:
        out = spb.SkippedTime(schedule_id=sid, reason=skip_reason_pb(reason), range_after=ms_to_timestamp(after),
                              range_through=ms_to_timestamp(through))
        if ms is not None:
            out.planned_at.CopyFrom(ms_to_timestamp(ms))
        return out

    if plan is None:
        if floor < through <= ceil:
            yield through, 1, entry(None)
        return
    for ms in plan.between_ms(max(after, floor), min(through, ceil)):
        yield ms, 1, entry(ms)
