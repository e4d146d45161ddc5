"""Operator operations (scheduler.api.operations) against a real etcd, with a real PlannerNode owning the
partitions, its WorkerService on a real socket and a real SDK worker connected to it, all in-process.

The owner learns of every record these operations write through notices (scheduler.store.notices):
without them a triggered run would never be dispatched until the partition's planner restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace

import pytest

from chaos.infra.etcd import EtcdCluster
from scheduler._gen.scheduler.v1 import execution_pb2
from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler.api.operations import BackfillCounts, Operations
from scheduler.clock import SYSTEM_CLOCK
from scheduler.config import CoordinationSettings
from scheduler.dispatch.results import Recorded
from scheduler.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from scheduler.execution import KILL_AFTER_MS, ExecState, Execution, Trigger
from scheduler.ids import FencingToken, execution_id, schedule_of
from scheduler.model import Policies, RetryPolicy, Schedule, ScheduleState
from scheduler.node import PlannerNode
from scheduler.planner.settings import PlannerSettings
from scheduler.server import start_server
from scheduler.store.etcd import EtcdClient
from scheduler.store.keyspace import Keyspace, partition_for
from scheduler.timeplan import Overlap
from scheduler.worker import ExecutionContext, PermanentError, Worker, WorkerSettings
from scheduler.worker.protocol import CAPABILITIES

pytestmark = pytest.mark.etcd

COORD = CoordinationSettings(node_id="n1", lease_ttl=2, renew_interval=0.5, rpc_timeout=0.5, safety_margin=0.3,
                             partitions=4)
FAST = PlannerSettings(lookahead_ms=500, loop_interval=0.05, late_grace_ms=1_000)
WORKER = WorkerSettings(worker_id="w1", pool="pool", region="default", concurrency=8, heartbeat_interval=0.1,
                        cancel_grace=2.0, result_ack_timeout=1.0, credit_idle_after=5.0, reconnect_backoff_min=0.02,
                        reconnect_backoff_max=0.2, welcome_timeout=2.0, discovery_interval=5.0, flush_timeout=1.0,
                        drain_grace=1.0)
YEARLY = "0 0 1 1 *"  # never fires during a test: every run below is one the test asked for
MINUTE = 60_000


@dataclass
class Run:
    execution_id: str
    attempt: int
    trigger: str
    payload: bytes
    cancelled: bool = False
    started_ms: int = 0  # wall times of the handler's start and of its real end (linger* schedules)
    stopped_ms: int = 0


@dataclass
class Env:
    kv: EtcdClient
    ks: Keyspace
    node: PlannerNode
    ops: Operations
    runs: list[Run] = field(default_factory=list)
    heal: set[str] = field(default_factory=set)  # schedules whose failing handler now succeeds
    started: dict[str, asyncio.Event] = field(default_factory=dict)

    async def create(self, sid: str, spec: str = YEARLY, **kw: object) -> Schedule:
        s = replace(Schedule(id=sid, tenant="t", spec=spec, worker_pool="pool", task_type="t", payload=b"p1"),
                    **kw)  # type: ignore[arg-type]
        return (await self.node.store.create(s, SYSTEM_CLOCK.wall_ms() - 3_600_000)).schedule

    async def get(self, eid: str) -> Execution:
        sid = schedule_of(eid)
        for e in (await self.node.ledger.list_partition(self.kv, partition_for(sid, COORD.partitions),
                                                        schedule_id=sid))[0]:
            if e.id == eid:
                return e
        raise AssertionError(f"{eid} not in the ledger")

    async def until(self, eid: str, pred: Callable[[Execution], bool], what: str, timeout: float = 15) -> Execution:
        async with asyncio.timeout(timeout):
            while True:
                e = await self.get(eid)
                if pred(e):
                    return e
                await asyncio.sleep(0.05)
        raise AssertionError(what)  # pragma: no cover

    async def finished(self, eid: str, timeout: float = 15) -> Execution:
        return await self.until(eid, lambda e: e.terminal or e.state is ExecState.DEAD_LETTER, f"{eid} finished",
                                timeout)

    def attempts_of(self, eid: str) -> list[int]:
        return [r.attempt for r in self.runs if r.execution_id == eid]

    async def notices(self) -> int:
        return (await self.kv.range(self.ks.notices(), prefix=True, count_only=True)).count

    async def owned(self) -> None:
        async with asyncio.timeout(10):
            while len(self.node.planners) < COORD.partitions:
                await asyncio.sleep(0.05)


@pytest.fixture
async def kv(etcd_server: EtcdCluster) -> AsyncIterator[EtcdClient]:
    async with EtcdClient(etcd_server.config(timeout=0.5)) as c:
        yield c


async def start_env(kv: EtcdClient, key_prefix: str, planner: PlannerSettings = FAST, *, run_node: bool = True,
                    **ops_kw: object) -> tuple[Env, Callable[[], object]]:
    ks = Keyspace(key_prefix.rstrip("/"))
    node = PlannerNode(kv, ks, COORD, SYSTEM_CLOCK, planner=planner)
    server, port = await start_server(node.make_dispatcher(), "127.0.0.1", 0)
    ops = Operations(kv, ks, COORD.partitions, node.store, node.ledger, SYSTEM_CLOCK, rpc_timeout=1.0,
                     **ops_kw)  # type: ignore[arg-type]
    env = Env(kv, ks, node, ops)
    worker = Worker(settings=dataclasses.replace(WORKER, planners=(f"127.0.0.1:{port}",)))

    @worker.task("t")
    async def handler(ctx: ExecutionContext, payload: bytes) -> None:
        run = Run(ctx.execution_id, ctx.attempt, ctx.trigger, payload)
        env.runs.append(run)
        env.started.setdefault(ctx.execution_id, asyncio.Event()).set()
        run.started_ms = SYSTEM_CLOCK.wall_ms()
        if ctx.schedule_id.startswith("hold"):
            await asyncio.wait_for(ctx.cancel_event.wait(), 30)
            run.cancelled = True
        elif ctx.schedule_id.startswith("linger"):  # takes a while to stop after a cancel (cleans up)
            await asyncio.wait_for(ctx.cancel_event.wait(), 30)
            await asyncio.sleep(0.8)
            run.cancelled, run.stopped_ms = True, SYSTEM_CLOCK.wall_ms()
        elif ctx.schedule_id.startswith("fail") and ctx.schedule_id not in env.heal:
            raise PermanentError("bad payload")

    await worker.start()
    tasks: list[asyncio.Task[None]] = []

    def start_node() -> None:
        tasks.append(asyncio.create_task(node.run()))

    if run_node:
        start_node()
    env.__dict__["_stop"] = (worker, server, tasks)
    return env, start_node


@pytest.fixture
async def env(kv: EtcdClient, key_prefix: str) -> AsyncIterator[Env]:
    e, _ = await start_env(kv, key_prefix)
    yield e
    await stop_env(e)


async def stop_env(env: Env) -> None:
    worker, server, tasks = env.__dict__["_stop"]
    await worker.close()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await server.stop(None)


# ---- trigger ----------------------------------------------------------------------------------------


async def test_triggered_run_is_dispatched_and_completes(env: Env) -> None:
    await env.create("s1")
    e = await env.ops.trigger("s1", None, None)
    assert (e.state, e.trigger, e.attempt) == (ExecState.SCHEDULED, Trigger.MANUAL, 0)
    done = await env.finished(e.id)
    assert (done.state, done.attempt) == (ExecState.SUCCEEDED, 1)
    assert [(r.attempt, r.trigger, r.payload) for r in env.runs] == [(1, "manual", b"p1")]
    async with asyncio.timeout(5):
        while await env.notices():
            await asyncio.sleep(0.05)
    assert env.node.restarts == 0, "the owner took the record in through its notice, not a reload"


async def test_notice_reaches_the_owner_before_its_next_timed_round(kv: EtcdClient, key_prefix: str) -> None:
    """With rounds 5 s apart, only the notice's wake-up can get the run dispatched sooner."""
    env, _ = await start_env(kv, key_prefix, replace(FAST, loop_interval=5.0))
    try:
        await env.create("s1")
        await env.owned()
        await asyncio.sleep(0.5)  # the first rounds after the claims are over: the loops now sleep 5 s
        rounds = {p: pl.stats.rounds for p, pl in env.node.planners.items()}
        e = await env.ops.trigger("s1", None, None)
        await env.finished(e.id, timeout=4.0)
        p = partition_for("s1", COORD.partitions)
        assert env.node.planners[p].stats.rounds <= rounds[p] + 3, "woken by the notice, not by rounds"
    finally:
        await stop_env(env)


