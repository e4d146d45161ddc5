"""Start confirmation over a real socket, raw protocol clients and a real etcd (docs/workers.md, "Start
confirmation"): a dispatch that no worker starts is dispatched again, same execution id, within
`start_timeout`, without holding the schedule's later runs; a Started for the superseded attempt is
refused; and under a race between the worker's start and the owner's re-dispatch exactly one runs."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import grpc
import pytest

from chaos.infra.etcd import EtcdCluster
from scheduler._gen.scheduler.v1 import execution_pb2
from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler._gen.scheduler.v1 import worker_service_pb2_grpc as wgrpc
from scheduler.clock import SYSTEM_CLOCK
from scheduler.config import CoordinationSettings
from scheduler.dispatch.service import Dispatcher
from scheduler.dispatch.starts import StartRecorder
from scheduler.execution import UNSTARTED_MESSAGE, ExecState, Execution
from scheduler.model import Policies, RetryPolicy, Schedule
from scheduler.node import PlannerNode
from scheduler.planner.settings import PlannerSettings
from scheduler.server import start_server
from scheduler.store.etcd import EtcdClient
from scheduler.store.etcd.errors import OutcomeUnknown as EtcdOutcomeUnknown
from scheduler.store.etcd.errors import Unavailable
from scheduler.store.keyspace import Keyspace
from scheduler.worker.protocol import CAPABILITIES

pytestmark = pytest.mark.etcd

COORD = CoordinationSettings(node_id="n1", lease_ttl=2, renew_interval=0.5, rpc_timeout=0.5, safety_margin=0.3,
                             partitions=4)
START_TIMEOUT_MS = 600
FAST = PlannerSettings(lookahead_ms=500, loop_interval=0.02, late_grace_ms=1_000, start_timeout_ms=START_TIMEOUT_MS)
POLICIES = Policies(execution_timeout_ms=120_000, retry=RetryPolicy(max_attempts=1))  # no retry budget at all


@pytest.fixture
async def kv(etcd_server: EtcdCluster) -> AsyncIterator[EtcdClient]:
    async with EtcdClient(etcd_server.config(timeout=0.5)) as c:
        yield c


@contextlib.asynccontextmanager
async def planner(kv: EtcdClient, prefix: str, *, reserve: bool = True, start_timeout_ms: int = START_TIMEOUT_MS
                  ) -> AsyncIterator[tuple[PlannerNode, Dispatcher, int]]:
    """`reserve`: the first attempt reserved with the create and handed out unwritten (the default), or every
    dispatch written (docs/keyspace.md, "Reserved first attempt")."""
    node = PlannerNode(kv, Keyspace(prefix), COORD, SYSTEM_CLOCK,
                       planner=replace(FAST, reserve_first_attempt=reserve, start_timeout_ms=start_timeout_ms))
    d = node.make_dispatcher()
    server, port = await start_server(d, "127.0.0.1", 0)
    task = asyncio.create_task(node.run())
    try:
        # Every partition claimed and planned once before the test creates schedules: a schedule created
        # while the node was still claiming was seen once to be missed by its partition planner.
        async with asyncio.timeout(15):
            while len(node.planners) < COORD.partitions or any(p.stats.rounds == 0 for p in node.planners.values()):
                await asyncio.sleep(0.05)
        yield node, d, port
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await server.stop(None)


class Client:
    """A raw worker stream; every message is sent when the test says."""

    def __init__(self, port: int, worker_id: str, credits: int = 1) -> None:
        self.ch = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        self.out: asyncio.Queue[wpb.WorkerMessage] = asyncio.Queue()
        self.send(hello=wpb.Hello(worker_id=worker_id, pool="pool", region="default", capacity=credits,
                                  task_types=["x"], capabilities=CAPABILITIES))
        self.send(credits=wpb.Credits(credits=credits))
        self.call: Any = wgrpc.WorkerServiceStub(self.ch).Connect(self._requests())
        self.inbox: dict[str, asyncio.Queue[Any]] = {}
        self.reader = asyncio.create_task(self._read())

    async def _requests(self) -> AsyncIterator[wpb.WorkerMessage]:
        while True:
            yield await self.out.get()

    async def _read(self) -> None:
        """Every message into a queue per kind, so that waiting for one kind loses none of the others."""
        while (msg := await self.call.read()) is not grpc.aio.EOF:  # type: ignore[attr-defined]
            kind = msg.WhichOneof("body")
            self.inbox.setdefault(kind, asyncio.Queue()).put_nowait(getattr(msg, kind))

    def send(self, **body: Any) -> None:
        self.out.put_nowait(wpb.WorkerMessage(**body))

    async def next(self, kind: str, timeout: float = 15) -> Any:
        async with asyncio.timeout(timeout):
            return await self.inbox.setdefault(kind, asyncio.Queue()).get()

    async def close(self) -> None:
        self.reader.cancel()
        self.call.cancel()
        await asyncio.gather(self.reader, return_exceptions=True)
        await self.ch.close(None)


def start_request(a: wpb.Assignment) -> wpb.Started:
    return wpb.Started(starts=[wpb.StartRequest(execution_id=a.execution_id, attempt=a.attempt,
                                                fencing_token=a.fencing_token)])


def ok(a: wpb.Assignment) -> wpb.Results:
    return wpb.Results(results=[wpb.Result(execution_id=a.execution_id, attempt=a.attempt,
                                           fencing_token=a.fencing_token,
                                           outcome=execution_pb2.ATTEMPT_OUTCOME_SUCCEEDED)])


async def one_shot(node: PlannerNode, sid: str) -> int:
    """A schedule whose only planned time is 2 s or less away; returns that time."""
    planned = (SYSTEM_CLOCK.wall_ms() // 1000 + 2) * 1000
    await node.store.create(Schedule(id=sid, tenant="t", spec="* * * * * *", worker_pool="pool", task_type="x",
                                     start_ms=planned, end_ms=planned, policies=POLICIES), SYSTEM_CLOCK.wall_ms())
    return planned


@contextlib.asynccontextmanager
async def first_assignment(port: int) -> AsyncIterator[tuple[Client, wpb.Assignment]]:
    """Worker w1's stream to the planner at `port`, once its first assignment came; closed at the end."""
    w = Client(port, "w1")
    try:
        await w.next("welcome")
        yield w, (await w.next("assignments")).assignments[0]
    finally:
        await w.close()


