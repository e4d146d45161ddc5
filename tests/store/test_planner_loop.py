"""The per-partition planner loop against a real etcd, in one process, with a fake dispatcher."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

import pytest

from chaos.infra.etcd import EtcdCluster
from scheduler._gen.scheduler.v1 import execution_pb2 as epb
from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler.clock import SYSTEM_CLOCK
from scheduler.config import CoordinationSettings
from scheduler.dispatch.results import record_result
from scheduler.dispatch.starts import StartRecorder
from scheduler.execution import Attempt, ErrorClass, ExecState, Execution, Trigger
from scheduler.ids import ExecutionId, FencingToken, execution_id
from scheduler.model import Policies, RetryPolicy, Schedule, ScheduleState
from scheduler.node import PlannerNode
from scheduler.planner.settings import PlannerSettings
from scheduler.store.checkpoint import Checkpoint
from scheduler.store.codec import encode_execution
from scheduler.store.etcd import EtcdClient
from scheduler.store.keyspace import Keyspace
from scheduler.timeplan import MissedRuns, Overlap, SkipReason

pytestmark = pytest.mark.etcd

COORD = CoordinationSettings(node_id="n1", lease_ttl=2, renew_interval=0.5, rpc_timeout=0.5, safety_margin=0.3,
                             partitions=4)
# The fake dispatcher below stands for workers that start what they get at once but confirms no starts
# (Started/StartAck): a start-by that never passes keeps its dispatches from being re-dispatched.
FAST = PlannerSettings(lookahead_ms=500, loop_interval=0.05, late_grace_ms=1_000, start_timeout_ms=60_000,
                       overlap_settle_ms=500)


class FakeDispatcher:
    """Completes every execution at once through the real result path, unless told to hold them."""

    def __init__(self, kv: EtcdClient, node: PlannerNode | None = None, outcome: str = "ok",
                 fail: frozenset[str] = frozenset()) -> None:
        self.kv, self.node, self.outcome, self.fail = kv, node, outcome, fail
        self.submitted: list[Execution] = []
        self.cancelled: list[str] = []
        self.disarmed: list[str] = []
        self.held_started: set[tuple[str, int]] = set()  # held attempts whose start was recorded
        self.tasks: set[asyncio.Task[None]] = set()

    def capacity(self, pool: str) -> int:
        return 1000

    def served(self, pool: str) -> bool:
        return True

    def reserve(self, pool: str, n: int) -> None:
        return None

    def release(self, pool: str, n: int) -> None:
        return None

    def expect(self, attempts: Sequence[tuple[str, int]]) -> None:
        return None

    def submit(self, e: Execution, payload: bytes, token: FencingToken) -> None:
        self.submitted.append(e)
        t = asyncio.create_task(self._run(e))
        self.tasks.add(t)
        t.add_done_callback(self.tasks.discard)

    async def _run(self, e: Execution) -> None:
        """`hold`: a worker took it, started it and is never heard of again; `lost`: the assignment never
        reached a worker (no start, no result)."""
        if self.outcome == "hold":
            if await start_as_worker(self.kv, self.node, e):
                self.held_started.add((e.id, e.attempt))
        elif self.outcome != "lost":
            await self._finish(e)

    def disarm(self, e: Execution) -> None:
        self.disarmed.append(e.schedule_id)

    def may_arm(self, pool: str) -> bool:
        return True

    async def _record_not_started(self, e: Execution) -> None:
        """As a worker that drops an armed attempt: its not-started report through the real result path."""
        assert self.node is not None
        new, _ = await record_result(self.kv, self.node.ledger, e.schedule_id, e.planned_ms, e.attempt,
                                     succeeded=False, error_class=ErrorClass.TRANSIENT, message="not started: disarmed",
                                     now_ms=SYSTEM_CLOCK.wall_ms(), payload_of=self.node.payload_of, not_started=True,
                                     worker="w")
        p = self.node.planners.get(self.node.store.partition(e.schedule_id))
        if p is not None:
            p.record_transition(new)

    def cancel(self, e: Execution, reason: str) -> None:
        self.cancelled.append(e.id)
        if self.outcome == "hold" and (e.id, e.attempt) in self.held_started:
            # A held run's worker stops it on the Cancel and says so (a worker that never answers is `lost`).
            t = asyncio.create_task(self._stopped(e))
            self.tasks.add(t)
            t.add_done_callback(self.tasks.discard)

    async def _stopped(self, e: Execution) -> None:
        assert self.node is not None
        new, _ = await record_result(self.kv, self.node.ledger, e.schedule_id, e.planned_ms, e.attempt,
                                     succeeded=False, error_class=None, message="cancelled",
                                     now_ms=SYSTEM_CLOCK.wall_ms(), cancelled=True)
        p = self.node.planners.get(self.node.store.partition(e.schedule_id))
        if p is not None:
            p.record_transition(new)

    async def _finish(self, e: Execution) -> None:
        """As a worker: the start asked for and recorded first (a reserved attempt is handed out unwritten: its
        start is its first write), then the outcome."""
        if not await start_as_worker(self.kv, self.node, e):
            return
        ok = self.outcome == "ok" and e.schedule_id not in self.fail
        await self._record(e, None if ok else ErrorClass.PERMANENT, SYSTEM_CLOCK.wall_ms())

    async def _record(self, e: Execution, error: ErrorClass | None, now_ms: int, retry_after_ms: int = 0) -> None:
        """The attempt's result through the real result path (`error` None: it succeeded)."""
        assert self.node is not None
        new, _ = await record_result(self.kv, self.node.ledger, e.schedule_id, e.planned_ms, e.attempt,
                                     succeeded=error is None, error_class=error, message="", now_ms=now_ms,
                                     retry_after_ms=retry_after_ms, payload_of=self.node.payload_of)
        p = self.node.planners.get(self.node.store.partition(e.schedule_id))
        if p is not None:
            p.record_transition(new)