async def test_trigger_is_idempotent_with_a_trigger_time_and_never_takes_a_planned_id(env: Env) -> None:
    await env.create("every", spec="@every 1s", state=ScheduleState.ACTIVE)
    now = SYSTEM_CLOCK.wall_ms()
    planned = now - now % 1000  # a planned time of @every 1s
    a = await env.ops.trigger("every", planned, None)
    assert a.planned_ms == planned + 1, "moved forward by whole ms off a planned time"
    b = await env.ops.trigger("every", planned, None)
    assert b.id == a.id, "a repeat with the same trigger_time returns the first call's execution"
    c = await env.ops.trigger("every", planned + 1, None)
    assert c.id == a.id
    # Without a trigger time every call is a new run, even within one millisecond.
    await env.create("s2")
    ids = {(await env.ops.trigger("s2", None, Overlap.ALLOW_ALL)).id for _ in range(3)}
    assert len(ids) == 3
    for eid in ids:
        assert (await env.finished(eid)).state is ExecState.SUCCEEDED, "allow_all for these runs"
    # The schedule's own policy (skip) applies when the call names none: of two at once, one is skipped.
    pair = [await env.ops.trigger("s2", None, None) for _ in range(2)]
    states = sorted([(await env.finished(e.id)).state.value for e in pair])
    assert states in (["skipped", "succeeded"], ["succeeded", "succeeded"])