@contextlib.asynccontextmanager
async def elsewhere(kv: EtcdClient, prefix: str) -> AsyncIterator[Client]:
    """Worker w1's stream to another planner, owning nothing: it reads, decides and CASes what w1 sends."""
    other = PlannerNode(kv, Keyspace(prefix), replace(COORD, node_id="n2"), SYSTEM_CLOCK, planner=FAST)
    server, port = await start_server(other.make_dispatcher(), "127.0.0.1", 0)
    try:
        w = Client(port, "w1")
        try:
            await w.next("welcome")
            yield w
        finally:
            await w.close()
    finally:
        await server.stop(None)


async def start_elsewhere(kv: EtcdClient, prefix: str, a: wpb.Assignment) -> wpb.StartAckEntry:
    """Another planner, owning nothing, serves worker w1's stream and answers its Started for `a`."""
    async with elsewhere(kv, prefix) as w:
        w.send(started=start_request(a))
        ack: wpb.StartAckEntry = (await w.next("start_ack")).acks[0]
        return ack


# What etcd holds for an attempt handed out and not yet started: the record as created with its reserved
# attempt (not written again), or the written dispatch.
BEFORE_START = {True: ExecState.SCHEDULED, False: ExecState.DISPATCHED}
RESERVE = pytest.mark.parametrize("reserve", [True, False], ids=["reserved", "written"])


async def record(node: PlannerNode, kv: EtcdClient, sid: str, planned_ms: int) -> Execution:
    e = await node.ledger.get(kv, sid, planned_ms)
    assert e is not None
    return e