async def start_as_worker(kv: EtcdClient, node: PlannerNode | None, e: Execution, worker: str = "w") -> bool:
    """A worker's Started for `e`'s attempt through the real StartRecorder of `node`; whether it was STARTED."""
    assert node is not None
    cur = e.current
    assert cur is not None
    rec = StartRecorder(kv=kv, ledger=node.ledger, ks=node.ks, partitions=node.s.partitions, clock=SYSTEM_CLOCK,
                        lookup=node.lookup_pending, on_started=node._on_started,
                        notice_for=node._notice_unless_owned)
    acks: list[wpb.StartAckEntry] = []
    rec.enqueue(worker, [wpb.StartRequest(execution_id=e.id, attempt=e.attempt, fencing_token=epb.FencingToken(
        partition=cur.token.partition, revision=cur.token.revision))], acks.extend)
    async with asyncio.timeout(10):
        while not acks:
            await asyncio.sleep(0.005)
    return acks[0].disposition == wpb.START_DISPOSITION_STARTED


@pytest.fixture
async def kv(etcd_server: EtcdCluster) -> AsyncIterator[EtcdClient]:
    async with EtcdClient(etcd_server.config(timeout=0.5)) as c:
        yield c


async def run_node(node: PlannerNode, seconds: float) -> None:
    t = asyncio.create_task(node.run())
    try:
        await asyncio.sleep(seconds)
    finally:
        t.cancel()
        await asyncio.gather(t, return_exceptions=True)


def sched(i: int, **kw: object) -> Schedule:
    return replace(Schedule(id=f"s{i}", tenant="t", spec="* * * * * *", worker_pool="p", task_type="x"), **kw)  # type: ignore[arg-type]


async def executions(node: PlannerNode, kv: EtcdClient) -> list[Execution]:
    out: list[Execution] = []
    for p in range(COORD.partitions):
        es, _ = await node.ledger.list_partition(kv, p)
        out += es
    return out


async def test_materializes_and_completes_every_second(kv: EtcdClient, key_prefix: str) -> None:
    ks = Keyspace(key_prefix.rstrip("/"))
    node = PlannerNode(kv, ks, COORD, SYSTEM_CLOCK, planner=FAST)
    disp = FakeDispatcher(kv, node)
    node.dispatcher = disp
    t0 = SYSTEM_CLOCK.wall_ms()
    for i in range(10):
        await node.store.create(sched(i), t0)
    await run_node(node, 4.0)
    es = await executions(node, kv)
    done = [e for e in es if e.state is ExecState.SUCCEEDED]
    per_schedule = {e.schedule_id for e in done}
    assert per_schedule == {f"s{i}" for i in range(10)}
    assert len(done) >= 10 * 2, f"only {len(done)} completed"
    ids = [e.id for e in disp.submitted]
    assert len(ids) == len(set(ids)), "an execution was dispatched twice"
    assert all(e.planned_ms > t0 for e in es), "planned times before creation are never owed"
    assert node.restarts == 0, "steady state must not need reloads from etcd (stale revisions in memory?)"


async def test_a_run_withdrawn_ahead_and_owed_again_is_read_back_and_runs(kv: EtcdClient, key_prefix: str) -> None:
    """A previous owner wrote a run ahead, then withdrew it at a pause that has since been undone: the
    record at that planned time says SKIPPED (paused), with no attempt. This owner's create of the same
    time finds it there, reads it back and brings it back to scheduled; left as it was, it is a run the
    schedule owed and never ran, with nothing in the ledger to say so but a pause that no longer holds."""
    ks = Keyspace(key_prefix.rstrip("/"))
    node = PlannerNode(kv, ks, COORD, SYSTEM_CLOCK, planner=FAST)
    disp = FakeDispatcher(kv, node)
    node.dispatcher = disp
    now = SYSTEM_CLOCK.wall_ms()
    await node.store.create(sched(1), now)
    t = now - now % 1000 + 2000
    withdrawn = replace(Execution(id=execution_id("s1", t), schedule_id="s1", tenant="t", pool="p", task_type="x",
                                  planned_ms=t, due_ms=t, trigger=Trigger.SCHEDULED, retry=RetryPolicy(),
                                  timeout_ms=60_000), state=ExecState.SKIPPED, skip_reason=SkipReason.PAUSED.value)
    await kv.txn([], node.ledger.create_ops([withdrawn]))
    await run_node(node, 4.0)
    e = next(x for x in await executions(node, kv) if x.id == withdrawn.id)
    assert e.state is ExecState.SUCCEEDED, f"the run owed at {t} stayed {e.state} ({e.skip_reason})"
    assert [x.id for x in disp.submitted].count(withdrawn.id) == 1


