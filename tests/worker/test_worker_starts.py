"""Start confirmation on the worker (docs/workers.md): with an assignment's `start_timeout`, the handler
runs only after the planner answered STARTED; refused, unanswered or late-answered starts never run and
are reported not_started, and their slots come back."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from scheduler._gen.scheduler.v1 import execution_pb2 as epb
from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler.worker import ExecutionContext
from tests.worker.conftest import WorkerFactory
from tests.worker.fake_planner import Conn, FakePlanner, assignment


async def _ready(planner: FakePlanner, credits: int = 1) -> Conn:
    conn = await planner.conn(1)
    await planner.wait_for(lambda: conn.credits >= credits, what=f"{credits} credits")
    return conn


def _starts(conn: Conn) -> list[wpb.StartRequest]:
    return [r for m in conn.of_kind("started") for r in m.starts]


async def test_the_handler_runs_only_after_the_start_is_acknowledged(
    planner: FakePlanner, make_worker: WorkerFactory
) -> None:
    w = make_worker([planner.address], concurrency=4)
    seen_by_planner: list[int] = []

    @w.task("t")
    async def handler(ctx: ExecutionContext, payload: bytes) -> None:
        seen_by_planner.append(len(_starts(conn)))  # the planner had the request before the handler ran

    await w.start()
    conn = await _ready(planner)
    conn.assign(assignment(1, start_timeout=2.0))
    await planner.wait_for(lambda: len(conn.results) == 1, what="the first result")
    await planner.wait_for(lambda: conn.credits >= 2, what="2 credits")
    batch = [assignment(i, start_timeout=2.0) for i in (2, 3)]
    conn.assign(*batch)
    await planner.wait_for(lambda: len(conn.results) == 3, what="three results")
    assert len(conn.of_kind("started")) == 2, "the starts of one Assignments message share one Started message"
    assert [(r.execution_id, r.attempt) for r in _starts(conn)[1:]] == [(a.execution_id, 1) for a in batch]
    assert _starts(conn)[0].fencing_token.revision == 4242
    assert seen_by_planner == [1, 3, 3]
    assert all(r.outcome == epb.ATTEMPT_OUTCOME_SUCCEEDED and not r.not_started for r in conn.results)


@pytest.mark.parametrize("answer", [wpb.START_DISPOSITION_REFUSED, wpb.START_DISPOSITION_UNKNOWN],
                         ids=["refused", "unknown-and-nobody-else-to-ask"])
async def test_a_refused_start_never_runs_and_is_reported_not_started(
    planner: FakePlanner, make_worker: WorkerFactory, answer: wpb.StartDisposition
) -> None:
    """REFUSED; or UNKNOWN with no other planner connected to ask (asked once: nobody else)."""
    w = make_worker([planner.address])
    ran: list[str] = []

    @w.task("t")
    async def handler(ctx: ExecutionContext, payload: bytes) -> None:
        ran.append(ctx.execution_id)

    planner.start_answer = lambda r, c: answer
    await w.start()
    conn = await _ready(planner)
    conn.assign(assignment(1, start_timeout=2.0))
    await planner.wait_for(lambda: conn.results, what="a result")
    r = conn.results[0]
    assert r.not_started and r.outcome == epb.ATTEMPT_OUTCOME_FAILED and r.error_class == epb.ERROR_CLASS_TRANSIENT
    assert r.message == "not started: start refused: refused by the test", r.message
    assert not ran and len(_starts(conn)) == 1
    await planner.wait_for(lambda: conn.credits >= 1, what="the slot granted again")


async def test_an_unanswered_start_is_dropped_after_the_start_timeout_and_a_late_ack_is_ignored(
    planner: FakePlanner, make_worker: WorkerFactory
) -> None:
    w = make_worker([planner.address])
    ran: list[str] = []

    @w.task("t")
    async def handler(ctx: ExecutionContext, payload: bytes) -> None:
        ran.append(ctx.execution_id)

    planner.start_answer = lambda r, c: None  # a frozen planner: no answer
    await w.start()
    conn = await _ready(planner)
    a = assignment(1, start_timeout=0.3)
    t0 = asyncio.get_running_loop().time()
    conn.assign(a)
    await planner.wait_for(lambda: conn.results, what="a result")
    waited = asyncio.get_running_loop().time() - t0
    r = conn.results[0]
    assert r.not_started, r
    assert "no start acknowledgement within start_timeout (0.3 s after receipt)" in r.message, r.message
    assert 0.25 <= waited < 1.5, waited
    conn.send(wpb.PlannerMessage(start_ack=wpb.StartAck(acks=[wpb.StartAckEntry(
        execution_id=a.execution_id, attempt=1, disposition=wpb.START_DISPOSITION_STARTED)])))
    await asyncio.sleep(0.3)
    assert not ran and not w.attempts_held, "a STARTED after the worker gave up is ignored"


async def test_without_start_timeout_an_older_planners_assignment_runs_at_once(
    planner: FakePlanner, make_worker: WorkerFactory
) -> None:
    w = make_worker([planner.address])

    @w.task("t")
    async def handler(ctx: ExecutionContext, payload: bytes) -> None:
        return None

    await w.start()
    conn = await _ready(planner)
    conn.assign(assignment(1))
    await planner.wait_for(lambda: conn.results, what="a result")
    assert not conn.of_kind("started") and conn.results[0].outcome == epb.ATTEMPT_OUTCOME_SUCCEEDED


async def test_a_start_whose_outcome_its_planner_does_not_know_is_asked_of_another_planner(
    planners: Callable[..., Any], make_worker: WorkerFactory
) -> None:
    """UNKNOWN (etcd did not answer the owner, which may have recorded the start): the same request goes to
    another connected planner, whose STARTED runs the handler (half game day gd-s20b: an owner behind a flaky
    link refused 17 starts it had recorded; they waited 7 s for a second attempt)."""
    a_side: FakePlanner = await planners(planner_id="planner-a")
    b_side: FakePlanner = await planners(planner_id="planner-b")
    a_side.start_answer = lambda r, c: wpb.START_DISPOSITION_UNKNOWN
    b_side.start_answer = lambda r, c: wpb.START_DISPOSITION_STARTED
    w = make_worker([a_side.address, b_side.address])
    ran: list[str] = []

    @w.task("t")
    async def handler(ctx: ExecutionContext, payload: bytes) -> None:
        ran.append(ctx.execution_id)

    await w.start()
    conn = await _ready(a_side)
    await _ready(b_side)
    job = assignment(1, start_timeout=2.0)
    conn.assign(job)
    b_conn = await b_side.conn(1)
    # The result goes to the planner that could reach etcd first, too (the origin could not).
    await b_side.wait_for(lambda: b_conn.results, what="the result")
    assert [(r.execution_id, r.attempt) for r in _starts(b_conn)] == [(job.execution_id, 1)]
    assert ran == [job.execution_id]
    assert b_conn.results[0].outcome == epb.ATTEMPT_OUTCOME_SUCCEEDED and not b_conn.results[0].not_started
    assert w.starts.asked_again == 1 and not conn.results

