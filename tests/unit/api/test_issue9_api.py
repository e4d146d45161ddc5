"""Issue 9, what operators need to see, against the in-memory etcd twin with the real operations:
skips listable, dead-letter reasons as recorded, a bounded cross-schedule ListExecutions, replay with
the current schedule, the backfill's own overlap default, drain that refuses to stop everything, undrain."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, cast

import grpc
import pytest

from scheduler._gen.scheduler.v1 import admin_service_pb2 as apb
from scheduler._gen.scheduler.v1 import cluster_pb2 as cpb
from scheduler._gen.scheduler.v1 import execution_pb2 as epb
from scheduler._gen.scheduler.v1 import schedule_pb2 as pb
from scheduler._gen.scheduler.v1 import schedule_service_pb2 as spb
from scheduler.api import schedule_service as service_module
from scheduler.api.admin_service import AdminService, LocalView
from scheduler.api.errors import Context
from scheduler.api.operations import Operations
from scheduler.api.schedule_service import ScheduleService
from scheduler.clock import FakeClock
from scheduler.execution import ErrorClass, ExecState, Execution, Trigger, dispatch, result
from scheduler.ids import FencingToken, execution_id
from scheduler.model import RetryPolicy
from scheduler.planner.ownership import MemberInfo, Ownership
from scheduler.status import NodeStatus
from scheduler.store.keyspace import Keyspace, partition_for
from scheduler.store.ledger import Ledger
from scheduler.store.memory import MemoryKV
from scheduler.store.schedules import ScheduleStore
from scheduler.timeplan import Overlap, SkipReason
from scheduler.timeplan.missed import PlannedBy, SkipRange

NOW = 1_795_946_400_000  # a whole minute
P = 4


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, details)
        self.code, self.details = code, details


class Ctx:
    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        raise Aborted(code, details)

    def invocation_metadata(self) -> tuple[()]:
        return ()


CTX = cast(Context, Ctx())


class Env:
    def __init__(self) -> None:
        self.kv, self.ks, self.clock = MemoryKV(), Keyspace("/t"), FakeClock(NOW)
        self.store, self.ledger = ScheduleStore(self.kv, self.ks, P), Ledger(self.ks, P)
        self.ops = Operations(self.kv, self.ks, P, self.store, self.ledger, self.clock, rpc_timeout=1.0)
        self.svc = ScheduleService(kv=self.kv, ks=self.ks, store=self.store, ledger=self.ledger, clock=self.clock,
                                   ops=self.ops, rpc_timeout=1.0)

    async def create(self, sid: str, spec: str = "*/10 * * * * *", **kw: Any) -> None:
        s = pb.Schedule(id=sid, tenant=kw.pop("tenant", "t"), spec=spec, worker_pool="p", task_type="x", **kw)
        await self.svc.CreateSchedule(spb.CreateScheduleRequest(schedule=s), CTX)

    async def put_exec(self, e: Execution) -> None:
        await self.kv.txn([], [self.ledger.create_op(e)])


def _exec(sid: str, ms: int, state: ExecState = ExecState.SCHEDULED, why: str = "", tenant: str = "t") -> Execution:
    return Execution(execution_id(sid, ms), sid, tenant, "p", "x", ms, ms, Trigger.SCHEDULED, RetryPolicy(), 60_000,
                     state=state, skip_reason=why)


@pytest.fixture
async def env() -> Any:
    e = Env()
    yield e
    await e.kv.close()


def _ms(t: Any) -> int:
    return int(t.ToMilliseconds())


async def _all_skips(env: Env, sid: str, size: int, **kw: Any) -> list[spb.SkippedTime]:
    out: list[spb.SkippedTime] = []
    token = ""
    while True:
        r = await env.svc.ListSkips(spb.ListSkipsRequest(schedule_id=sid, page_size=size, page_token=token, **kw),
                                    CTX)
        assert len(r.skips) <= size
        out += r.skips
        token = r.next_page_token
        if not token:
            return out


# ---- skips ----------------------------------------------------------------------------------------


async def test_skips_list_expands_skip_records_and_merges_skipped_executions(env: Env) -> None:
    await env.create("s")
    p = partition_for("s", P)
    # Missed 00:00:10 .. 00:00:50 (five planned times), two ranges with their reasons.
    await env.kv.txn([], [env.ledger.skip_op(p, "s", SkipRange(SkipReason.OUTSIDE_CATCHUP_WINDOW, NOW, NOW + 30_000)),
                          env.ledger.skip_op(p, "s", SkipRange(SkipReason.OVER_CAP, NOW + 30_000, NOW + 50_000))])
    # An execution withdrawn by a pause, and one that ran (not a skip).
    await env.put_exec(_exec("s", NOW + 60_000, ExecState.SKIPPED, "paused"))
    await env.put_exec(_exec("s", NOW + 70_000, ExecState.SUCCEEDED))
    # A planned time both in a range and recorded as an execution is listed once, as the execution.
    await env.put_exec(_exec("s", NOW + 20_000, ExecState.SKIPPED, "overlap_skip"))
    got = await _all_skips(env, "s", 2)
    assert [(_ms(x.planned_at) - NOW, x.reason) for x in got] == [
        (10_000, epb.SKIP_REASON_OUTSIDE_CATCHUP_WINDOW), (20_000, epb.SKIP_REASON_OVERLAP_SKIP),
        (30_000, epb.SKIP_REASON_OUTSIDE_CATCHUP_WINDOW), (40_000, epb.SKIP_REASON_OVER_CAP),
        (50_000, epb.SKIP_REASON_OVER_CAP), (60_000, epb.SKIP_REASON_PAUSED)]
    assert got[1].execution_id == execution_id("s", NOW + 20_000) and not got[0].execution_id
    assert (_ms(got[0].range_after), _ms(got[0].range_through)) == (NOW, NOW + 30_000)
    # A time filter, half-open like every other.
    r = await env.svc.ListSkips(spb.ListSkipsRequest(schedule_id="s", planned=spb.TimeRange(
        start=_ts(NOW + 30_000), end=_ts(NOW + 60_000))), CTX)
    assert [_ms(x.planned_at) - NOW for x in r.skips] == [30_000, 40_000, 50_000]


async def test_a_skipped_time_that_was_backfilled_since_is_not_listed_as_skipped(env: Env) -> None:
    """An audit: after a backfill of times a catch-up had skipped, `schedctl skips` still listed them, while
    `exec list` showed each as run: an auditor saw a planned time both run and skipped."""
    await env.create("s")
    p = partition_for("s", P)
    await env.kv.txn([], [env.ledger.skip_op(p, "s", SkipRange(SkipReason.POLICY_SKIP, NOW, NOW + 50_000))])
    await env.put_exec(replace(_exec("s", NOW + 20_000, ExecState.SUCCEEDED), trigger=Trigger.BACKFILL))
    await env.put_exec(replace(_exec("s", NOW + 40_000, ExecState.FAILED), trigger=Trigger.BACKFILL))
    got = await _all_skips(env, "s", 2)
    assert [_ms(x.planned_at) - NOW for x in got] == [10_000, 30_000, 50_000]


async def test_skip_ranges_are_expanded_with_the_spec_that_planned_them(env: Env) -> None:
    """An audit: after a spec change `schedctl skips` expanded every range with the new spec, listing instants
    never planned and leaving out the real ones. A range now carries its plan; an old one (none) is expanded
    with the current spec, as before."""
    await env.create("s", "*/2 * * * * *")
    p = partition_for("s", P)
    by = PlannedBy("*/3 * * * * *")
    await env.kv.txn([], [env.ledger.skip_op(p, "s", SkipRange(SkipReason.PAUSED, NOW, NOW + 12_000, by)),
                          env.ledger.skip_op(p, "s", SkipRange(SkipReason.POLICY_SKIP, NOW + 20_000, NOW + 24_000))])
    got = await _all_skips(env, "s", 3)
    assert [(_ms(x.planned_at) - NOW, x.reason) for x in got] == [
        (3_000, epb.SKIP_REASON_PAUSED), (6_000, epb.SKIP_REASON_PAUSED), (9_000, epb.SKIP_REASON_PAUSED),
        (12_000, epb.SKIP_REASON_PAUSED), (22_000, epb.SKIP_REASON_POLICY_SKIP), (24_000, epb.SKIP_REASON_POLICY_SKIP)]
    # A zone and DST policies travel too; and a deleted schedule's stamped ranges are listed by their instants.
    hourly = PlannedBy("0 30 2 * * *", "America/New_York", "skip", "first")
    await env.kv.txn([], [env.ledger.skip_op(p, "s", SkipRange(SkipReason.PAUSED, NOW + 30_000, NOW + 86_400_000,
                                                                hourly))])
    await env.svc.DeleteSchedule(spb.DeleteScheduleRequest(id="s"), CTX)
    got = await _all_skips(env, "s", 10)
    assert [_ms(x.planned_at) - NOW for x in got][:2] == [3_000, 6_000]
    assert len([x for x in got if x.range_through == _ts(NOW + 86_400_000)]) == 1  # one 02:30 New York a day


async def test_a_week_of_missed_seconds_is_one_record_and_a_page_reads_only_what_it_shows(env: Env) -> None:
    await env.create("busy", "* * * * * *")
    p = partition_for("busy", P)
    await env.kv.txn([], [env.ledger.skip_op(p, "busy", SkipRange(SkipReason.POLICY_SKIP, NOW, NOW + 7 * 86_400_000))])
    r = await env.svc.ListSkips(spb.ListSkipsRequest(schedule_id="busy", page_size=3), CTX)
    assert [_ms(x.planned_at) - NOW for x in r.skips] == [1000, 2000, 3000] and r.next_page_token
    r = await env.svc.ListSkips(spb.ListSkipsRequest(schedule_id="busy", page_size=3,
                                                     page_token=r.next_page_token), CTX)
    assert [_ms(x.planned_at) - NOW for x in r.skips] == [4000, 5000, 6000]


async def test_skips_of_a_deleted_schedule_are_listed_as_their_records(env: Env) -> None:
    await env.create("gone")
    p = partition_for("gone", P)
    await env.kv.txn([], [env.ledger.skip_op(p, "gone", SkipRange(SkipReason.PAUSED, NOW, NOW + 30_000))])
    await env.svc.DeleteSchedule(spb.DeleteScheduleRequest(id="gone"), CTX)
    got = await _all_skips(env, "gone", 10)
    assert len(got) == 1 and not got[0].HasField("planned_at") and _ms(got[0].range_through) == NOW + 30_000


@pytest.mark.parametrize(("request_", "field"), [
    (spb.ListSkipsRequest(), "schedule_id"),
    (spb.ListSkipsRequest(schedule_id="s", page_size=-1), "page_size"),
    (spb.ListSkipsRequest(schedule_id="s", page_token="garbage"), "page_token"),
])
async def test_skips_list_bad_input_names_the_field(env: Env, request_: spb.ListSkipsRequest, field: str) -> None:
    with pytest.raises(Aborted) as e:
        await env.svc.ListSkips(request_, CTX)
    assert e.value.code is grpc.StatusCode.INVALID_ARGUMENT and e.value.details.startswith(field + ":"), e.value


# ---- ListExecutions across schedules ---------------------------------------------------------------


async def test_cross_schedule_listing_is_bounded_per_page_and_complete(env: Env, monkeypatch: Any) -> None:
    monkeypatch.setattr(service_module, "CROSS_SCHEDULE_SCAN", 7)
    want = set()
    for i in range(6):
        for k in range(5):
            st = ExecState.RUNNING if k == 2 else ExecState.SUCCEEDED
            e = _exec(f"s{i}", NOW + k * 1000, st, tenant="a" if i % 2 else "b")
            await env.put_exec(e)
            if st is ExecState.RUNNING and e.tenant == "a":
                want.add(e.id)
    seen: list[str] = []
    token, pages = "", 0
    while True:
        r = await env.svc.ListExecutions(spb.ListExecutionsRequest(
            states=[epb.EXECUTION_STATE_RUNNING], tenant="a", page_size=100, page_token=token), CTX)
        pages += 1
        seen += [e.execution_id for e in r.executions]
        token = r.next_page_token
        if not token:
            break
    assert sorted(seen) == sorted(want) and len(seen) == len(set(seen))
    assert pages == 5, "30 records read 7 per page: a page never scans the whole ledger"
    # page_size still caps a page.
    r = await env.svc.ListExecutions(spb.ListExecutionsRequest(page_size=2), CTX)
    assert len(r.executions) == 2 and r.next_page_token


async def test_cross_schedule_listing_refuses_newest_first_and_foreign_tokens(env: Env) -> None:
    with pytest.raises(Aborted) as e:
        await env.svc.ListExecutions(spb.ListExecutionsRequest(newest_first=True), CTX)
    assert e.value.code is grpc.StatusCode.INVALID_ARGUMENT and e.value.details.startswith("newest_first:")
    await env.put_exec(_exec("a", NOW))
    await env.put_exec(_exec("a", NOW + 1000))
    r = await env.svc.ListExecutions(spb.ListExecutionsRequest(schedule_id="a", page_size=1), CTX)
    with pytest.raises(Aborted) as e:
        await env.svc.ListExecutions(spb.ListExecutionsRequest(page_size=1, page_token=r.next_page_token), CTX)
    assert e.value.details.startswith("page_token:")


# ---- dead letters ---------------------------------------------------------------------------------


async def _dead_letter(env: Env, sid: str, ms: int, payload: bytes) -> Execution:
    e = _exec(sid, ms)
    e = replace(e, retry=RetryPolicy(max_attempts=1))
    await env.put_exec(e)
    cur = await env.ledger.get(env.kv, sid, ms)
    assert cur is not None
    d = dispatch(cur, worker="w", planner="p", token=FencingToken(0, 1), now_ms=NOW)
    d, _ = result(d, 1, succeeded=False, error_class=ErrorClass.TRANSIENT, message="boom", now_ms=NOW + 10)
    assert d.state is ExecState.DEAD_LETTER
    await env.kv.txn([], [env.ledger.cas_op(d, cur.mod_revision, payload=payload, now_ms=NOW + 10)])
    got = await env.ledger.get(env.kv, sid, ms)
    assert got is not None
    return got


async def test_replay_runs_as_it_died_unless_asked_for_the_current_schedule(env: Env) -> None:
    await env.create("fix", payload=b'{"command": "exit 3"}')
    eid = (await _dead_letter(env, "fix", NOW - 60_000, b'{"command": "exit 3"}')).id
    await env.svc.UpdateSchedule(spb.UpdateScheduleRequest(
        schedule=pb.Schedule(id="fix", payload=b'{"command": "true"}', task_type="shell", worker_pool="q"),
        update_mask={"paths": ["payload", "task_type", "worker_pool"]}), CTX)
    r = await env.svc.ReplayDeadLetter(spb.ReplayDeadLetterRequest(execution_id=eid), CTX)
    got = await env.ledger.get(env.kv, "fix", NOW - 60_000)
    assert got is not None and got.payload == b'{"command": "exit 3"}' and got.task_type == "x"
    assert r.execution.state == epb.EXECUTION_STATE_SCHEDULED
    # Dies again, then replayed with the current schedule: its payload (None: the schedule's at dispatch),
    # task type and pool.
    await env.kv.delete(env.ledger.key(got))
    eid = (await _dead_letter(env, "fix", NOW - 60_000, b'{"command": "exit 3"}')).id
    r = await env.svc.ReplayDeadLetter(spb.ReplayDeadLetterRequest(execution_id=eid, use_current_schedule=True), CTX)
    got = await env.ledger.get(env.kv, "fix", NOW - 60_000)
    assert got is not None and got.payload is None and (got.task_type, got.pool) == ("shell", "q")
    assert (r.execution.task_type, r.execution.worker_pool) == ("shell", "q")


async def test_dead_letter_reason_is_the_recorded_one(env: Env) -> None:
    await env.create("dl")
    d = await _dead_letter(env, "dl", NOW - 60_000, b"")
    # A later policy change does not rewrite history: the stored reason is shown as recorded.
    stored = replace(d, retry=RetryPolicy(max_attempts=9), dead_reason="retries exhausted (1 attempt)")
    await env.kv.txn([], [env.ledger.cas_op(stored, d.mod_revision, now_ms=NOW + 20)])
    r = await env.svc.ListDeadLetters(spb.ListDeadLettersRequest(schedule_id="dl"), CTX)
    assert [x.reason for x in r.dead_letters] == ["retries exhausted (1 attempt)"]


# ---- backfill -------------------------------------------------------------------------------------


async def test_backfill_runs_every_planned_time_in_order_by_default(env: Env) -> None:
    await env.create("bf", "* * * * *")  # the schedule's own overlap policy is the default, skip
    last = None
    async for c in env.ops.backfill("bf", NOW - 12 * 60_000, NOW, None, False):
        last = c
    assert last is not None and (last.planned, last.created, last.skipped) == (12, 12, 0)
    listing, _ = await env.ledger.list_partition(env.kv, partition_for("bf", P), schedule_id="bf")
    assert len(listing) == 12 and {e.overlap for e in listing} == {Overlap.BUFFER_ALL}
    assert {e.state for e in listing} == {ExecState.SCHEDULED}
    # An explicit policy is still the caller's.
    await env.create("bf2", "* * * * *")
    async for c in env.ops.backfill("bf2", NOW - 3 * 60_000, NOW, Overlap.SKIP, True):
        last = c
    assert last is not None and (last.created, last.skipped) == (1, 2)


# ---- drain / undrain ------------------------------------------------------------------------------


class _Own:
    def drained(self) -> frozenset[str]:
        return frozenset()

    def owned_partitions(self) -> dict[int, int]:
        return {}


def _admin(env: Env) -> AdminService:
    return AdminService(kv=env.kv, ks=env.ks, ownership=cast(Ownership, _Own()), clock=env.clock, node_id="p1",
                        region="r", partitions=P, local=LocalView(lambda: NodeStatus(0, ())), rpc_timeout=1.0)


async def test_drain_of_the_last_planner_needs_force_and_undrain_withdraws_it(env: Env) -> None:
    admin = _admin(env)
    for nid in ("p1", "p2"):
        await env.kv.put(env.ks.member(nid), MemberInfo(nid, "r", "127.0.0.1:1", NOW).encode())
    r = await admin.DrainPlanner(apb.DrainPlannerRequest(node_id="p1", reason="kernel"), CTX)
    assert r.planner.liveness == cpb.PLANNER_LIVENESS_DRAINING
    with pytest.raises(Aborted) as e:
        await admin.DrainPlanner(apb.DrainPlannerRequest(node_id="p2"), CTX)
    assert e.value.code is grpc.StatusCode.FAILED_PRECONDITION and "force" in e.value.details
    assert "planner undrain p2" in e.value.details
    assert await env.kv.get(env.ks.drain("p2")) is None, "refused: nothing written"
    await admin.DrainPlanner(apb.DrainPlannerRequest(node_id="p2", force=True), CTX)
    assert await env.kv.get(env.ks.drain("p2")) is not None
    # Draining a draining planner again is still fine without force (idempotent).
    await admin.DrainPlanner(apb.DrainPlannerRequest(node_id="p1"), CTX)
    u = await admin.UndrainPlanner(apb.UndrainPlannerRequest(node_id="p1"), CTX)
    assert u.planner.liveness == cpb.PLANNER_LIVENESS_ALIVE and await env.kv.get(env.ks.drain("p1")) is None
    assert (await admin.UndrainPlanner(apb.UndrainPlannerRequest(node_id="p1"), CTX)).planner.node_id == "p1"
    # A planner that is gone, with a drain request left: withdrawn, reported DOWN; with none: NOT_FOUND.
    await env.kv.delete(env.ks.member("p2"))
    u = await admin.UndrainPlanner(apb.UndrainPlannerRequest(node_id="p2"), CTX)
    assert u.planner.liveness == cpb.PLANNER_LIVENESS_DOWN
    with pytest.raises(Aborted) as e:
        await admin.UndrainPlanner(apb.UndrainPlannerRequest(node_id="p2"), CTX)
    assert e.value.code is grpc.StatusCode.NOT_FOUND
    with pytest.raises(Aborted) as e:
        await admin.UndrainPlanner(apb.UndrainPlannerRequest(), CTX)
    assert e.value.code is grpc.StatusCode.INVALID_ARGUMENT and e.value.details.startswith("node_id:")


def _ts(ms: int) -> Any:
    from google.protobuf.timestamp_pb2 import Timestamp
    t = Timestamp()
    t.FromMilliseconds(ms)
    return t


async def test_trigger_skew_is_reported_in_human_units(env: Env) -> None:
    await env.create("tr")
    with pytest.raises(Aborted) as e:
        await env.svc.TriggerSchedule(spb.TriggerScheduleRequest(id="tr", trigger_time=_ts(NOW - 3_690_000)), CTX)
    assert e.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert "is 1h1m30s from the server's clock; the allowance is 1m" in e.value.details, e.value.details


async def test_preview_after_outside_the_planning_window_is_refused(env: Env) -> None:
    await env.create("pv")
    far = _ts(253_370_764_800_000)  # 9999-01-01: valid for the API, beyond what plans cover
    with pytest.raises(Aborted) as e:
        await env.svc.PreviewSchedule(spb.PreviewScheduleRequest(schedule_id="pv", after=far), CTX)
    assert e.value.details.startswith("after: 9999-01-01T00:00:00.000Z is outside the planning window")


async def test_drain_counts_only_planners_that_may_own_partitions(env: Env) -> None:
    """An outside audit: with standby regions alive, draining the primary region's only planner was accepted, and
    nothing planned until an automatic failover moved the region (15 s of missed runs). Standby planners and
    suspended ones (clock skew) claim nothing: they do not count; a standby's drain stops nothing."""
    from scheduler.region import policy as rp

    admin = _admin(env)
    await env.kv.put(env.ks.member("p1"), MemberInfo("p1", "r1", "127.0.0.1:1", NOW).encode())
    await env.kv.put(env.ks.member("p2"), MemberInfo("p2", "r2", "127.0.0.1:2", NOW).encode())
    await env.kv.put(env.ks.member("p3"), MemberInfo("p3", "r1", "127.0.0.1:3", NOW, suspended="clock_skew").encode())
    await env.kv.put(env.ks.region_policy, rp.encode(rp.RegionPolicy(primary="r1", standby=("r2",))))
    with pytest.raises(Aborted) as e:
        await admin.DrainPlanner(apb.DrainPlannerRequest(node_id="p1"), CTX)
    assert e.value.code is grpc.StatusCode.FAILED_PRECONDITION and "planning region 'r1'" in e.value.details
    assert await env.kv.get(env.ks.drain("p1")) is None, "refused: nothing written"
    await admin.DrainPlanner(apb.DrainPlannerRequest(node_id="p2"), CTX)  # a standby's: planning goes on
    assert await env.kv.get(env.ks.drain("p2")) is not None
    await admin.DrainPlanner(apb.DrainPlannerRequest(node_id="p1", force=True), CTX)
    assert await env.kv.get(env.ks.drain("p1")) is not None