async def test_paused_schedule_writes_skips_not_executions(kv: EtcdClient, key_prefix: str) -> None:
    ks = Keyspace(key_prefix.rstrip("/"))
    node = PlannerNode(kv, ks, COORD, SYSTEM_CLOCK, planner=FAST)
    node.dispatcher = FakeDispatcher(kv, node)
    await node.store.create(sched(1, state=ScheduleState.PAUSED), SYSTEM_CLOCK.wall_ms())
    await run_node(node, 2.5)
    assert await executions(node, kv) == []
    p = node.store.partition("s1")
    skips = await kv.range(ks.skips(p, "s1"), prefix=True)
    assert skips.count >= 1
    assert all(b'"paused"' in s.value for s in skips.kvs)


async def test_missed_runs_after_an_outage_follow_the_policy(kv: EtcdClient, key_prefix: str) -> None:
    ks = Keyspace(key_prefix.rstrip("/"))
    node = PlannerNode(kv, ks, COORD, SYSTEM_CLOCK, planner=FAST)
    disp = FakeDispatcher(kv, node, outcome="hold")
    node.dispatcher = disp
    long_ago = SYSTEM_CLOCK.wall_ms() - 60_000  # created a minute ago, nobody planned since
    await node.store.create(sched(1, policies=Policies(missed_runs=MissedRuns.ALL, catchup_cap=5,
                                                        catchup_window_ms=30_000, overlap=Overlap.ALLOW_ALL)),
                            long_ago)
    await node.store.create(sched(2, policies=Policies(missed_runs=MissedRuns.SKIP)), long_ago)
    await run_node(node, 1.5)
    es = await executions(node, kv)
    late1 = [e for e in es if e.schedule_id == "s1" and e.due_ms - e.planned_ms > 900]
    assert len(late1) == 5, "catch-up runs the 5 most recent missed times"
    assert not [e for e in es if e.schedule_id == "s2" and e.due_ms - e.planned_ms > 900]
    reasons = {(kv_.key.split(b"/")[-2], kv_.value) for kv_ in (await kv.range(ks.skips(0), prefix=True)).kvs}
    for p in range(COORD.partitions):
        reasons |= {(kv_.key.split(b"/")[-2], kv_.value) for kv_ in (await kv.range(ks.skips(p), prefix=True)).kvs}
    # Each range says the plan its instants are listed with (ListSkips after a spec change).
    spec = sched(1).spec
    assert (b"s1", json.dumps({"reason": "outside_catchup_window", "spec": spec}, separators=(",", ":")).encode()) \
        in reasons
    assert (b"s1", json.dumps({"reason": "over_cap", "spec": spec}, separators=(",", ":")).encode()) in reasons
    assert (b"s2", json.dumps({"reason": "policy_skip", "spec": spec}, separators=(",", ":")).encode()) in reasons


async def test_overlap_skip_records_instead_of_running(kv: EtcdClient, key_prefix: str) -> None:
    ks = Keyspace(key_prefix.rstrip("/"))
    node = PlannerNode(kv, ks, COORD, SYSTEM_CLOCK, planner=FAST)
    disp = FakeDispatcher(kv, node, outcome="hold")  # the first run never finishes
    node.dispatcher = disp
    await node.store.create(sched(1, policies=Policies(overlap=Overlap.SKIP)), SYSTEM_CLOCK.wall_ms())
    await run_node(node, 4.5)  # the skip waits overlap_settle_ms (0.5 s) and a confirming read
    es = await executions(node, kv)
    assert len(disp.submitted) == 1
    assert sum(1 for e in es if e.state is ExecState.SKIPPED and e.skip_reason == "overlap_skip") >= 1


async def test_permanent_failure_goes_to_dead_letters(kv: EtcdClient, key_prefix: str) -> None:
    ks = Keyspace(key_prefix.rstrip("/"))
    node = PlannerNode(kv, ks, COORD, SYSTEM_CLOCK, planner=FAST)
    node.dispatcher = FakeDispatcher(kv, node, outcome="fail")
    await node.store.create(sched(1, spec="@every 1s", payload=b"keep me"), SYSTEM_CLOCK.wall_ms())
    await run_node(node, 2.0)
    dead = await kv.range(ks.dead_letters(), prefix=True)
    assert dead.count >= 1
    assert b"keep me".hex().encode() in dead.kvs[0].value


async def test_retention_removes_old_terminal_records_but_keeps_dead_letters(kv: EtcdClient, key_prefix: str) -> None:
    ks = Keyspace(key_prefix.rstrip("/"))
    node = PlannerNode(kv, ks, COORD, SYSTEM_CLOCK,
                       planner=replace(FAST, retention_count=3, retention_interval=0.5))
    node.dispatcher = FakeDispatcher(kv, node)
    await node.store.create(sched(1), SYSTEM_CLOCK.wall_ms())
    await node.store.create(sched(2, spec="@every 1s"), SYSTEM_CLOCK.wall_ms())
    node.dispatcher = FakeDispatcher(kv, node, fail=frozenset({"s2"}))
    await run_node(node, 4.0)
    es = await executions(node, kv)
    done = [e for e in es if e.schedule_id == "s1" and e.state is ExecState.SUCCEEDED]
    assert 1 <= len(done) <= 3 + 2, f"{len(done)} terminal records kept for s1, limit 3 (+ those since the sweep)"
    dead = [e for e in es if e.schedule_id == "s2" and e.state is ExecState.DEAD_LETTER]
    assert len(dead) >= 3, "dead letters are never removed by retention"