async def test_an_unstarted_dispatch_runs_again_within_the_start_timeout_and_a_late_start_is_refused(
    kv: EtcdClient, key_prefix: str
) -> None:
    async with planner(kv, key_prefix.rstrip("/")) as (node, _d, port):
        first = (SYSTEM_CLOCK.wall_ms() // 1000 + 2) * 1000
        # Every second for four seconds, overlap skip: a stuck first run used to skip all the others.
        await node.store.create(Schedule(id="stuck", tenant="t", spec="* * * * * *", worker_pool="pool",
                                         task_type="x", start_ms=first, end_ms=first + 3_000, policies=POLICIES),
                                SYSTEM_CLOCK.wall_ms())
        sink = Client(port, "sink")  # takes the first assignment and never asks to start it
        good: Client | None = None
        try:
            await sink.next("welcome")
            lost = (await sink.next("assignments")).assignments[0]
            assert lost.HasField("start_timeout") and lost.start_timeout.ToMilliseconds() == START_TIMEOUT_MS
            t0 = SYSTEM_CLOCK.wall_ms()
            good = Client(port, "good", credits=8)
            await good.next("welcome")
            runs: list[wpb.Assignment] = []
            redispatched = -1
            while len(runs) < 4:
                for a in (await good.next("assignments")).assignments:
                    good.send(started=start_request(a))
                    ack = (await good.next("start_ack")).acks[0]
                    assert ack.disposition == wpb.START_DISPOSITION_STARTED, ack
                    runs.append(a)
                    if len(runs) == 1:
                        redispatched = SYSTEM_CLOCK.wall_ms() - t0
                    good.send(results=ok(a))
                    good.send(credits=wpb.Credits(credits=1))
            acked = 0
            while acked < len(runs):
                acked += len((await good.next("result_ack")).acks)
            again = runs[0]
            assert (again.execution_id, again.attempt) == (lost.execution_id, 2), "same id, the next attempt"
            # The superseded attempt's late start: refused (the worker must never run it).
            sink.send(started=start_request(lost))
            late = (await sink.next("start_ack")).acks[0]
            assert late.disposition == wpb.START_DISPOSITION_REFUSED, late
            assert "attempt 2" in late.reason, late
        finally:
            await sink.close()
            if good is not None:
                await good.close()
        execs = (await node.ledger.list_partition(kv, node.store.partition("stuck"), schedule_id="stuck"))[0]
    assert redispatched < START_TIMEOUT_MS + 2_000, f"re-dispatched {redispatched} ms after the lost dispatch"
    assert [e.state for e in execs] == [ExecState.SUCCEEDED] * 4, [(e.id, e.state, e.skip_reason) for e in execs]
    head = execs[0]
    assert head.id == lost.execution_id and head.attempt == 2
    unstarted, ran = head.attempts
    assert unstarted.never_started and unstarted.message == UNSTARTED_MESSAGE and not unstarted.started_ms
    assert ran.succeeded and ran.worker == "good" and ran.started_ms >= ran.dispatched_ms, ran
    assert head.retry.max_attempts == 1, "the unstarted attempt did not use up the retry budget"


@RESERVE
async def test_a_start_is_recorded_running_with_its_worker_and_time(kv: EtcdClient, key_prefix: str,
                                                                    reserve: bool) -> None:
    async with planner(kv, key_prefix.rstrip("/"), reserve=reserve) as (node, _d, port):
        planned = await one_shot(node, "run")
        async with first_assignment(port) as (w, a):
            assert (await record(node, kv, "run", planned)).state is BEFORE_START[reserve]
            w.send(started=start_request(a))
            assert (await w.next("start_ack")).acks[0].disposition == wpb.START_DISPOSITION_STARTED
            e = await record(node, kv, "run", planned)
            await asyncio.sleep(START_TIMEOUT_MS / 1000 * 2)  # past start-by: a RUNNING attempt stays
            assert await record(node, kv, "run", planned) == e
            w.send(results=ok(a))
            assert (await w.next("result_ack")).acks[0].disposition == wpb.RESULT_DISPOSITION_RECORDED
            got = await kv.get(node.ledger.key(e))
    cur = e.current
    assert e.state is ExecState.RUNNING and cur is not None, e
    assert cur.worker == "w1" and cur.dispatched_ms <= cur.started_ms <= SYSTEM_CLOCK.wall_ms(), cur
    # The writes of the run, by etcd's own count of the key's versions: create, start, result (reserved), or
    # create, dispatch, start, result.
    assert got is not None
    assert got.version == (3 if reserve else 4), got.version


async def race(node: PlannerNode, kv: EtcdClient, port: int, n: int, *, run_before_ack: bool) -> dict[str, int]:
    """`n` one-shot schedules; a raw worker asks to start each assignment after a random delay around
    the start timeout, so its start CAS races the owner's re-dispatch. Returns effects per execution id.
    `run_before_ack` is the broken worker that runs the handler on receipt (the protection removed)."""
    # Far enough ahead that every create lands before the planner's lookahead reaches the planned time.
    planned = (SYSTEM_CLOCK.wall_ms() // 1000 + 4) * 1000
    for i in range(n):
        await node.store.create(Schedule(id=f"r{i}", tenant="t", spec="* * * * * *", worker_pool="pool",
                                         task_type="x", start_ms=planned, end_ms=planned, policies=POLICIES),
                                SYSTEM_CLOCK.wall_ms())
    effects: dict[str, int] = {}
    done: set[str] = set()
    w = Client(port, "racer", credits=4 * n)
    rng = random.Random(7)

    async def handle(a: wpb.Assignment) -> None:
        if run_before_ack:
            effects[a.execution_id] = effects.get(a.execution_id, 0) + 1
        await asyncio.sleep(START_TIMEOUT_MS / 1000 * rng.uniform(0.5, 1.5))
        w.send(started=start_request(a))

    tasks: set[asyncio.Task[None]] = set()

    async def assignments() -> None:
        while True:
            for a in (await w.next("assignments", timeout=60)).assignments:
                t = asyncio.create_task(handle(a))
                tasks.add(t)
                t.add_done_callback(tasks.discard)

    def answered(ack: wpb.StartAckEntry) -> None:
        eid, n = ack.execution_id, ack.attempt
        if ack.disposition == wpb.START_DISPOSITION_STARTED:
            if not run_before_ack:
                effects[eid] = effects.get(eid, 0) + 1
            w.send(results=wpb.Results(results=[wpb.Result(execution_id=eid, attempt=n,
                                                           outcome=execution_pb2.ATTEMPT_OUTCOME_SUCCEEDED)]))
            done.add(eid)
        else:  # never run; the SDK reports it not started, which makes it due again at once
            w.send(results=wpb.Results(results=[wpb.Result(
                execution_id=eid, attempt=n, not_started=True, outcome=execution_pb2.ATTEMPT_OUTCOME_FAILED,
                error_class=execution_pb2.ERROR_CLASS_TRANSIENT)]))
        w.send(credits=wpb.Credits(credits=1))

    async def acks() -> None:
        while True:
            for ack in (await w.next("start_ack", timeout=60)).acks:
                answered(ack)

    async def all_succeeded() -> bool:
        for i in range(n):
            e = await node.ledger.get(kv, f"r{i}", planned)
            if e is None or e.state is not ExecState.SUCCEEDED:
                return False
        return True

    try:
        await w.next("welcome")
        tasks.add(asyncio.create_task(assignments()))
        tasks.add(asyncio.create_task(acks()))
        try:
            async with asyncio.timeout(40):
                while not await all_succeeded():
                    await asyncio.sleep(0.2)
        except TimeoutError:
            execs = [await node.ledger.get(kv, f"r{i}", planned) for i in range(n)]
            raise AssertionError(f"not all succeeded: {[e for e in execs if e is None or not e.terminal]}") from None
    finally:
        for t in list(tasks):
            t.cancel()
        await w.close()
    return effects


async def test_the_start_and_the_redispatch_race_and_exactly_one_runs(kv: EtcdClient, key_prefix: str) -> None:
    async with planner(kv, key_prefix.rstrip("/")) as (node, d, port):
        n = 40
        effects = await race(node, kv, port, n, run_before_ack=False)
        execs = [await record(node, kv, f"r{i}", (await node.store.get(f"r{i}")).schedule.start_ms or 0)
                 for i in range(n)]
    assert len(effects) == n and set(effects.values()) == {1}, f"an execution ran twice: {effects}"
    assert all(e.state is ExecState.SUCCEEDED for e in execs), [e for e in execs if e.state is not ExecState.SUCCEEDED]
    raced = [e for e in execs if e.attempt > 1]
    assert raced and len(raced) < n, f"the delays must make both sides win sometimes ({len(raced)}/{n} re-dispatched)"
    assert d.starts.refused > 0, "some late starts lost to the re-dispatch"
    for e in execs:
        ran = [a for a in e.attempts if a.started_ms]
        assert len(ran) == 1 and ran[0].succeeded, e  # one attempt started, the others never did
        assert all(a.never_started for a in e.attempts if a is not ran[0]), e


async def test_the_race_check_catches_a_worker_that_runs_before_its_start_is_acknowledged(
    kv: EtcdClient, key_prefix: str
) -> None:
    """The same race with the protection removed: the check above would fail."""
    async with planner(kv, key_prefix.rstrip("/")) as (node, _d, port):
        effects = await race(node, kv, port, 20, run_before_ack=True)
    assert max(effects.values()) > 1, f"expected a second run of some execution id: {effects}"


@RESERVE
async def test_a_start_of_a_dispatch_by_an_earlier_owner_is_refused(kv: EtcdClient, key_prefix: str,
                                                                    reserve: bool) -> None:
    """The start CAS is fenced by the owner token the attempt was dispatched under (reserved: handed out)."""
    prefix = key_prefix.rstrip("/")
    async with planner(kv, prefix, reserve=reserve) as (node, _d, port):
        planned = await one_shot(node, "moved")
        async with first_assignment(port) as (_w, a):
            pass
    # The owner is gone; its owner key (and lease) with it. Another node serves the stream, owning nothing.
    p = node.store.partition("moved")
    await kv.delete(node.ks.owner(p))
    ack = await start_elsewhere(kv, prefix, a)
    assert ack.disposition == wpb.START_DISPOSITION_REFUSED, ack
    assert (await record(node, kv, "moved", planned)).state is BEFORE_START[reserve]


async def start_through(link: Any, node: PlannerNode, e: Execution, a: wpb.Assignment) -> wpb.StartAckEntry:
    """The owner's answer to worker w1's start of `a`, from its view of the run (`e`: its hand-out, or the
    record), recorded through `link`, a stand-in for its etcd."""
    owner = StartRecorder(kv=link, ledger=node.ledger, ks=node.ks, partitions=COORD.partitions, clock=SYSTEM_CLOCK,
                          lookup=lambda eid: e if eid == e.id else None, on_started=lambda _e: None,
                          notice_for=lambda _s, _p: ())
    acks: list[wpb.StartAckEntry] = []
    owner.enqueue("w1", start_request(a).starts, acks.extend)
    async with asyncio.timeout(5):
        while not acks:
            await asyncio.sleep(0.01)
    return acks[0]


class _LostAnswers:
    """A planner's etcd behind a flaky link: its writes land (or not) but their answers are lost, and its
    reads time out (the half game day gd-s20b: an owner's start CAS landed, its answer and the read-back
    timed out, and it refused 17 starts it had recorded)."""

    def __init__(self, kv: EtcdClient, *, land: bool) -> None:
        self.kv, self.land = kv, land

    async def txn(self, compare: Any, success: Any = (), failure: Any = (), *, timeout: float | None = None) -> Any:
        if self.land:
            await self.kv.txn(compare, success, failure)
        raise EtcdOutcomeUnknown("the answer was lost on the way back")

    async def get(self, *args: Any, **kwargs: Any) -> Any:
        raise Unavailable("etcd did not answer")


@RESERVE
@pytest.mark.parametrize("landed", [True, False], ids=["start-landed", "start-not-landed"])
async def test_a_start_its_planner_cannot_confirm_is_answered_unknown_and_another_planner_answers_for_it(
    kv: EtcdClient, key_prefix: str, landed: bool, reserve: bool
) -> None:
    """UNKNOWN, not REFUSED, when etcd did not answer: the worker asks another planner (worker/starts.py),
    which reads the record and answers STARTED for the start recorded for this worker, or records it."""
    prefix = key_prefix.rstrip("/")
    async with planner(kv, prefix, reserve=reserve) as (node, _d, port):
        planned = await one_shot(node, "gray")
        async with first_assignment(port) as (_w, a):
            e = await record(node, kv, "gray", planned)
            assert e.state is BEFORE_START[reserve]
            e = node.lookup_pending(e.id) or e  # the owner's view: its hand-out (reserved), or the record
            ack = await start_through(_LostAnswers(kv, land=landed), node, e, a)  # the owner behind a flaky link
            assert ack.disposition == wpb.START_DISPOSITION_UNKNOWN, ack
            assert (await record(node, kv, "gray", planned)).state is (
                ExecState.RUNNING if landed else BEFORE_START[reserve])
            ack = await start_elsewhere(kv, prefix, a)  # the worker's second ask
            after = await record(node, kv, "gray", planned)
    assert ack.disposition == wpb.START_DISPOSITION_STARTED, ack
    cur = after.current
    assert after.state is ExecState.RUNNING and cur is not None and cur.worker == "w1" and after.attempt == 1, after


class _HeldWrites:
    """A planner's etcd as the quorum goes: a write is taken and no answer comes (outcome unknown); it commits
    later, when the quorum is back (`land`). Reads time out meanwhile."""

    def __init__(self, kv: EtcdClient) -> None:
        self.kv = kv
        self.held: list[tuple[Any, Any, Any]] = []

    async def txn(self, compare: Any, success: Any = (), failure: Any = (), *, timeout: float | None = None) -> Any:
        self.held.append((compare, success, failure))
        raise EtcdOutcomeUnknown("etcd lost its quorum")

    async def get(self, *args: Any, **kwargs: Any) -> Any:
        raise Unavailable("etcd has no leader")

    async def land(self) -> list[Any]:
        return [await self.kv.txn(c, s, f) for c, s, f in self.held]


async def report_elsewhere(kv: EtcdClient, prefix: str, result: wpb.Result) -> wpb.ResultAckEntry:
    """Another planner, owning nothing, serves worker w1's stream and records its `result` (read, decide, CAS)."""
    async with elsewhere(kv, prefix) as w:
        w.send(results=wpb.Results(results=[result]))
        ack: wpb.ResultAckEntry = (await w.next("result_ack")).acks[0]
        return ack


@RESERVE
@pytest.mark.parametrize("first", ["report", "start"], ids=["report-first", "start-first"])
async def test_a_start_that_lands_after_the_worker_gave_up_cannot_strand_the_run(
    kv: EtcdClient, key_prefix: str, reserve: bool, first: str
) -> None:
    """Game day, session 28 (reserved): an owner's start CAS went out as etcd lost its quorum and committed
    when it came back, after the worker had given up waiting for the answer and reported the attempt not
    started. The report was answered stale (the record, read from etcd, was still as created) and the
    start then made it RUNNING for a worker that had dropped it: the run waited 6-10 s for its new owner to
    find that out. Whichever of the report and the start commits first, the run must be dispatched again at
    once, and the worker's start of attempt 1 must never have been confirmed after its report."""
    prefix = key_prefix.rstrip("/")
    # A long start timeout: the owner must not re-dispatch on its own; only the worker's report may.
    async with planner(kv, prefix, reserve=reserve, start_timeout_ms=60_000) as (node, _d, port):
        planned = await one_shot(node, "quorum")
        async with first_assignment(port) as (w, a):
            e = await record(node, kv, "quorum", planned)
            assert e.state is BEFORE_START[reserve]
            e = node.lookup_pending(e.id) or e  # the owner's view: its hand-out (reserved), or the record
            cut_off = _HeldWrites(kv)
            asked = await start_through(cut_off, node, e, a)  # the owner as etcd loses its quorum
            assert asked.disposition == wpb.START_DISPOSITION_UNKNOWN, asked
            assert len(cut_off.held) == 1
            not_started = wpb.Result(execution_id=a.execution_id, attempt=a.attempt, fencing_token=a.fencing_token,
                                     outcome=execution_pb2.ATTEMPT_OUTCOME_FAILED,
                                     error_class=execution_pb2.ERROR_CLASS_TRANSIENT, not_started=True,
                                     message="not started: no start acknowledgement within start_timeout")
            if first == "start":
                landed = await cut_off.land()
                assert (await record(node, kv, "quorum", planned)).state is ExecState.RUNNING
                ack = await report_elsewhere(kv, prefix, not_started)
            else:
                ack = await report_elsewhere(kv, prefix, not_started)
                landed = await cut_off.land()
            applied = node.ledger.cas_results(landed[0])[0]
            assert ack.disposition == wpb.RESULT_DISPOSITION_RECORDED, ack
            assert applied is (first == "start"), "a start committed after the worker's report must not apply"
            w.send(credits=wpb.Credits(credits=1))
            again = (await w.next("assignments", timeout=10)).assignments[0]
            after = await record(node, kv, "quorum", planned)
    assert (again.execution_id, again.attempt) == (a.execution_id, 2), again
    one = after.attempts[0]
    assert one.attempt == 1 and one.never_started and not one.started_ms, one
    assert after.attempt == 2 and after.state is ExecState.DISPATCHED, after


class _SlowListing:
    """The node's etcd, where the next read of a partition's executions listing is answered late: read at
    once, then held until the test lets it through (a reload whose listing took a while on a loaded node)."""

    def __init__(self, kv: EtcdClient) -> None:
        self._kv = kv
        self.prefix: bytes | None = None  # armed: the listing of this partition is held once
        self.read = asyncio.Event()
        self.release = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kv, name)

    async def range(self, key: Any, **kw: Any) -> Any:
        r = await self._kv.range(key, **kw)
        if self.prefix is not None and key == self.prefix:
            self.prefix = None
            self.read.set()
            await self.release.wait()
        return r


@RESERVE
async def test_a_result_recorded_while_the_partition_reloads_is_not_lost(
    kv: EtcdClient, key_prefix: str, reserve: bool
) -> None:
    """Game day, session 30: a partition restarted (a write's outcome unknown) and reloaded; a run of it
    succeeded meanwhile, recorded by this very node. The load clears its snapshot after reading the ledger
    and fills it from that reading: the result, taken in before, was lost, and the owner held the run as
    still running. Its buffered successor waited 8.3 s, until the worker's heartbeats showed the run gone
    (with overlap skip it would have been skipped as overlapping a run that had ended)."""
    prefix = key_prefix.rstrip("/")
    slow = _SlowListing(kv)
    async with planner(slow, prefix, reserve=reserve) as (node, _d, port):  # type: ignore[arg-type]
        planned = await one_shot(node, "reloaded")
        p = node.store.partition("reloaded")
        async with first_assignment(port) as (w, a):
            w.send(started=start_request(a))
            assert (await w.next("start_ack")).acks[0].disposition == wpb.START_DISPOSITION_STARTED
            assert (await record(node, kv, "reloaded", planned)).state is ExecState.RUNNING
            slow.prefix = node.ks.executions(p)
            node.planners[p].reload = True  # as after a lost watch event: the partition restarts and reloads
            node.planners[p].wake.set()
            async with asyncio.timeout(10):
                await slow.read.wait()  # the new load has read the ledger: the run is RUNNING there
            w.send(results=ok(a))
            ack = (await w.next("result_ack")).acks[0]
            assert ack.disposition == wpb.RESULT_DISPOSITION_RECORDED, ack
            slow.release.set()
            async with asyncio.timeout(10):
                while (planner_now := node.planners.get(p)) is None or planner_now.stats.rounds == 0:
                    await asyncio.sleep(0.02)
            held = node.lookup_pending(a.execution_id)
            assert (await record(node, kv, "reloaded", planned)).state is ExecState.SUCCEEDED
    assert held is None, f"the owner still holds the ended run: {held}"