def _yearly_past(now_ms: int) -> int:
    """The most recent 1 January 00:00 UTC before now: a planned time of YEARLY."""
    from scheduler.timeplan import parse_spec

    t = parse_spec(YEARLY, schedule_id="x").prev_before_ms(now_ms)
    assert t is not None
    return t


async def test_trigger_moves_past_ids_taken_by_other_executions(env: Env) -> None:
    await env.create("s1")
    now = SYSTEM_CLOCK.wall_ms()
    # Another execution (say a backfill of an older spec) holds the instant: write one there directly.
    other = dataclasses.replace(await env.ops.trigger("s1", now, None))  # MANUAL at `now`
    b = await env.ops.trigger("s1", now, None)
    assert b.id == other.id
    taken = dataclasses.replace(other, id=execution_id("s1", now + 10), planned_ms=now + 10, due_ms=now + 10,
                                trigger=Trigger.BACKFILL, mod_revision=0)
    await env.kv.txn([], [env.node.ledger.create_op(taken)])
    t = await env.ops.trigger("s1", now + 10, None)
    assert t.planned_ms == now + 11, "a taken id is never reused: moved to the next free millisecond"


async def test_trigger_errors(env: Env) -> None:
    with pytest.raises(NotFound):
        await env.ops.trigger("nope", None, None)
    with pytest.raises(NotFound):
        await env.ops.trigger("bad/id", None, None)
    await env.create("paused", state=ScheduleState.PAUSED)
    with pytest.raises(FailedPrecondition):
        await env.ops.trigger("paused", None, None)
    await env.create("s1")
    with pytest.raises(InvalidArgument) as err:
        await env.ops.trigger("s1", SYSTEM_CLOCK.wall_ms() + 10 * MINUTE, None)
    assert err.value.field == "trigger_time"
    with pytest.raises(InvalidArgument):
        await env.ops.trigger("s1", SYSTEM_CLOCK.wall_ms() - 10 * MINUTE, None)


# ---- rerun ----------------------------------------------------------------------------------------------


async def test_rerun_creates_then_reruns_a_succeeded_planned_time(env: Env) -> None:
    await env.create("s1")
    t = _yearly_past(SYSTEM_CLOCK.wall_ms())
    e = await env.ops.rerun("s1", t)
    assert (e.id, e.trigger) == (execution_id("s1", t), Trigger.RERUN), "created by the rerun"
    assert (await env.finished(e.id)).state is ExecState.SUCCEEDED
    again = await env.ops.rerun("s1", t)
    assert (again.state, again.attempt, again.attempt_base) == (ExecState.SCHEDULED, 1, 1)
    done = await env.until(e.id, lambda x: x.state is ExecState.SUCCEEDED and x.attempt == 2, "second run")
    assert done.id == e.id
    assert env.attempts_of(e.id) == [1, 2], "same id, next attempt"
    assert [r.trigger for r in env.runs] == ["rerun", "rerun"]


async def test_rerun_of_a_skipped_planned_time_runs_it(env: Env) -> None:
    await env.create("s1")
    t = _yearly_past(SYSTEM_CLOCK.wall_ms())
    s = (await env.node.store.get("s1")).schedule
    skipped = Execution(id=execution_id("s1", t), schedule_id="s1", tenant="t", pool="pool", task_type="t",
                        planned_ms=t, due_ms=t, trigger=Trigger.SCHEDULED, retry=s.policies.retry,
                        timeout_ms=s.policies.execution_timeout_ms, state=ExecState.SKIPPED,
                        skip_reason="overlap_skip")
    await env.kv.txn([], [env.node.ledger.create_op(skipped)])
    e = await env.ops.rerun("s1", t)
    assert (e.state, e.skip_reason) == (ExecState.SCHEDULED, "")
    done = await env.finished(e.id)
    assert (done.state, done.attempt, done.trigger) == (ExecState.SUCCEEDED, 1, Trigger.SCHEDULED)
    assert env.attempts_of(e.id) == [1]
    assert [r.trigger for r in env.runs] == ["rerun"], "the worker is told which run it is"


