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
from scheduler.worker.worker import orphan_stop
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


async def test_a_planner_gone_silent_is_left_and_the_attempt_stopped_before_it_could_give_it_up(
    planners: Callable[..., Any], make_worker: WorkerFactory
) -> None:
    """The link to the origin planner is cut without TCP noticing (the F13 drill: 10 s until gRPC's keepalive
    did): a planner that acknowledges heartbeats falls silent, the worker ends that stream after the heartbeat
    timeout, as the planner ends a silent worker's, and has the handler stopped before the planner could give the
    attempt up: two heartbeat timeouts after the last heartbeat it acknowledged. Timeout 5 x 0.05 s."""
    stopped: list[float] = []
    loop = asyncio.get_running_loop()

    async def handler(ctx: ExecutionContext, payload: bytes) -> None:
        try:
            await asyncio.sleep(3600)  # ignores the stop: only the cancel of its task ends it
        finally:
            stopped.append(loop.time())

    a: FakePlanner = await planners(planner_id="p-a")
    b: FakePlanner = await planners(planner_id="p-b")
    a.acks = True
    w = make_worker([a.address, b.address], cancel_grace=5.0, keepalive_time=30.0)
    w.task("t")(handler)
    await w.start()
    conn = await a.conn()
    await a.wait_for(lambda: conn.credits >= 1, what="credits")
    x = assignment(1, timeout=120.0)
    conn.assign(x)
    await a.wait_for(lambda: len(w.running) == 1, what="attempt running")
    await a.wait_for(lambda: conn.of_kind("heartbeat") and w.streams[a.address].acked_sent, what="an ack")
    a.mute = True  # the connection stays up; nothing more comes from p-a
    muted = loop.time()
    await b.wait_for(lambda: b.results, timeout=5.0, what="the stopped attempt's result on the other stream")
    stream = w.streams[a.address]
    assert stream.silent_ends >= 1, "the silent stream was ended, not left to gRPC's keepalive (30 s here)"
    # The last acknowledged heartbeat was sent before the cut: the planner gives up 0.5 s after it at the
    # earliest; the handler, which ignores the stop, was cancelled before (its 5 s grace cut short).
    assert stopped and stopped[0] - muted < 2 * 0.25, f"ended {stopped[0] - muted:.2f}s after the cut"
    r = b.results[0]
    assert r.error_class == epb.ERROR_CLASS_TIMEOUT and r.message == ORPHANED_MESSAGE, r


def test_the_stop_of_an_orphan_leaves_its_grace_before_the_planner_can_give_it_up() -> None:
    # Without acknowledgements: the heartbeat timeout after the stream went down, the whole grace (as before).
    assert orphan_stop(100.0, 10.0, None, 5.0, 1.0) == (110.0, 5.0)
    # Defaults (timeout 10 s, grace 5 s), the stream seen silent 10 s after the last acknowledged heartbeat:
    # the planner gives up no sooner than 20 s after it; stopped at 14 s with the whole grace, by 19 s.
    assert orphan_stop(110.0, 10.0, 100.0, 5.0, 1.0) == (114.0, 5.0)
    # A stream that broke at once (a planner restart): the whole timeout to be re-attached, as before.
    assert orphan_stop(100.5, 10.0, 100.0, 5.0, 1.0) == (110.5, 5.0)
    # The drills' timing (3 s, grace 5 s): a grace longer than the timeout is cut to what is left.
    at, grace = orphan_stop(103.0, 3.0, 100.0, 5.0, 1.0)
    assert (at, grace) == (103.5, 1.5) and at + grace <= 100.0 + 2 * 3.0 - 1.0
