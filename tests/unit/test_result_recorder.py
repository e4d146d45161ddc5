"""Recording workers' results (dispatch/results.py) against the in-memory twin: the report says what
became of each result on which path, and the acks are the ones a worker is sent."""

from __future__ import annotations

import asyncio

from scheduler._gen.scheduler.v1 import execution_pb2
from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler.clock import FakeClock
from scheduler.dispatch.results import Recorded, ResultRecorder, ResultReport
from scheduler.execution import ExecState, Execution, Trigger, dispatch, new_execution
from scheduler.ids import FencingToken, execution_id
from scheduler.model import RetryPolicy
from scheduler.store.keyspace import Keyspace
from scheduler.store.ledger import Ledger
from scheduler.store.memory import MemoryKV

SUCCEEDED = execution_pb2.ATTEMPT_OUTCOME_SUCCEEDED
FAILED = execution_pb2.ATTEMPT_OUTCOME_FAILED


class Env:
    def __init__(self) -> None:
        self.kv = MemoryKV()
        self.ledger = Ledger(Keyspace("/t"), 4)
        self.memory: dict[str, Execution] = {}  # the owner's pending index
        self.transitions: list[Execution] = []
        self.batches = 0
        self.rec = ResultRecorder(kv=self.kv, ledger=self.ledger, clock=FakeClock(wall_ms=60_000),
                                  lookup=self.memory.get, on_transition=self.transitions.append,
                                  notice_for=lambda sid, ms: (), payload_of=self.payload_of,
                                  after_batch=self.batch_done)

    async def payload_of(self, sid: str) -> bytes:
        return b"schedule payload"

    def batch_done(self) -> None:
        self.batches += 1

    async def out(self, sid: str, *, max_attempts: int = 3, owned: bool = True) -> Execution:
        """An execution with attempt 1 out on a worker; `owned`: in the owner's memory (the fast path)."""
        planned = 1_000 * (len(self.memory) + 1)
        e = new_execution(id=execution_id(sid, planned), schedule_id=sid, tenant="t", pool="p", task_type="x",
                          planned_ms=planned, due_ms=planned, trigger=Trigger.SCHEDULED,
                          retry=RetryPolicy(max_attempts=max_attempts), timeout_ms=60_000)
        out = dispatch(e, worker="", planner="n1", token=FencingToken(0, 1), now_ms=planned)
        await self.kv.txn([], [self.ledger.create_op(out)])
        stored = await self.ledger.get(self.kv, sid, planned)
        assert stored is not None
        if owned:
            self.memory[stored.id] = stored
        return stored


def res(e: Execution, outcome: int = SUCCEEDED, attempt: int = 1, **kw: object) -> wpb.Result:
    return wpb.Result(execution_id=e.id, attempt=attempt, outcome=outcome, **kw)  # type: ignore[arg-type]


def kinds(report: ResultReport) -> list[tuple[str, Recorded, bool]]:
    return [(x.execution_id.split("@")[0], x.recorded, x.fast) for x in report.entries]


def acks(report: ResultReport) -> list[tuple[str, int]]:
    return [(a.execution_id.split("@")[0], a.disposition) for a in report.acks]


async def test_each_result_is_reported_with_what_became_of_it() -> None:
    env = Env()
    done, retry, dead, elsewhere, stale = (await env.out("done"), await env.out("retry"),
                                           await env.out("dead", max_attempts=1), await env.out("away", owned=False),
                                           await env.out("stale"))
    report = await env.rec.record_now("w1", [
        res(done), res(retry, FAILED, error_class=execution_pb2.ERROR_CLASS_TRANSIENT),
        res(dead, FAILED, error_class=execution_pb2.ERROR_CLASS_PERMANENT), res(elsewhere),
        res(stale, attempt=2), wpb.Result(execution_id=execution_id("ghost", 5_000), attempt=1)])
    assert kinds(report) == [
        ("done", Recorded.FINISHED, True), ("retry", Recorded.RETRY_SCHEDULED, True),  # fast: one txn, no reads
        ("dead", Recorded.DEAD_LETTERED, False),  # dead letters keep the payload: read first
        ("away", Recorded.FINISHED, False),  # not in this node's memory
        ("stale", Recorded.STALE, False), ("ghost", Recorded.UNKNOWN, False)]
    assert acks(report) == [("done", wpb.RESULT_DISPOSITION_RECORDED), ("retry", wpb.RESULT_DISPOSITION_RECORDED),
                            ("dead", wpb.RESULT_DISPOSITION_RECORDED), ("away", wpb.RESULT_DISPOSITION_RECORDED),
                            ("stale", wpb.RESULT_DISPOSITION_STALE)], "an unrecorded result is not acknowledged"
    assert env.rec.results == 5
    assert sorted(e.schedule_id for e in env.transitions) == ["away", "dead", "done", "retry"]
    kept = await env.ledger.get(env.kv, "dead", dead.planned_ms)
    assert kept is not None and kept.state is ExecState.DEAD_LETTER
    cur = kept.current
    assert cur is not None and cur.worker == "w1"
    # The owner's memory still shows `done` in flight: the fast CAS loses, the read finds it recorded.
    again = await env.rec.record_now("w1", [res(done)])
    assert kinds(again) == [("done", Recorded.DUPLICATE, False)]
    assert acks(again) == [("done", wpb.RESULT_DISPOSITION_DUPLICATE)]


async def test_results_of_several_streams_share_a_txn_and_each_stream_gets_its_own_acks() -> None:
    env = Env()
    a, b, c = await env.out("a"), await env.out("b"), await env.out("c")
    got: dict[str, list[ResultReport]] = {"s1": [], "s2": []}
    s1, s2 = object(), object()
    env.rec.enqueue(s1, "w1", [res(a)], got["s1"].append)
    env.rec.enqueue(s2, "w2", [res(b)], got["s2"].append)
    env.rec.enqueue(s1, "w1", [res(c)], got["s1"].append)
    before = env.kv.server.revision
    async with asyncio.timeout(5):
        while env.batches == 0:
            await asyncio.sleep(0.001)
    assert env.kv.server.revision == before + 1, "one txn for the three"
    # A stream's fast-path acks go out with its first message of the batch.
    assert [acks(r) for r in got["s1"]] == [[("a", wpb.RESULT_DISPOSITION_RECORDED),
                                             ("c", wpb.RESULT_DISPOSITION_RECORDED)], []]
    assert [acks(r) for r in got["s2"]] == [[("b", wpb.RESULT_DISPOSITION_RECORDED)]]
    workers = {e.schedule_id: e.current.worker for e in env.transitions if e.current is not None}
    assert workers == {"a": "w1", "b": "w2", "c": "w1"}, "each attempt records the worker that reported it"