async def test_rerun_errors(env: Env) -> None:
    await env.create("hold1")
    now = SYSTEM_CLOCK.wall_ms()
    with pytest.raises(InvalidArgument) as err:
        await env.ops.rerun("hold1", now + MINUTE)
    assert err.value.field == "planned_at"
    with pytest.raises(InvalidArgument) as err:
        await env.ops.rerun("hold1", _yearly_past(now) + 1)
    assert err.value.field == "planned_at", "no record and not a planned time of the spec"
    with pytest.raises(NotFound):
        await env.ops.rerun("nope", now)
    e = await env.ops.trigger("hold1", None, None)
    await env.until(e.id, lambda x: x.state in (ExecState.DISPATCHED, ExecState.RUNNING), "running")
    with pytest.raises(FailedPrecondition):
        await env.ops.rerun("hold1", e.planned_ms)  # refused while an attempt is in flight
    await env.ops.cancel_execution(e.id)
    await env.create("fail1", policies=Policies(retry=RetryPolicy(max_attempts=1, max_unknown_attempts=1)))
    d = await env.ops.trigger("fail1", None, None)
    assert (await env.finished(d.id)).state is ExecState.DEAD_LETTER
    with pytest.raises(FailedPrecondition, match="ReplayDeadLetter"):
        await env.ops.rerun("fail1", d.planned_ms)
    await env.create("paused", state=ScheduleState.PAUSED)
    with pytest.raises(FailedPrecondition):
        await env.ops.rerun("paused", _yearly_past(now))


# ---- backfill --------------------------------------------------------------------------------------------


async def collect(it: AsyncIterator[BackfillCounts]) -> list[BackfillCounts]:
    return [c async for c in it]


async def test_backfill_counts_creates_and_never_duplicates(env: Env) -> None:
    await env.create("bf", spec="* * * * *")
    env.ops.backfill_batch = 4  # several progress messages
    now = SYSTEM_CLOCK.wall_ms()
    end = now - now % MINUTE - 5 * MINUTE
    start = end - 10 * MINUTE
    dry = await collect(env.ops.backfill("bf", start, end, Overlap.ALLOW_ALL, True))
    assert [c.planned for c in dry] == [4, 8, 10]
    assert dry[-1] == BackfillCounts(10, 10, 0, 0, end, True)
    assert all(not c.done for c in dry[:-1])
    assert [c.processed_until_ms for c in dry[:-1]] == [start + 4 * MINUTE, start + 8 * MINUTE]
    listed = (await env.node.ledger.list_partition(env.kv, partition_for("bf", 4), schedule_id="bf"))[0]
    # The schedule's own minutes may start meanwhile (a minute boundary can pass during the test).
    assert [e for e in listed if e.trigger is not Trigger.SCHEDULED] == [], "a dry run writes nothing"
    got = await collect(env.ops.backfill("bf", start, end, Overlap.ALLOW_ALL, False))
    assert got[-1] == BackfillCounts(10, 10, 0, 0, end, True)
    for c in got:
        assert c.planned == c.created + c.existing + c.skipped
    ids = [execution_id("bf", start + i * MINUTE) for i in range(10)]
    for eid in ids:
        e = await env.finished(eid)
        assert (e.state, e.trigger) == (ExecState.SUCCEEDED, Trigger.BACKFILL)
    # Again over a wider range: the ten are left alone, only the new ones are created.
    again = await collect(env.ops.backfill("bf", start - 2 * MINUTE, end, Overlap.ALLOW_ALL, False))
    assert again[-1] == BackfillCounts(12, 2, 10, 0, end, True)
    await env.finished(execution_id("bf", start - MINUTE))
    # Only the backfilled range: the schedule's own minutes keep running meanwhile (a minute boundary
    # can pass during the test).
    backfilled = {execution_id("bf", start + i * MINUTE) for i in range(-2, 10)}
    ran = [r.execution_id for r in env.runs if r.execution_id in backfilled]
    assert len(ran) == len(set(ran)) == 12, "every planned time ran exactly once"


async def test_retention_counts_a_backfill_without_a_full_listing(kv: EtcdClient, key_prefix: str) -> None:
    """Retention lists only the schedules it knows to be over their count (planner/retention.py): records
    a backfill made come with a notice, and the owner counts them from it. Without that, this yearly
    schedule (no record of the owner's own) stayed unlisted until the 60th sweep's full listing."""
    env, _ = await start_env(kv, key_prefix, replace(FAST, retention_count=3, retention_interval=0.3))
    try:
        p = partition_for("rb", COORD.partitions)
        async with asyncio.timeout(10):  # the owner's first sweep (a full listing) is behind it
            while p not in env.node.planners or env.node.planners[p].history.full_listings < 1:
                await asyncio.sleep(0.05)
        now = SYSTEM_CLOCK.wall_ms()
        # Active from now: the owner's own records are at most the next minute's while the test runs.
        await env.node.store.create(Schedule(id="rb", tenant="t", spec="* * * * *", worker_pool="pool",
                                             task_type="t"), now)
        end = now - now % MINUTE - 5 * MINUTE
        got = await collect(env.ops.backfill("rb", end - 10 * MINUTE, end, Overlap.ALLOW_ALL, False))
        assert got[-1].created == 10
        backfilled = [execution_id("rb", end - (10 - i) * MINUTE) for i in range(10)]
        for eid in backfilled:
            with contextlib.suppress(AssertionError):  # retention may take the early ones before we look
                await env.finished(eid)
        async with asyncio.timeout(5):  # a few sweeps of 0.3 s; the full listing comes at 18 s
            while True:
                left = [e for e in (await env.node.ledger.list_partition(kv, p, schedule_id="rb"))[0]
                        if e.trigger is Trigger.BACKFILL]
                if len(left) <= 3:
                    break
                await asyncio.sleep(0.1)
        planner = env.node.planners[p]
        assert planner.history.full_listings == 1, "deleted by a targeted sweep, not a full listing"
        assert sorted(e.id for e in left) == backfilled[len(backfilled) - len(left):], "the newest are kept"
    finally:
        await stop_env(env)


