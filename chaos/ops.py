"""The plan's API operations made through the product's gRPC API, each recorded in ops.jsonl.

Operations are part of the load: they happen at their offsets whatever the faults are doing, and go
to any running planner (any answers for any schedule); a call refused as UNAVAILABLE by one (it is
frozen or cut off) is tried on another until the op's deadline. Every call is recorded with when it
was invoked and when it returned, and whether it was acknowledged: the checker holds the cluster to
every acknowledged change (`[lost-op]`), and to nothing about a failed one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Sequence
from typing import Any, Protocol

import grpc

from chaos.load import schedule_of
from chaos.plan import PlannedOp, PlannedSchedule
from chaos.record import OpRecord, RunWriter
from chaos.scenario import CANCEL_REASON
from scheduler._gen.scheduler.v1 import execution_pb2 as epb
from scheduler._gen.scheduler.v1 import schedule_pb2 as spb
from scheduler.api.convert import schedule_to_pb
from scheduler.client import SchedulerClient
from scheduler.client.errors import ClientError
from scheduler.clock import SYSTEM_CLOCK
from scheduler.timeplan import Overlap

__all__ = ["ApiTarget", "OpRunner"]


class ApiTarget(Protocol):
    """Where operations go: a running planner's API address (any answers for any schedule), and the URL the
    drill's schedules report their effects to. chaos/live.py's LiveCluster, or an observed cluster."""

    sink_url: str

    def api_address(self, rng: random.Random | None = None) -> str: ...

OP_DEADLINE_S = 10.0
_RETRY_ON = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
_OVERLAP_PB = {o: getattr(spb, f"OVERLAP_POLICY_{o.name}") for o in Overlap}
_FINISHED = (epb.EXECUTION_STATE_SUCCEEDED, epb.EXECUTION_STATE_FAILED)
_OUT = (epb.EXECUTION_STATE_DISPATCHED, epb.EXECUTION_STATE_RUNNING)


def _landed_at(schedule: Any) -> dict[str, Any]:
    """The acknowledged schedule's version, its etcd mod revision: the checker finds the change in etcd's history
    by it (`[lost-op]`), not by when the harness's watch happened to deliver it."""
    return {"version": int(schedule.version)}


def _applied_by_an_earlier_try(state: dict[str, Any], e: ClientError) -> bool:
    """A rerun or replay refused as no longer applicable after a try whose answer never came: that try applied
    it (nothing else reruns or replays in a drill)."""
    return bool(state.get("unanswered")) and e.code is grpc.StatusCode.FAILED_PRECONDITION


