"""The worker's half of the heartbeat lease, over real gRPC: an attempt whose origin planner stream has
been gone for longer than the Welcome's heartbeat timeout, and that no planner re-attached, is stopped and
reported TIMEOUT; one that another planner re-attached keeps running. (Fake planners: heartbeat timeout
5 x 0.05 s.)"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from scheduler._gen.scheduler.v1 import execution_pb2 as epb
from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler.worker import ExecutionContext
from scheduler.worker.attempt import ORPHANED_MESSAGE
from tests.worker.conftest import WorkerFactory
from tests.worker.fake_planner import FakePlanner, assignment


async def _two_planners(planners: Callable[..., Any], make_worker: WorkerFactory,
                        handler: Callable[[ExecutionContext, bytes], Any]) -> tuple[FakePlanner, FakePlanner, Any]:
    a: FakePlanner = await planners(planner_id="p-a")
    b: FakePlanner = await planners(planner_id="p-b")
    w = make_worker([a.address, b.address], cancel_grace=0.2)
    w.task("t")(handler)
    await w.start()
    for p in (a, b):
        conn = await p.conn()
        await p.wait_for(lambda conn=conn: conn.credits >= 1, what="credits")  # type: ignore[misc]
    return a, b, w


async def test_attempt_of_a_lost_planner_is_stopped_and_reported_timeout(
    planners: Callable[..., Any], make_worker: WorkerFactory
) -> None:
    stopped: list[str] = []

    async def handler(ctx: ExecutionContext, payload: bytes) -> None:
        await ctx.cancel_event.wait()  # runs until told to stop
        stopped.append(ctx.cancel_reason)

    a, b, w = await _two_planners(planners, make_worker, handler)
    x = assignment(1, timeout=120.0)  # its own timeout is far away: only the lost stream can stop it
    a.conns[0].assign(x)
    await a.wait_for(lambda: len(w.running) == 1, what="attempt running")
    await a.stop()  # the origin planner is gone for good; p-b never re-attaches it
    await b.wait_for(lambda: b.results, timeout=5.0, what="the stopped attempt's result on the other stream")
    r = b.results[0]
    assert (r.execution_id, r.attempt) == (x.execution_id, 1)
    assert r.outcome == epb.ATTEMPT_OUTCOME_FAILED and r.error_class == epb.ERROR_CLASS_TIMEOUT, r
    assert r.message == ORPHANED_MESSAGE
    assert stopped == ["origin planner unreachable"], "the handler saw the stop (cooperative cancel)"


async def test_attempt_reattached_by_another_planner_keeps_running(
    planners: Callable[..., Any], make_worker: WorkerFactory
) -> None:
    release = asyncio.Event()

    async def handler(ctx: ExecutionContext, payload: bytes) -> None:
        await release.wait()

    a, b, w = await _two_planners(planners, make_worker, handler)
    x = assignment(1, timeout=120.0)
    a.conns[0].assign(x)
    await a.wait_for(lambda: len(w.running) == 1, what="attempt running")
    # p-b took over the partition: it answers a heartbeat listing the attempt with Reattached.
    b.conns[0].send(wpb.PlannerMessage(reattached=wpb.Reattached(
        accepted=[wpb.AttemptRef(execution_id=x.execution_id, attempt=1)])))
    await b.wait_for(lambda: w.running[0].origin == b.address, what="origin moved to p-b")
    await a.stop()
    await asyncio.sleep(1.0)  # four heartbeat timeouts of p-a's stream being gone
    assert len(w.running) == 1 and w.running[0].stop is None, "a re-attached attempt is not orphaned"
    release.set()
    await b.wait_for(lambda: b.results, what="its result on p-b")
    assert b.results[0].outcome == epb.ATTEMPT_OUTCOME_SUCCEEDED


async def test_origin_stream_back_within_the_timeout_keeps_the_attempt(
    planner: FakePlanner, make_worker: WorkerFactory
) -> None:
    release = asyncio.Event()
    w = make_worker([planner.address])

    @w.task("t")
    async def handler(ctx: ExecutionContext, payload: bytes) -> None:
        await release.wait()

    await w.start()
    first = await planner.conn()
    await planner.wait_for(lambda: first.credits >= 1, what="credits")
    x = assignment(1, timeout=120.0)
    planner.reattach = lambda running: wpb.Reattached(accepted=[wpb.AttemptRef(execution_id=r.execution_id,
                                                                               attempt=r.attempt) for r in running])
    first.assign(x)
    await planner.wait_for(lambda: len(w.running) == 1, what="attempt running")
    first.abort()  # a blip: the worker re-dials at once and re-attaches it in its Hello
    second = await planner.conn(2)
    await asyncio.sleep(1.0)
    assert len(w.running) == 1 and w.running[0].stop is None
    release.set()
    await planner.wait_for(lambda: second.results, what="result on the new stream")
    assert second.results[0].outcome == epb.ATTEMPT_OUTCOME_SUCCEEDED