async def test_two_drains_racing_cannot_together_leave_no_planner(env: Env) -> None:
    admin = _admin(env)
    for nid in ("p1", "p2"):
        await env.kv.put(env.ks.member(nid), MemberInfo(nid, "r", "127.0.0.1:1", NOW).encode())
    real = admin._members
    calls = 0

    async def members_with_a_concurrent_drain() -> dict[str, MemberInfo]:
        nonlocal calls
        calls += 1
        if calls == 2:  # after our check and write: another node drained p2 meanwhile
            await env.kv.put(env.ks.drain("p2"), b"{}")
        return await real()

    admin._members = members_with_a_concurrent_drain  # type: ignore[method-assign]
    with pytest.raises(Aborted) as e:
        await admin.DrainPlanner(apb.DrainPlannerRequest(node_id="p1"), CTX)
    assert e.value.code is grpc.StatusCode.FAILED_PRECONDITION and "at the same time" in e.value.details
    assert await env.kv.get(env.ks.drain("p1")) is None, "our request was taken back"


async def test_get_execution_of_a_dead_letter_says_why(env: Env) -> None:
    await env.create("why")
    d = await _dead_letter(env, "why", NOW - 60_000, b"")
    got = await env.svc.GetExecution(spb.GetExecutionRequest(execution_id=d.id), CTX)
    assert got.execution.state_message == "retries exhausted (1 attempt)"