async def test_backfill_overlap_skip_among_backfilled(env: Env) -> None:
    await env.create("hold-bf", spec="* * * * *")
    now = SYSTEM_CLOCK.wall_ms()
    end = now - now % MINUTE - MINUTE
    got = await collect(env.ops.backfill("hold-bf", end - 5 * MINUTE, end, Overlap.SKIP, False))
    assert got[-1] == BackfillCounts(5, 1, 0, 4, end, True)
    first = execution_id("hold-bf", end - 5 * MINUTE)
    await env.until(first, lambda e: e.state in (ExecState.DISPATCHED, ExecState.RUNNING), "first runs")
    for i in range(1, 5):
        e = await env.get(execution_id("hold-bf", end - (5 - i) * MINUTE))
        assert (e.state, e.skip_reason) == (ExecState.SKIPPED, "overlap_skip")
    # With one still running, a buffer_one backfill holds one more and skips the rest.
    got = await collect(env.ops.backfill("hold-bf", end - 8 * MINUTE, end - 5 * MINUTE, Overlap.BUFFER_ONE, False))
    assert got[-1] == BackfillCounts(3, 1, 0, 2, end - 5 * MINUTE, True)
    buffered = await env.get(execution_id("hold-bf", end - 8 * MINUTE))
    assert buffered.state is ExecState.SCHEDULED and buffered.overlap is Overlap.BUFFER_ONE
    await asyncio.sleep(0.5)
    assert (await env.get(buffered.id)).state is ExecState.SCHEDULED, "the owner holds it while one runs"
    assert await env.ops.cancel_running("hold-bf", "test over") == 1
    await env.until(buffered.id, lambda e: e.state in (ExecState.DISPATCHED, ExecState.RUNNING),
                    "the buffered run starts once the running one is gone")


async def test_backfill_errors_are_raised_before_any_progress(kv: EtcdClient, key_prefix: str) -> None:
    env, _ = await start_env(kv, key_prefix, backfill_limit=5)
    try:
        await env.create("bf", spec="* * * * *")
        now = SYSTEM_CLOCK.wall_ms()
        with pytest.raises(ResourceExhausted):
            await collect(env.ops.backfill("bf", now - 10 * MINUTE, now - MINUTE, None, True))
        with pytest.raises(InvalidArgument) as err:
            await collect(env.ops.backfill("bf", now - MINUTE, now - 2 * MINUTE, None, True))
        assert err.value.field == "end_time"
        with pytest.raises(InvalidArgument) as err:
            await collect(env.ops.backfill("bf", now - MINUTE, now + MINUTE, None, True))
        assert err.value.field == "end_time"
        with pytest.raises(NotFound):
            await collect(env.ops.backfill("nope", now - MINUTE, now, None, True))
        await env.create("paused", spec="* * * * *", state=ScheduleState.PAUSED)
        with pytest.raises(FailedPrecondition):
            await collect(env.ops.backfill("paused", now - 3 * MINUTE, now, None, False))
        empty = await collect(env.ops.backfill("bf", now - 30_000 - now % MINUTE + 1, now - now % MINUTE, None, False))
        assert empty[-1].done and empty[-1].planned == 0
    finally:
        await stop_env(env)


# ---- cancel ----------------------------------------------------------------------------------------------


async def test_cancel_of_a_running_attempt_reaches_the_worker(env: Env) -> None:
    await env.create("hold1")
    e = await env.ops.trigger("hold1", None, None)
    await asyncio.wait_for(env.started.setdefault(e.id, asyncio.Event()).wait(), 15)
    c = await env.ops.cancel_execution(e.id, "operator says stop")
    # Recorded before the work stops: CANCELLING until the worker confirms the stop (issue 9, item 9).
    assert (c.state, c.skip_reason) == (ExecState.CANCELLING, "operator says stop")
    cur = c.current
    assert cur is not None and cur.stop_requested_ms and cur.deadline_ms <= cur.stop_requested_ms + KILL_AFTER_MS
    with pytest.raises(FailedPrecondition, match="already cancelling"):
        await env.ops.cancel_execution(e.id)
    async with asyncio.timeout(10):
        while not env.runs[0].cancelled:
            await asyncio.sleep(0.05)
        while (done := await env.get(e.id)).state is not ExecState.CANCELLED:
            await asyncio.sleep(0.05)
    stop = done.current
    assert stop is not None and stop.finished_ms >= stop.stop_requested_ms and stop.worker and stop.started_ms, stop
    assert stop.error_class is None and not stop.succeeded, "its outcome is the worker's: CANCELLED"
    with pytest.raises(FailedPrecondition):
        await env.ops.cancel_execution(e.id)
    with pytest.raises(NotFound):
        await env.ops.cancel_execution(execution_id("hold1", 1_000))
    with pytest.raises(InvalidArgument) as err:
        await env.ops.cancel_execution("no-at-sign")
    assert err.value.field == "execution_id"
    with pytest.raises(InvalidArgument) as err:
        await env.ops.cancel_execution("hold1@yesterday")
    assert err.value.field == "execution_id"
    with pytest.raises(InvalidArgument) as err:
        await env.ops.cancel_execution(e.id, "x" * 2000)
    assert err.value.field == "reason"