async def test_pause_withdraws_pre_written_executions(kv: EtcdClient, key_prefix: str) -> None:
    """A pause withdraws what is due at once; runs written ahead are recorded as paused once they come
    due (a resume before then runs them), and none is dispatched after the pause."""
    ks = Keyspace(key_prefix.rstrip("/"))
    node = PlannerNode(kv, ks, COORD, SYSTEM_CLOCK, planner=replace(FAST, lookahead_ms=5_000))
    disp = FakeDispatcher(kv, node)
    node.dispatcher = disp
    st = await node.store.create(sched(1), SYSTEM_CLOCK.wall_ms())
    t = asyncio.create_task(node.run())
    try:
        await asyncio.sleep(1.5)
        ahead = [e for e in await executions(node, kv) if e.state is ExecState.SCHEDULED]
        assert len(ahead) >= 3, "lookahead pre-writes future executions"
        paused_at = SYSTEM_CLOCK.wall_ms()
        await node.store.update(replace(st.schedule, state=ScheduleState.PAUSED), None, paused_at)
        await asyncio.sleep(6.0)  # the lookahead (5 s) has come due
        es = await executions(node, kv)
        assert not [e for e in es if e.state is ExecState.SCHEDULED]
        withdrawn = [e for e in es if e.state is ExecState.SKIPPED and e.skip_reason == "paused"]
        assert len(withdrawn) >= 3
        assert not [e for e in disp.submitted if e.planned_ms > paused_at + 200]
    finally:
        t.cancel()
        await asyncio.gather(t, return_exceptions=True)


async def test_a_lost_attempt_times_out_and_is_retried_with_the_same_id(kv: EtcdClient, key_prefix: str) -> None:
    """A worker that dies mid-execution never reports: the attempt times out at its recorded
    deadline and the next attempt carries the same execution id (the idempotency key)."""
    ks = Keyspace(key_prefix.rstrip("/"))
    node = PlannerNode(kv, ks, COORD, SYSTEM_CLOCK, planner=FAST)
    disp = FakeDispatcher(kv, node, outcome="hold")  # the "worker" takes it and dies
    node.dispatcher = disp
    pol = Policies(execution_timeout_ms=1_000, retry=RetryPolicy(max_attempts=3, initial_backoff_ms=100,
                                                                  max_backoff_ms=200))
    await node.store.create(sched(1, spec="0 0 1 1 *", policies=pol), SYSTEM_CLOCK.wall_ms())
    now = SYSTEM_CLOCK.wall_ms()
    # A manual run due now (the schedule itself fires once a year).
    e = Execution(id=execution_id("s1", now), schedule_id="s1", tenant="t", pool="p", task_type="x",
                  planned_ms=now, due_ms=now, trigger=Trigger.MANUAL, retry=pol.retry, timeout_ms=1_000)
    await kv.txn([], node.ledger.create_ops([e]))
    await run_node(node, 9.0)
    attempts = [x for x in disp.submitted if x.id == e.id]
    assert [x.attempt for x in attempts][:2] == [1, 2], f"attempts: {[x.attempt for x in attempts]}"
    final = await node.ledger.get(kv, "s1", now)
    assert final is not None
    assert final.attempts[0].error_class is ErrorClass.TIMEOUT


async def test_cancel_other_cancels_the_running_execution(kv: EtcdClient, key_prefix: str) -> None:
    ks = Keyspace(key_prefix.rstrip("/"))
    node = PlannerNode(kv, ks, COORD, SYSTEM_CLOCK, planner=FAST)
    disp = FakeDispatcher(kv, node, outcome="hold")
    node.dispatcher = disp
    await node.store.create(sched(1, policies=Policies(overlap=Overlap.CANCEL_OTHER)), SYSTEM_CLOCK.wall_ms())
    await run_node(node, 3.0)
    es = await executions(node, kv)
    cancelled = [e for e in es if e.state is ExecState.CANCELLED]
    assert len(disp.submitted) >= 2
    assert len(cancelled) >= 1
    # Every cancelled run was told to stop, except perhaps the latest: run_node may stop the node between
    # that round's commit and its stop messages (seen under CPU load; the record is cancelled, so the
    # worker's start would be refused anyway).
    untold = {e.id for e in cancelled} - set(disp.cancelled)
    assert len(untold) <= 1 and untold <= {max(cancelled, key=lambda e: e.planned_ms).id}, (untold, disp.cancelled)
    assert sum(1 for e in es if e.state in (ExecState.DISPATCHED, ExecState.RUNNING)) == 1


async def test_buffer_one_keeps_one_and_skips_the_rest(kv: EtcdClient, key_prefix: str) -> None:
    ks = Keyspace(key_prefix.rstrip("/"))
    node = PlannerNode(kv, ks, COORD, SYSTEM_CLOCK, planner=FAST)
    disp = FakeDispatcher(kv, node, outcome="hold")
    node.dispatcher = disp
    await node.store.create(sched(1, policies=Policies(overlap=Overlap.BUFFER_ONE)), SYSTEM_CLOCK.wall_ms())
    await run_node(node, 5.0)  # the skips wait overlap_settle_ms (0.5 s) and a confirming read
    es = await executions(node, kv)
    assert len(disp.submitted) == 1, "the first one never finishes"
    due = SYSTEM_CLOCK.wall_ms() - 600
    waiting = [e for e in es if e.state is ExecState.SCHEDULED and e.due_ms <= due]
    assert len(waiting) == 1, f"one buffered behind the running one, got {len(waiting)}"
    assert sum(1 for e in es if e.skip_reason == "overlap_skip") >= 1