class OpRunner:
    def __init__(self, live: ApiTarget, rec: RunWriter, schedules: Sequence[PlannedSchedule], seed: int) -> None:
        self.live, self.rec = live, rec
        self.schedules = {p.id: p for p in schedules}
        self.rng = random.Random(f"ops-routing\x00{seed}")  # which planner answers: not part of the plan
        self.start_ms = 0

    async def create_all(self, schedules: Sequence[PlannedSchedule]) -> None:
        """The load's schedules, created before the window opens (recorded like any create)."""
        sem = asyncio.Semaphore(8)

        async def one(p: PlannedSchedule) -> None:
            async with sem:
                await self._do(PlannedOp(0.0, "create", p.id, {}, "load"), p)

        await asyncio.gather(*(one(p) for p in schedules))

    async def run(self, ops: Sequence[PlannedOp], start_ms: int) -> None:
        self.start_ms = start_ms
        for op in ops:
            delay = (start_ms + op.at_s * 1000 - SYSTEM_CLOCK.wall_ms()) / 1000
            if delay > 0:
                await asyncio.sleep(delay)
            like = None
            if op.op == "create" and "like" not in op.params:
                like = self.schedules[op.schedule_id]  # created again as planned (after a delete of it)
            elif op.op == "create":
                base = self._group(str(op.params.get("like", "")))
                like = dataclasses.replace(base, id=op.schedule_id)
                self.schedules[op.schedule_id] = like
            await self._do(op, like)

    def _group(self, group: str) -> PlannedSchedule:
        for p in self.schedules.values():
            if p.group == group:
                return p
        raise ValueError(f"create: no load group {group!r} to copy")

    async def _do(self, op: PlannedOp, planned: PlannedSchedule | None = None) -> None:
        t0 = SYSTEM_CLOCK.wall_ms()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + OP_DEADLINE_S
        error = ""
        # What the operation chose on its first try (a rerun's target), kept across retries: after an answer
        # that never came (UNAVAILABLE, DEADLINE_EXCEEDED) the request may have been applied, and choosing
        # again ("the latest finished execution") would act on another one. A game day saw one rerun request
        # rerun two executions that way, and the checker count the second effect of the first as a duplicate.
        state: dict[str, Any] = {}
        while True:
            try:
                address = self.live.api_address(self.rng)
                async with SchedulerClient(address, timeout=max(0.5, deadline - loop.time())) as c:
                    result = await self._call(c, op, planned, state)
                self.rec.op(OpRecord(t0, op.op, op.schedule_id, True, SYSTEM_CLOCK.wall_ms(), dict(op.params), result))
                return
            except ClientError as e:
                error = f"{e.code.name}: {e}"
                if e.code in _RETRY_ON:
                    state["unanswered"] = True
                if e.code not in _RETRY_ON or loop.time() + 0.3 >= deadline:
                    break
            except RuntimeError as e:  # no planner running right now (a region loss)
                error = str(e)
                if loop.time() + 0.3 >= deadline:
                    break
            await asyncio.sleep(0.3)
        # Failed, but an unanswered try may have been applied: the checker allows its effect (chaos/context.py).
        maybe = {"execution_id": state["target"], "maybe_applied": True} if state.get("unanswered") and \
            "target" in state else {}
        self.rec.op(OpRecord(t0, op.op, op.schedule_id, False, SYSTEM_CLOCK.wall_ms(), dict(op.params), maybe, error))

    async def _call(self, c: SchedulerClient, op: PlannedOp, planned: PlannedSchedule | None,
                    state: dict[str, Any]) -> dict[str, Any]:
        sid = op.schedule_id
        if op.op == "create":
            assert planned is not None and self.live.sink_url
            s = schedule_to_pb(schedule_of(planned, self.live.sink_url))
            # One request id per create op (its retries reuse it): a create of the same id again after a delete
            # is a new request, not a retry of the first (which the store would answer with that one's result).
            created = await c.create_schedule(s, request_id=f"drill-create-{sid}-{int(op.at_s * 1000)}")
            return _landed_at(created)
        if op.op == "pause":
            return _landed_at(await c.pause_schedule(sid, reason="drill"))
        if op.op == "resume":
            return _landed_at(await c.resume_schedule(sid))
        if op.op == "delete":
            await c.delete_schedule(sid, allow_missing=True)
            return {}
        if op.op == "update":
            cur = await c.get_schedule(sid)
            mask = []
            if "overlap" in op.params:
                cur.policies.overlap = _OVERLAP_PB[Overlap(str(op.params["overlap"]))]
                mask.append("policies")
            if "spec" in op.params:  # a new activation: the old spec's runs written ahead are withdrawn
                cur.spec = str(op.params["spec"])
                mask.append("spec")
            if "fail" in op.params:  # the operator's fix (or a new breakage) of what the runs do
                p = dataclasses.replace(self.schedules[sid], fail=bool(op.params["fail"]))
                self.schedules[sid] = p
                cur.payload = schedule_of(p, self.live.sink_url).payload
                mask.append("payload")
            updated = await c.update_schedule(cur, update_mask=mask)
            return {**_landed_at(updated), **({"spec": cur.spec} if "spec" in op.params else {})}
        if op.op == "trigger":
            e = await c.trigger_schedule(sid)
            return {"execution_id": e.execution_id}
        if op.op == "backfill":
            lo = self.start_ms + int(float(op.params.get("from_s", 0)) * 1000)
            hi = self.start_ms + int(float(op.params.get("until_s", 0)) * 1000)
            hi = min(hi, SYSTEM_CLOCK.wall_ms() - 1000)
            if hi <= lo:
                return {"skipped": "range not yet in the past"}
            last = None
            async for progress in c.backfill(sid, lo, hi, timeout=OP_DEADLINE_S):
                last = progress
            return {} if last is None else {"created": last.created, "existing": last.existing, "planned": last.planned}
        if op.op == "rerun":
            if "target" not in state:
                page = await c.list_executions(schedule_id=sid, states=list(_FINISHED), newest_first=True,
                                               page_size=1)
                if not page.executions:
                    return {"skipped": "nothing finished yet"}
                state["target"], state["planned_ms"] = page.executions[0].execution_id, \
                    page.executions[0].planned_at.ToMilliseconds()
            try:
                again = await c.rerun_execution(sid, state["planned_ms"])
            except ClientError as e:
                if not _applied_by_an_earlier_try(state, e):
                    raise
                # Not finished any more: the unanswered try reran it (nothing else reruns in a drill).
                return {"execution_id": state["target"], "applied_by": "an unanswered earlier try"}
            return {"execution_id": again.execution_id}
        if op.op == "cancel":
            return await self._cancel(c, sid, state)
        if op.op == "replay":
            return await self._replay(c, sid, state, bool(op.params.get("with_current_schedule", False)))
        if op.op == "switchover":  # `schedule_id` holds the region (chaos/scenario.py CLUSTER_OPS)
            policy = await c.switchover(sid, reason="drill")
            return {"primary": policy.primary_region, "version": int(policy.version)}
        raise ValueError(f"unknown operation {op.op!r}")

    @staticmethod
    async def _cancel(c: SchedulerClient, sid: str, state: dict[str, Any]) -> dict[str, Any]:
        """Cancel the schedule's newest run out with a worker (what an operator stops by hand)."""
        if "target" not in state:
            page = await c.list_executions(schedule_id=sid, states=list(_OUT), newest_first=True, page_size=1)
            if not page.executions:
                return {"skipped": "nothing in flight"}
            state["target"] = page.executions[0].execution_id
        try:
            await c.cancel_execution(state["target"], reason=CANCEL_REASON)
        except ClientError as e:
            if e.code is not grpc.StatusCode.FAILED_PRECONDITION:
                raise
            # Ended meanwhile (its result landed first), or cancelled by an unanswered earlier try.
            return {"execution_id": state["target"], "not_cancelled": e.message}
        return {"execution_id": state["target"]}

    @staticmethod
    async def _replay(c: SchedulerClient, sid: str, state: dict[str, Any], current: bool) -> dict[str, Any]:
        """Replay the schedule's newest dead letter: as it died, or with the schedule's current payload
        (`with_current_schedule`: after an update that fixed it)."""
        if "target" not in state:
            page = await c.list_dead_letters(schedule_id=sid, page_size=100)
            if not page.dead_letters:
                return {"skipped": "no dead letter"}
            newest = max(page.dead_letters, key=lambda d: d.dead_lettered_at.ToMilliseconds())
            state["target"] = newest.execution.execution_id
        try:
            again = await c.replay_dead_letter(state["target"], reason="drill replay", use_current_schedule=current)
        except ClientError as e:
            if not _applied_by_an_earlier_try(state, e):
                raise
            return {"execution_id": state["target"], "applied_by": "an unanswered earlier try"}
        return {"execution_id": again.execution_id}
