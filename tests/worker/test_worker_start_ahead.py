"""Start ahead on the worker (docs/workers.md, "Start ahead"): an assignment with `start_in` asks for its start
at once and, confirmed, runs its handler only that long after receipt, and only if by then no Disarm or Cancel
came and the stream it came on is still open; while it waits it is listed in heartbeats, and its execution
timeout counts from its instant."""

from __future__ import annotations

import asyncio
import time

from scheduler._gen.scheduler.v1 import execution_pb2 as epb
from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler.worker import ExecutionContext
from tests.worker.conftest import WorkerFactory
from tests.worker.fake_planner import Conn, FakePlanner, assignment


async def _ready(planner: FakePlanner, credits: int = 1) -> Conn:
    conn = await planner.conn(1)
    await planner.wait_for(lambda: conn.credits >= credits, what=f"{credits} credits")
    return conn


async def _recording_worker(planner: FakePlanner, make_worker: WorkerFactory) -> tuple[Conn, list[str]]:
    """A started worker whose handler notes the ids it ran, and its stream once it has a credit."""
    w = make_worker([planner.address])
    ran: list[str] = []

    @w.task("t")
    async def handler(ctx: ExecutionContext, payload: bytes) -> None:
        ran.append(ctx.execution_id)

    await w.start()
    return await _ready(planner), ran


async def _armed(planner: FakePlanner, conn: Conn) -> wpb.Assignment:
    """An assignment due 1 s after receipt, sent and held armed (listed in a heartbeat)."""
    a = assignment(1, start_timeout=2.0, start_in=1.0)
    conn.assign(a)
    await planner.wait_for(lambda: any(h.running for h in conn.of_kind("heartbeat")), what="armed")
    return a


def _disarm(conn: Conn, a: wpb.Assignment) -> None:
    conn.send(wpb.PlannerMessage(disarm=wpb.Disarm(
        attempts=[wpb.AttemptRef(execution_id=a.execution_id, attempt=a.attempt)])))


async def test_an_armed_run_asks_for_its_start_at_once_and_runs_at_its_instant(
    planner: FakePlanner, make_worker: WorkerFactory
) -> None:
    w = make_worker([planner.address])
    began: list[float] = []

    @w.task("t")
    async def handler(ctx: ExecutionContext, payload: bytes) -> None:
        began.append(time.monotonic())
        await asyncio.sleep(0.1)  # within its 0.3 s timeout, counted from the instant (not from receipt)

    await w.start()
    conn = await _ready(planner)
    sent = time.monotonic()
    conn.assign(assignment(1, start_timeout=2.0, start_in=0.6, timeout=0.3))
    await planner.wait_for(lambda: conn.of_kind("started"), what="the start request")
    assert time.monotonic() - sent < 0.4, "the start is asked for at once, not at the instant"
    # Listed as held while it waits (its start is recorded for this worker).
    await planner.wait_for(lambda: any(h.running for h in conn.of_kind("heartbeat")), what="a heartbeat listing it")
    assert not began
    await planner.wait_for(lambda: conn.results, what="the result")
    assert began and began[0] - sent >= 0.6, began[0] - sent
    r = conn.results[0]
    # Its 0.3 s timeout counted from the instant, not from receipt: it did not time out while it waited.
    assert r.outcome == epb.ATTEMPT_OUTCOME_SUCCEEDED and not r.not_started, r


async def test_a_disarmed_run_never_runs_and_is_reported_not_started(
    planner: FakePlanner, make_worker: WorkerFactory
) -> None:
    conn, ran = await _recording_worker(planner, make_worker)
    a = await _armed(planner, conn)
    _disarm(conn, a)
    await planner.wait_for(lambda: conn.results, what="the not-started report", timeout=0.8)
    r = conn.results[0]
    assert r.not_started and r.outcome == epb.ATTEMPT_OUTCOME_FAILED, r
    assert "disarmed" in r.message, r.message
    await asyncio.sleep(0.4)
    assert not ran
    await planner.wait_for(lambda: conn.credits >= 1, what="the slot granted again")


async def test_a_disarm_after_the_handler_began_changes_nothing(
    planner: FakePlanner, make_worker: WorkerFactory
) -> None:
    w = make_worker([planner.address])
    release = asyncio.Event()
    began = asyncio.Event()

    @w.task("t")
    async def handler(ctx: ExecutionContext, payload: bytes) -> None:
        began.set()
        await release.wait()

    await w.start()
    conn = await _ready(planner)
    a = assignment(1, start_timeout=2.0, start_in=0.2)
    conn.assign(a)
    await asyncio.wait_for(began.wait(), 3)
    _disarm(conn, a)
    await asyncio.sleep(0.2)
    release.set()
    await planner.wait_for(lambda: conn.results, what="the result")
    assert conn.results[0].outcome == epb.ATTEMPT_OUTCOME_SUCCEEDED and not conn.results[0].not_started


async def test_a_cancel_of_an_armed_run_stops_it_before_it_ran(
    planner: FakePlanner, make_worker: WorkerFactory
) -> None:
    conn, ran = await _recording_worker(planner, make_worker)
    a = await _armed(planner, conn)
    conn.cancel(a)
    await planner.wait_for(lambda: conn.results, what="the cancelled result", timeout=0.8)
    assert conn.results[0].outcome == epb.ATTEMPT_OUTCOME_CANCELLED
    await asyncio.sleep(0.4)
    assert not ran


async def test_an_armed_run_whose_stream_broke_never_runs(
    planner: FakePlanner, make_worker: WorkerFactory
) -> None:
    """Nobody could disarm it any more (a pause would not reach it): not started, reported on the next stream."""
    conn, ran = await _recording_worker(planner, make_worker)
    conn.assign(assignment(1, start_timeout=2.0, start_in=0.8))
    await planner.wait_for(lambda: any(h.running for h in conn.of_kind("heartbeat")), what="armed")
    conn.abort()
    await planner.wait_for(lambda: planner.results, what="the not-started report (on the stream reopened)")
    r = planner.results[0]
    assert r.not_started and "stream" in r.message, r.message
    await asyncio.sleep(1.0)
    assert not ran