async def _dead_owners_ledger(kv: EtcdClient, node: PlannerNode, ks: Keyspace, policies: Policies, t0: int,
                              due_ms: int | None, ran: tuple[int, int, int, int], watermark_ms: int) -> None:
    """The ledger a planner killed mid-run leaves for schedule s1 (created just before `t0`): the run at t0
    ran (`ran`: dispatched, started and finished, as offsets from its due time, and how long its handler ran
    by the worker's measure; a result another planner recorded), the runs at t0 + 1 s and t0 + 2 s are
    written and never decided, and the checkpoint stands at `watermark_ms`. `due_ms`: every run's due time
    (a catch-up's creation), or None for their planned times."""
    stored = await node.store.create(sched(1, policies=policies), t0 - 500)
    p = node.store.partition("s1")

    def rec(t: int, **kw: object) -> Execution:
        return replace(Execution(id=execution_id("s1", t), schedule_id="s1", tenant="t", pool="p", task_type="x",
                                 planned_ms=t, due_ms=t if due_ms is None else due_ms, trigger=Trigger.SCHEDULED,
                                 retry=RetryPolicy(), timeout_ms=60_000), **kw)  # type: ignore[arg-type]

    base = t0 if due_ms is None else due_ms
    dispatched, started, finished = (base + x for x in ran[:3])
    attempt = Attempt(1, "w1", "dead", FencingToken(p, 1), dispatched, base + 60_000, started_ms=started,
                      finished_ms=finished, succeeded=True, ran_ms=ran[3])
    for e in (rec(t0, state=ExecState.SUCCEEDED, attempt=1, attempts=(attempt,)), rec(t0 + 1000), rec(t0 + 2000)):
        await kv.put(ks.execution(p, "s1", e.planned_ms), encode_execution(e))
    rev = (await kv.get(ks.execution(p, "s1", t0 + 2000))).mod_revision  # type: ignore[union-attr]
    ck = Checkpoint(p, watermark_ms, 0, "dead", 1, max(rev, stored.schedule.version))
    await kv.put(ks.checkpoint(p), ck.encode())


async def _left_by_a_dead_owner(kv: EtcdClient, node: PlannerNode, ks: Keyspace, overlap: Overlap) -> int:
    """The smoke drill's F1: run R at T0 went out at T0 + 50 ms and ran 2.45 s by its worker's measure, its
    result recorded by another planner after the kill; the runs at T0 + 1 s and T0 + 2 s, written ahead,
    came due while R ran and were never decided. Returns T0."""
    now = SYSTEM_CLOCK.wall_ms()
    # On a second: the schedule plans whole seconds. (It was `now - 2_600 - now % 1000`, on .400: runs of times
    # the spec does not plan, which a claim now withdraws as an earlier spec's runs written ahead.)
    t0 = now - 3_000 - (now % 1000)
    # missed_runs=all: the claim's missed-run policy runs both runs written ahead (they are past the late grace,
    # missed like the times after the watermark: planner/inherited.py), and the overlap rule decides them.
    await _dead_owners_ledger(kv, node, ks, Policies(overlap=overlap, missed_runs=MissedRuns.ALL, catchup_cap=3),
                              t0, None, (50, 60, 2_550, 2_450), t0 + 2000)
    return t0


@pytest.mark.parametrize("overlap", [Overlap.BUFFER_ONE, Overlap.SKIP])
async def test_a_takeover_decides_overlap_on_the_final_record_of_the_run_before(
        kv: EtcdClient, key_prefix: str, overlap: Overlap) -> None:
    # Found by the smoke drill: after a planner kill, the new owner had only the unfinished records, so a
    # buffer_one schedule of 2.5 s runs every second ran every run written ahead one after the other
    # (10.7 s late), where the dead owner would have skipped those R overlapped. The new owner must read
    # R's final record at its claim and decide as the old one would have.
    ks = Keyspace(key_prefix.rstrip("/"))
    node = PlannerNode(kv, ks, COORD, SYSTEM_CLOCK, planner=FAST)
    disp = FakeDispatcher(kv, node, outcome="hold")
    node.dispatcher = disp
    t0 = await _left_by_a_dead_owner(kv, node, ks, overlap)
    await run_node(node, 1.5)
    by_planned = {e.planned_ms - t0: e for e in await executions(node, kv)}
    if overlap is Overlap.BUFFER_ONE:
        # T0 + 1 s is the one run that waited behind R and starts; T0 + 2 s came due while R ran and it
        # waited: skipped, as the dead owner would have.
        assert by_planned[1000].state in (ExecState.DISPATCHED, ExecState.RUNNING), by_planned[1000]
        assert by_planned[2000].skip_reason == "overlap_skip", by_planned[2000]
    else:  # both came due while R ran
        assert by_planned[1000].skip_reason == "overlap_skip", by_planned[1000]
        assert by_planned[2000].skip_reason == "overlap_skip", by_planned[2000]
    assert by_planned[0].state is ExecState.SUCCEEDED