async def test_a_rerun_right_after_a_cancel_waits_until_the_first_run_really_stopped(env: Env) -> None:
    """Issue 9, item 9: cancel is recorded before the work stops, so the same execution id must not start
    again before its worker confirmed the stop; the record shows when it really stopped and how."""
    await env.create("linger1")
    e = await env.ops.trigger("linger1", None, None)
    await asyncio.wait_for(env.started.setdefault(e.id, asyncio.Event()).wait(), 15)
    c = await env.ops.cancel_execution(e.id, "stop it")
    assert c.state is ExecState.CANCELLING
    with pytest.raises(FailedPrecondition, match="is cancelling"):
        await env.ops.rerun("linger1", e.planned_ms)  # at once: refused, the first run is still stopping
    async with asyncio.timeout(15):
        while True:
            try:
                again = await env.ops.rerun("linger1", e.planned_ms)
                break
            except FailedPrecondition:
                await asyncio.sleep(0.02)
        while len(env.runs) < 2:
            await asyncio.sleep(0.02)
    first, second = env.runs
    assert again.state is ExecState.SCHEDULED and first.stopped_ms, first
    assert second.started_ms >= first.stopped_ms, "the second run started before the first one stopped"
    stopped = next(a for a in (await env.get(e.id)).attempts if a.attempt == 1)
    assert stopped.error_class is None and not stopped.succeeded and stopped.message.startswith("cancelled by"), stopped
    assert stopped.worker == "w1" and stopped.started_ms and stopped.stop_requested_ms, stopped
    assert first.stopped_ms <= stopped.finished_ms < first.stopped_ms + 1_000, "finished when it really stopped"


async def test_cancel_other_starts_the_new_run_only_once_the_cancelled_one_stopped(env: Env) -> None:
    await env.create("linger2", policies=Policies(overlap=Overlap.CANCEL_OTHER))
    old = await env.ops.trigger("linger2", None, None)
    await asyncio.wait_for(env.started.setdefault(old.id, asyncio.Event()).wait(), 15)
    new = await env.ops.trigger("linger2", None, None)
    await asyncio.wait_for(env.started.setdefault(new.id, asyncio.Event()).wait(), 15)
    first, second = env.runs
    assert first.execution_id == old.id and first.stopped_ms, first
    assert second.started_ms >= first.stopped_ms, "the cancel_other successor started before the old run stopped"
    done = await env.get(old.id)
    cur = done.current
    assert done.state is ExecState.CANCELLED and done.skip_reason == "overlap", done
    assert cur is not None and cur.error_class is None and cur.finished_ms >= first.stopped_ms, cur


async def test_cancel_of_a_scheduled_execution_withdraws_it(env: Env) -> None:
    await env.create("s1")
    e = await env.ops.trigger("s1", SYSTEM_CLOCK.wall_ms() + 30_000, None)  # due in 30 s
    c = await env.ops.cancel_execution(e.id)
    assert c.state is ExecState.CANCELLED
    await asyncio.sleep(0.5)
    p = env.node.planners[partition_for("s1", COORD.partitions)]
    assert p.pending.get(e.id) is None, "the owner dropped it"


async def test_cancel_running_cancels_every_in_flight_attempt(env: Env) -> None:
    await env.create("hold2", policies=Policies(overlap=Overlap.ALLOW_ALL))
    es = [await env.ops.trigger("hold2", None, None) for _ in range(2)]
    for e in es:
        await asyncio.wait_for(env.started.setdefault(e.id, asyncio.Event()).wait(), 15)
    assert await env.ops.cancel_running("hold2", "paused with cancel_running") == 2
    async with asyncio.timeout(10):
        while not all(r.cancelled for r in env.runs):
            await asyncio.sleep(0.05)
    assert await env.ops.cancel_running("hold2", "again") == 0, "cancelling already"
    async with asyncio.timeout(10):
        for e in es:
            while (await env.get(e.id)).state is not ExecState.CANCELLED:
                await asyncio.sleep(0.05)
    assert await env.ops.cancel_running("hold2", "again") == 0
    assert await env.ops.cancel_running("never-existed", "x") == 0


# ---- dead letters -------------------------------------------------------------------------------------