async def test_a_takeover_mid_catch_up_knows_the_catch_up_runs(kv: EtcdClient, key_prefix: str) -> None:
    # Found by the smoke drill: after F5 the planners came back one by one, so a catch-up made by one owner
    # was finished by the next, which did not know its runs were a catch-up (due when created, all at one
    # instant) and judged them as late runs overlapping each other: 1 of 5 ran, the rest overlap_skip.
    ks = Keyspace(key_prefix.rstrip("/"))
    node = PlannerNode(kv, ks, COORD, SYSTEM_CLOCK, planner=FAST)
    disp = FakeDispatcher(kv, node, outcome="hold")
    node.dispatcher = disp
    now = SYSTEM_CLOCK.wall_ms()
    made = now - 2_600  # when the dead owner made the catch-up
    t0 = made - 10_000 - (made % 1000)  # its three missed times, 10 s before
    pol = Policies(overlap=Overlap.SKIP, missed_runs=MissedRuns.ALL, catchup_cap=3)
    await _dead_owners_ledger(kv, node, ks, pol, t0, made, (10, 20, 2_520, 2_500), made - (made % 1000) + 1000)
    await run_node(node, 1.5)
    by_planned = {e.planned_ms - t0: e for e in await executions(node, kv)}
    # the catch-up goes on, in order
    assert by_planned[1000].state in (ExecState.DISPATCHED, ExecState.RUNNING), by_planned[1000]
    assert by_planned[2000].state is ExecState.SCHEDULED, by_planned[2000]
    assert "overlap_skip" not in {by_planned[1000].skip_reason, by_planned[2000].skip_reason}


class SlowDispatcher(FakeDispatcher):
    """Every run takes `hold_s`: longer than its period, so each next run's overlap decision asks for
    confirming reads while results keep landing."""

    def __init__(self, kv: EtcdClient, node: PlannerNode, hold_s: float) -> None:
        super().__init__(kv, node)
        self.hold_s = hold_s

    async def _finish(self, e: Execution) -> None:
        await asyncio.sleep(self.hold_s)
        await super()._finish(e)


def _rounds(node: PlannerNode) -> int:
    return node.status().rounds  # what scheduler_planner_rounds_total exports


async def test_a_confirm_whose_run_has_ended_does_not_spin_the_loop(kv: EtcdClient, key_prefix: str) -> None:
    # Found by the smoke drill: a confirming read asked for in a round whose run's result landed during
    # that round's commit stayed asked for ever (the record had left `pending`, so no read took it), and
    # each round then asked for the next one at once: 2,600 rounds a second on one partition, a core.
    ks = Keyspace(key_prefix.rstrip("/"))
    node = PlannerNode(kv, ks, COORD, SYSTEM_CLOCK, planner=FAST)
    node.dispatcher = SlowDispatcher(kv, node, hold_s=1.2)
    now = SYSTEM_CLOCK.wall_ms()
    for i in range(40):
        await node.store.create(sched(i, policies=Policies(overlap=Overlap.SKIP)), now)
    t = asyncio.create_task(node.run())
    try:
        await asyncio.sleep(1.5)  # claims, loads, first runs
        before, t0 = _rounds(node), SYSTEM_CLOCK.monotonic()
        await asyncio.sleep(4.0)
        rate = (_rounds(node) - before) / (SYSTEM_CLOCK.monotonic() - t0)
        stuck = {p: gone for p, pl in node.planners.items()
                 if (gone := {x for x in pl._confirm if x not in pl.pending})}
    finally:
        t.cancel()
        await asyncio.gather(t, return_exceptions=True)
    # Polling alone is partitions / loop_interval = 80 rounds a second; wakes for results and starts add a
    # few per run (40 schedules, one run a second each at most). A spinning partition adds thousands.
    assert rate < 600, f"{rate:.0f} rounds a second on {COORD.partitions} partitions: a loop spins ({stuck})"


async def test_a_paused_schedule_does_not_spin_the_loop(kv: EtcdClient, key_prefix: str) -> None:
    # Found by the smoke drill: a paused schedule holds its partition's watermark before its next planned
    # time until that time is due, and the loop took "watermark short of the horizon" for "more to plan
    # now": for the whole lookahead before each paused planned time it ran round after round, 4,000 a
    # second for the 15 s every2-001 was paused.
    ks = Keyspace(key_prefix.rstrip("/"))
    node = PlannerNode(kv, ks, COORD, SYSTEM_CLOCK, planner=FAST)
    node.dispatcher = FakeDispatcher(kv, node)
    now = SYSTEM_CLOCK.wall_ms()
    for i in range(4):
        await node.store.create(sched(i, state=ScheduleState.PAUSED), now)
    t = asyncio.create_task(node.run())
    try:
        await asyncio.sleep(1.5)
        before, t0 = _rounds(node), SYSTEM_CLOCK.monotonic()
        await asyncio.sleep(3.0)
        rate = (_rounds(node) - before) / (SYSTEM_CLOCK.monotonic() - t0)
    finally:
        t.cancel()
        await asyncio.gather(t, return_exceptions=True)
    assert rate < 400, f"{rate:.0f} rounds a second on {COORD.partitions} partitions: a loop spins"
    skips = [kv_ for p in range(COORD.partitions) for kv_ in (await kv.range(ks.skips(p), prefix=True)).kvs]
    assert len(skips) >= 4 * 3, "the paused planned times are still recorded as skipped when due"