async def test_dead_letter_replay_succeeds_with_same_id_fresh_budget_and_original_payload(env: Env) -> None:
    retry = RetryPolicy(max_attempts=2, initial_backoff_ms=10, max_backoff_ms=20, max_unknown_attempts=1)
    s = await env.create("fail1", policies=Policies(retry=retry), payload=b"original")
    e = await env.ops.trigger("fail1", None, None)
    dead = await env.finished(e.id)
    assert (dead.state, dead.attempt) == (ExecState.DEAD_LETTER, 1), "permanent: no retry"
    p = partition_for("fail1", COORD.partitions)
    assert (await env.kv.range(env.ks.dead_letters(p), prefix=True)).count == 1
    await env.node.store.update(replace(s, payload=b"changed since"), None, SYSTEM_CLOCK.wall_ms())
    env.heal.add("fail1")
    r = await env.ops.replay_dead_letter(e.id)
    assert (r.id, r.state, r.trigger, r.run_trigger, r.attempt_base) == (
        e.id, ExecState.SCHEDULED, Trigger.MANUAL, Trigger.REPLAY, 1)
    done = await env.finished(e.id)
    assert (done.state, done.attempt) == (ExecState.SUCCEEDED, 2)
    assert [a.trigger for a in done.attempts] == [None, Trigger.REPLAY]
    assert [(x.attempt, x.trigger, x.payload) for x in env.runs] == [(1, "manual", b"original"),
                                                                      (2, "replay", b"original")]
    assert (await env.kv.range(env.ks.dead_letters(p), prefix=True)).count == 0, "the dead letter is gone"
    with pytest.raises(NotFound):
        await env.ops.replay_dead_letter(e.id)


async def test_replayed_dead_letter_gets_a_fresh_retry_budget(env: Env) -> None:
    retry = RetryPolicy(max_attempts=2, initial_backoff_ms=10, max_backoff_ms=20, max_unknown_attempts=1)
    await env.create("fail2", policies=Policies(retry=retry))
    e = await env.ops.trigger("fail2", None, None)
    await env.finished(e.id)
    await env.ops.replay_dead_letter(e.id)
    dead = await env.until(e.id, lambda x: x.state is ExecState.DEAD_LETTER and x.attempt == 2, "dead again")
    assert dead.attempt_base == 1
    assert env.attempts_of(e.id) == [1, 2]


async def test_discard_ends_failed_and_removes_the_dead_letter(env: Env) -> None:
    await env.create("fail3", policies=Policies(retry=RetryPolicy(max_attempts=1, max_unknown_attempts=1)))
    e = await env.ops.trigger("fail3", None, None)
    await env.finished(e.id)
    d = await env.ops.discard_dead_letter(e.id, "not worth it")
    assert (d.state, d.skip_reason) == (ExecState.FAILED, "not worth it")
    assert (await env.get(e.id)).state is ExecState.FAILED
    assert (await env.kv.range(env.ks.dead_letters(), prefix=True)).count == 0
    with pytest.raises(NotFound):
        await env.ops.discard_dead_letter(e.id)
    with pytest.raises(NotFound):
        await env.ops.replay_dead_letter(e.id)
    p = env.node.planners[partition_for("fail3", COORD.partitions)]
    await asyncio.sleep(0.3)
    assert p.pending.get(e.id) is None, "the owner no longer holds the finished record"


async def test_replay_refused_for_a_paused_or_deleted_schedule(env: Env) -> None:
    s = await env.create("fail4", policies=Policies(retry=RetryPolicy(max_attempts=1, max_unknown_attempts=1)))
    e = await env.ops.trigger("fail4", None, None)
    await env.finished(e.id)
    st = await env.node.store.update(replace(s, state=ScheduleState.PAUSED), None, SYSTEM_CLOCK.wall_ms())
    with pytest.raises(FailedPrecondition):
        await env.ops.replay_dead_letter(e.id)
    await env.node.store.delete("fail4", st.schedule.version, now_ms=SYSTEM_CLOCK.wall_ms())
    with pytest.raises(FailedPrecondition, match="discard"):
        await env.ops.replay_dead_letter(e.id)
    assert (await env.get(e.id)).state is ExecState.DEAD_LETTER, "refusals change nothing"


# ---- notices --------------------------------------------------------------------------------------------


async def test_notices_written_without_an_owner_are_handled_and_cleared_on_claim(kv: EtcdClient,
                                                                                 key_prefix: str) -> None:
    env, start_node = await start_env(kv, key_prefix, run_node=False)
    try:
        await env.create("s1")
        e = await env.ops.trigger("s1", None, None)
        assert await env.notices() == 1
        start_node()
        assert (await env.finished(e.id)).state is ExecState.SUCCEEDED
        async with asyncio.timeout(5):
            while await env.notices():
                await asyncio.sleep(0.05)
    finally:
        await stop_env(env)