async def test_a_claim_writes_what_it_settles_before_its_checkpoint_moves(
        kv: EtcdClient, key_prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A game day's silent miss: s1's owner died with the watermark at T0 (a quorum loss) and a pause landed
    before the next claim. The new owner owes the activation the old one knew from T0 up to the pause, and
    settled those planned times at its load, but wrote only its checkpoint (moved to now - late grace) in its
    first write, leaving the runs for its first round; frozen between the two, it lost them, and the next
    owner, resuming from the moved watermark, had nothing left to owe. Here the first round never comes:
    every planned time up to the moved watermark must have a record or a skip already. Fails when the claim
    leaves what it settled for the first round."""
    from scheduler.planner.partition import PartitionPlanner

    hung = asyncio.Event()

    async def never(self: PartitionPlanner, now: int) -> bool:  # frozen after the claim's write
        await hung.wait()
        return False

    monkeypatch.setattr(PartitionPlanner, "step", never)
    ks = Keyspace(key_prefix.rstrip("/"))
    node = PlannerNode(kv, ks, COORD, SYSTEM_CLOCK, planner=FAST)
    node.dispatcher = FakeDispatcher(kv, node, outcome="hold")
    now = SYSTEM_CLOCK.wall_ms()
    t0 = now - 4_000 - now % 1000
    st = await node.store.create(sched(1), t0 - 10_000)
    p = node.store.partition("s1")
    await kv.put(ks.checkpoint(p), Checkpoint(p, t0, 0, "dead", 1, st.schedule.version).encode())
    paused_at = SYSTEM_CLOCK.wall_ms()
    await node.store.update(replace(st.schedule, state=ScheduleState.PAUSED), None, paused_at)
    await run_node(node, 2.0)
    got = await kv.get(ks.checkpoint(p))
    assert got is not None
    from scheduler.store.checkpoint import decode as decode_checkpoint
    watermark = decode_checkpoint(p, got.value, got.mod_revision).watermark_ms
    assert watermark > t0 + 2_000, "the claim moved the checkpoint"
    recorded = {e.planned_ms for e in await executions(node, kv)}
    skips = await kv.range(ks.skips(p), prefix=True)
    ranges = [tuple(int(x) for x in kv_.key.decode().rsplit("/", 1)[1].split("-")) for kv_ in skips.kvs]
    owed = range(t0 + 1000, min(watermark, paused_at) + 1, 1000)
    missing = [t - t0 for t in owed if t not in recorded and not any(a < t <= b for a, b in ranges)]
    assert not missing, f"planned times behind the moved watermark with no record: {missing} (ms after T0)"


class TimedDispatcher(FakeDispatcher):
    """Runs each attempt for `run_s` and records when it ran; the first attempt of the first run fails
    (transient, retried no sooner than `retry_after_ms`)."""

    def __init__(self, kv: EtcdClient, node: PlannerNode, run_s: float, retry_after_ms: int) -> None:
        super().__init__(kv, node)
        self.run_s, self.retry_after_ms = run_s, retry_after_ms
        self.ran: list[tuple[str, int, int, int]] = []  # (execution id, attempt, start, end)

    async def _finish(self, e: Execution) -> None:
        if not await start_as_worker(self.kv, self.node, e):
            return
        start = SYSTEM_CLOCK.wall_ms()
        await asyncio.sleep(self.run_s)
        fail = not self.ran and e.attempt == 1
        end = SYSTEM_CLOCK.wall_ms()
        self.ran.append((e.id, e.attempt, start, end))
        await self._record(e, ErrorClass.TRANSIENT if fail else None, end, self.retry_after_ms if fail else 0)


@pytest.mark.parametrize("overlap", [Overlap.SKIP, Overlap.BUFFER_ALL])
async def test_a_run_due_in_a_retrys_backoff_gap_waits_for_the_retry(
        kv: EtcdClient, key_prefix: str, overlap: Overlap) -> None:
    """Game day gd-s21b (slow-000, skip): a run failed into retry_wait, the next one, due in the backoff gap,
    started, and the retry began beside it. Runs of 0.8 s every second; the first fails at 0.8 s and is retried
    0.6 s later: the run due at 1 s (nothing ran then) must wait for the retry to end, never run beside it,
    and is not skipped for it."""
    ks = Keyspace(key_prefix.rstrip("/"))
    node = PlannerNode(kv, ks, COORD, SYSTEM_CLOCK, planner=FAST)
    disp = TimedDispatcher(kv, node, run_s=0.8, retry_after_ms=600)
    node.dispatcher = disp
    pol = Policies(overlap=overlap, retry=RetryPolicy(max_attempts=3, initial_backoff_ms=100, max_backoff_ms=100))
    await node.store.create(sched(1, policies=pol), SYSTEM_CLOCK.wall_ms())
    await run_node(node, 5.0)
    await asyncio.gather(*disp.tasks, return_exceptions=True)
    ran = sorted(disp.ran, key=lambda r: r[2])
    assert ran and ran[0][1] == 1 and any(eid == ran[0][0] and att == 2 for eid, att, _, _ in ran), ran
    for i, (b, nb, sb, _) in enumerate(ran[1:]):
        a, na, _, ea = max(ran[:i + 1], key=lambda r: r[3])
        assert sb >= ea - 20, f"{b} (attempt {nb}) started at {sb} while {a} (attempt {na}) ran until {ea}"
    first = ExecutionId.parse(ran[0][0]).planned_ms
    gap_run = await node.ledger.get(kv, "s1", first + 1000)
    assert gap_run is not None and gap_run.state is ExecState.SUCCEEDED, gap_run


async def test_start_ahead_a_pause_withdraws_an_armed_run_only_once_its_worker_gave_it_back(
    kv: EtcdClient, key_prefix: str
) -> None:
    """Start ahead: paused while a run waits armed on a worker that has not answered the disarm yet, the record
    stays RUNNING (the worker may begin it at its due time: a skip written over it could be a run that ran and
    was recorded as skipped); once the worker reports it not started, it is recorded as paused."""
    ahead = replace(FAST, lookahead_ms=2_000, start_ahead_ms=1_500)
    ks = Keyspace(key_prefix.rstrip("/"))
    node = PlannerNode(kv, ks, COORD, SYSTEM_CLOCK, planner=ahead)
    disp = FakeDispatcher(kv, node, outcome="hold")  # starts what it gets, answers nothing else
    node.dispatcher = disp
    planned = (SYSTEM_CLOCK.wall_ms() // 1000 + 3) * 1000
    s = sched(1, start_ms=planned, end_ms=planned)
    await node.store.create(s, SYSTEM_CLOCK.wall_ms())
    t = asyncio.create_task(node.run())
    try:
        async with asyncio.timeout(10):
            while (e := await node.ledger.get(kv, s.id, planned)) is None or e.state is not ExecState.RUNNING:
                await asyncio.sleep(0.02)
        assert SYSTEM_CLOCK.wall_ms() < planned - 300, "armed too late for the test"
        st = await node.store.get(s.id)
        await node.store.update(replace(st.schedule, state=ScheduleState.PAUSED), None, SYSTEM_CLOCK.wall_ms())
        async with asyncio.timeout(5):
            while s.id not in disp.disarmed:
                await asyncio.sleep(0.02)
        # Rounds pass, past its due time: the pause's withdrawal has judged it (as paused).
        await asyncio.sleep(max(0.5, (planned + 500 - SYSTEM_CLOCK.wall_ms()) / 1000))
        held = await node.ledger.get(kv, s.id, planned)
        assert held is not None and held.state is ExecState.RUNNING, held
        # The worker gives it back, not started.
        await disp._record_not_started(held)
        async with asyncio.timeout(5):
            while (e := await node.ledger.get(kv, s.id, planned)) is None or e.state is not ExecState.SKIPPED:
                await asyncio.sleep(0.02)
        assert e.skip_reason == "paused" and e.attempts[-1].never_started
    finally:
        t.cancel()
        await asyncio.gather(t, return_exceptions=True)


@pytest.mark.parametrize(("policy", "runs", "reason"), [
    (MissedRuns.SKIP, 0, "policy_skip"),
    (MissedRuns.LATEST, 1, "policy_skip"),
    (MissedRuns.ALL, 2, "over_cap"),  # the cap
])
async def test_runs_written_ahead_past_the_watermark_follow_the_missed_run_policy(
        kv: EtcdClient, key_prefix: str, policy: MissedRuns, runs: int, reason: str) -> None:
    # An outside audit (session 36): a partition's watermark stays behind the runs written ahead while one of its
    # schedules is paused (it holds the watermark before its next planned time until that time is due). After an
    # outage, the runs the dead owner wrote ahead past that watermark were in neither decision: the catch-up
    # decided the times after the watermark and went around their records, and the inherited runs were only those
    # at or before it. Under `missed=skip` they ran 25 s late; under `all` beyond the cap.
    ks = Keyspace(key_prefix.rstrip("/"))
    node = PlannerNode(kv, ks, COORD, SYSTEM_CLOCK, planner=FAST)
    disp = FakeDispatcher(kv, node, outcome="hold")
    node.dispatcher = disp
    now = SYSTEM_CLOCK.wall_ms()
    # The dead owner's watermark, on a second; the catch-up's horizon (late grace 1 s) is past +5.6 s, so that its
    # newest two times (the cap) are newer than the written runs.
    t0 = (now - 6_600) // 1000 * 1000
    stored = await node.store.create(sched(1, policies=Policies(missed_runs=policy, catchup_cap=2)), t0 - 10_000)
    p = node.store.partition("s1")
    for t in (t0 + 1000, t0 + 2000, t0 + 3000):  # written ahead, its first attempt reserved, never handed out
        e = Execution(id=execution_id("s1", t), schedule_id="s1", tenant="t", pool="p", task_type="x", planned_ms=t,
                      due_ms=t, trigger=Trigger.SCHEDULED, retry=RetryPolicy(), timeout_ms=60_000,
                      reserved=FencingToken(p, 1))
        await kv.put(ks.execution(p, "s1", t), encode_execution(e))
    rev = (await kv.get(ks.execution(p, "s1", t0 + 3000))).mod_revision  # type: ignore[union-attr]
    await kv.put(ks.checkpoint(p), Checkpoint(p, t0, 0, "dead", 1, max(rev, stored.schedule.version)).encode())
    await run_node(node, 1.5)
    by_planned = {e.planned_ms - t0: e for e in await executions(node, kv) if e.planned_ms > t0}
    # What runs of the outage is the catch-up's newest (its times follow the written ones), never a written one
    # (`runs`: how many the policy runs of the outage, each newer than the written ones).
    submitted = sorted(e.planned_ms - t0 for e in disp.submitted)
    assert not {1000, 2000, 3000} & set(submitted), f"dispatched {submitted}: " + repr(
        [(t, e.state.value, e.skip_reason) for t, e in sorted(by_planned.items())])
    for t in (1000, 2000, 3000):
        assert by_planned[t].state is ExecState.SKIPPED and by_planned[t].skip_reason == reason, by_planned[t]