async def test_a_result_recorded_by_another_node_reaches_the_owner(kv: EtcdClient, key_prefix: str) -> None:
    """The owner dispatched an attempt; a node that does not own the partition records its result (the
    worker reconnected there). The owner's snapshot follows at once instead of timing the attempt out."""
    env, _ = await start_env(kv, key_prefix)
    try:
        await env.create("hold3")
        e = await env.ops.trigger("hold3", None, None)
        await asyncio.wait_for(env.started.setdefault(e.id, asyncio.Event()).wait(), 15)
        other = PlannerNode(kv, env.ks, replace(COORD, node_id="n2"), SYSTEM_CLOCK, planner=FAST)
        d = other.make_dispatcher()
        report = await d.recorder.record_now("w1", [wpb.Result(
            execution_id=e.id, attempt=1, outcome=execution_pb2.ATTEMPT_OUTCOME_SUCCEEDED)])
        (entry,) = report.entries
        assert entry.recorded is Recorded.FINISHED and not entry.fast, "not in n2's memory: read, decided, CASed"
        assert entry.execution is not None and entry.execution.state is ExecState.SUCCEEDED
        assert [a.disposition for a in report.acks] == [wpb.RESULT_DISPOSITION_RECORDED]
        p = env.node.planners[partition_for("hold3", COORD.partitions)]
        async with asyncio.timeout(5):
            while p.pending.get(e.id) is not None:
                await asyncio.sleep(0.05)
        assert env.node.restarts == 0
        async with asyncio.timeout(5):
            while await env.notices():
                await asyncio.sleep(0.05)
    finally:
        await stop_env(env)


async def test_a_noticed_run_whose_schedule_the_owner_has_not_seen_yet_still_runs(env: Env) -> None:
    """Schedules and notices come on separate watch streams: the owner may see a trigger's notice
    before the schedule's creation. It reads the schedule instead of skipping the run as deleted."""
    await env.create("s1")
    await env.owned()
    p = env.node.planners[partition_for("s1", COORD.partitions)]
    async with asyncio.timeout(5):
        while "s1" not in p.schedules:
            await asyncio.sleep(0.05)
    p.schedules.pop("s1")  # as if the schedule's watch event were still on its way
    e = await env.ops.trigger("s1", None, None)
    done = await env.finished(e.id)
    assert (done.state, done.skip_reason) == (ExecState.SUCCEEDED, "")


async def test_a_cancel_reaches_a_worker_reattached_to_a_node_that_does_not_own_the_partition(
        kv: EtcdClient, key_prefix: str) -> None:
    """After a handover a worker may hold its attempt on a stream to a node that is not the owner. That
    node sees the cancel notice too (it carries the attempt) and tells the worker to stop."""
    import grpc

    from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
    from scheduler._gen.scheduler.v1 import worker_service_pb2_grpc as wgrpc
    from scheduler.execution import dispatch

    ks = Keyspace(key_prefix.rstrip("/"))
    node = PlannerNode(kv, ks, replace(COORD, node_id="n2"), SYSTEM_CLOCK, planner=FAST)  # owns nothing
    server, port = await start_server(node.make_dispatcher(), "127.0.0.1", 0)
    watcher = asyncio.create_task(node._watch_notices())
    ops = Operations(kv, ks, COORD.partitions, node.store, node.ledger, SYSTEM_CLOCK, rpc_timeout=1.0)
    now = SYSTEM_CLOCK.wall_ms()
    e = Execution(id=execution_id("s1", now), schedule_id="s1", tenant="t", pool="pool", task_type="t",
                  planned_ms=now, due_ms=now, trigger=Trigger.SCHEDULED, retry=RetryPolicy(), timeout_ms=60_000)
    e = dispatch(e, worker="w1", planner="n1", token=FencingToken(0, 1), now_ms=now)  # by an owner that is gone
    await kv.txn([], [node.ledger.create_op(e)])
    outbox: asyncio.Queue[wpb.WorkerMessage] = asyncio.Queue()

    async def requests() -> AsyncIterator[wpb.WorkerMessage]:
        yield wpb.WorkerMessage(hello=wpb.Hello(worker_id="w1", pool="pool", region="default", capacity=1,
                                                task_types=["t"],
                                                running=[wpb.RunningAttempt(execution_id=e.id, attempt=1)],
                                                capabilities=CAPABILITIES))
        while True:
            yield await outbox.get()

    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            call = wgrpc.WorkerServiceStub(ch).Connect(requests())
            async with asyncio.timeout(10):
                while (msg := await call.read()).WhichOneof("body") != "reattached":
                    pass
                assert [a.execution_id for a in msg.reattached.accepted] == [e.id]
                await asyncio.sleep(0.2)  # the notice watch is established
                await ops.cancel_execution(e.id, "stop it")
                while (msg := await call.read()).WhichOneof("body") != "cancel":
                    pass
            assert (msg.cancel.execution_id, msg.cancel.attempt, msg.cancel.message) == (e.id, 1, "stop it")
            call.cancel()
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        await server.stop(None)
