"""Cancel, execution timeout, drain, re-attach, discovery and credit reclaim, over real gRPC."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from scheduler._gen.scheduler.v1 import cluster_pb2 as cpb
from scheduler._gen.scheduler.v1 import execution_pb2 as epb
from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler.worker import ExecutionContext
from tests.worker.conftest import WorkerFactory
from tests.worker.fake_planner import Conn, FakePlanner, assignment


async def _ready(planner: FakePlanner, n: int = 1, credits: int = 1) -> Conn:
    conn = await planner.conn(n)
    await planner.wait_for(lambda: conn.credits >= credits, what=f"{credits} credits")
    return conn


async def test_cancel_signals_a_cooperative_handler(planner: FakePlanner, make_worker: WorkerFactory) -> None:
    w = make_worker([planner.address], cancel_grace=5.0)
    observed: list[str] = []

    @w.task("t")
    async def handler(ctx: ExecutionContext, payload: bytes) -> None:
        await ctx.cancel_event.wait()
        observed.append(ctx.cancel_reason)  # cleans up, then returns by itself

    await w.start()
    conn = await _ready(planner)
    a = assignment(1)
    conn.assign(a)
    await planner.wait_for(lambda: w.running)
    conn.cancel(a, wpb.CANCEL_REASON_OVERLAP, "newer run started")
    await planner.wait_for(lambda: conn.results, timeout=2)
    r = conn.results[0]
    assert r.outcome == epb.ATTEMPT_OUTCOME_CANCELLED and r.error_class == epb.ERROR_CLASS_UNSPECIFIED
    assert observed == ["cancelled by the planner (overlap): newer run started"] and r.message == observed[0]


async def test_cancel_stops_a_stuck_handler_after_the_grace(planner: FakePlanner, make_worker: WorkerFactory) -> None:
    w = make_worker([planner.address], cancel_grace=0.1)
    stopped = asyncio.Event()

    @w.task("t")
    async def handler(ctx: ExecutionContext, payload: bytes) -> None:
        try:
            await asyncio.sleep(60)  # ignores ctx.cancelled
        finally:
            stopped.set()

    await w.start()
    conn = await _ready(planner)
    a = assignment(1)
    conn.assign(a)
    await planner.wait_for(lambda: w.running)
    conn.cancel(assignment(1, attempt=2))  # another attempt of the same execution: not ours, ignored
    conn.cancel(a)
    await asyncio.wait_for(stopped.wait(), 2)
    await planner.wait_for(lambda: conn.results)
    assert conn.results[0].outcome == epb.ATTEMPT_OUTCOME_CANCELLED


async def test_execution_timeout_is_reported_as_timeout(planner: FakePlanner, make_worker: WorkerFactory) -> None:
    w = make_worker([planner.address])
    saw_cancel: list[bool] = []

    @w.task("t")
    async def handler(ctx: ExecutionContext, payload: bytes) -> None:
        try:
            await asyncio.sleep(60)
        finally:
            saw_cancel.append(ctx.cancelled)

    await w.start()
    conn = await _ready(planner)
    conn.assign(assignment(1, timeout=0.2))
    r = (await planner.wait_for(lambda: conn.results, timeout=3))[0]
    assert r.outcome == epb.ATTEMPT_OUTCOME_FAILED and r.error_class == epb.ERROR_CLASS_TIMEOUT
    assert "execution timeout (0.2 s)" in r.message
    assert 150 <= r.finished_at.ToMilliseconds() - r.started_at.ToMilliseconds() < 2000
    assert saw_cancel == [True]


async def test_drain_hands_back_unstarted_finishes_running_and_stops_the_rest(
    planner: FakePlanner, make_worker: WorkerFactory
) -> None:
    w = make_worker([planner.address], concurrency=4)
    quick_done = asyncio.Event()

    @w.task("t")
    async def handler(ctx: ExecutionContext, payload: bytes) -> None:
        if payload == b"quick":
            await asyncio.sleep(0.2)
            quick_done.set()
        else:
            await asyncio.sleep(60)

    crossing = assignment(3)
    planner.on_drain = lambda c, d: c.assign(crossing) if c.credits else None  # sent before it saw the Drain

    runner = asyncio.create_task(w.run())
    conn = await _ready(planner)
    quick, slow = assignment(1, payload=b"quick"), assignment(2, payload=b"slow")
    conn.assign(quick)
    await planner.wait_for(lambda: conn.credits >= 1)
    conn.assign(slow)
    await planner.wait_for(lambda: len(w.running) == 2 and conn.credits >= 1)
    await w.drain(grace=0.6, reason="SIGTERM")
    await asyncio.wait_for(runner, 1)  # run() returns once drained

    drains = conn.of_kind("drain")
    assert drains[0].reason == "SIGTERM" and drains[0].grace.ToMilliseconds() == 600
    returned = [(ref.execution_id, ref.attempt) for d in drains for ref in d.returned]
    assert returned == [(crossing.execution_id, 1)], "the assignment that crossed the Drain is handed back"
    by_id = {r.execution_id: r for r in conn.results}
    assert quick_done.is_set() and by_id[quick.execution_id].outcome == epb.ATTEMPT_OUTCOME_SUCCEEDED
    stopped = by_id[slow.execution_id]
    assert (stopped.outcome, stopped.error_class, stopped.message) == (
        epb.ATTEMPT_OUTCOME_FAILED, epb.ERROR_CLASS_TRANSIENT, "worker draining")
    assert crossing.execution_id not in by_id
    assert len(w.outbox) == 0, "drain waited for the acknowledgements"
    assert conn.closed
    assert [m.WhichOneof("body") for m in conn.messages].count("credits") == len(conn.of_kind("credits"))
    after = conn.messages.index(next(m for m in conn.messages if m.WhichOneof("body") == "drain"))
    assert not [m for m in conn.messages[after:] if m.WhichOneof("body") == "credits"], "no credits after Drain"


async def test_reattach_keeps_accepted_and_stops_rejected(planner: FakePlanner, make_worker: WorkerFactory) -> None:
    w = make_worker([planner.address], concurrency=4)
    release = asyncio.Event()
    stopped: list[str] = []

    @w.task("t")
    async def handler(ctx: ExecutionContext, payload: bytes) -> None:
        try:
            await release.wait()
        except asyncio.CancelledError:
            stopped.append(ctx.execution_id)
            raise

    await w.start()
    first = await _ready(planner)
    keep, drop = assignment(1), assignment(2)
    first.assign(keep)
    await planner.wait_for(lambda: first.credits)
    first.assign(drop)
    await planner.wait_for(lambda: len(w.running) == 2)

    hellos: list[list[Any]] = []

    def answer(running: list[wpb.RunningAttempt]) -> wpb.Reattached:
        hellos.append([(r.execution_id, r.attempt, r.fencing_token.revision) for r in running])
        return wpb.Reattached(
            accepted=[wpb.AttemptRef(execution_id=keep.execution_id, attempt=1)],
            rejected=[wpb.RejectedAttempt(execution_id=drop.execution_id, attempt=1, reason="superseded by attempt 2")],
        )

    planner.reattach = answer
    first.abort()  # the planner that dispatched them went away; the new stream re-attaches them
    second = await planner.conn(2)
    await planner.wait_for(lambda: stopped == [drop.execution_id], what="rejected attempt stopped")
    assert sorted(hellos[0]) == sorted([(keep.execution_id, 1, 4242), (drop.execution_id, 1, 4242)])
    release.set()
    await planner.wait_for(lambda: second.results, what="accepted attempt's result")
    await asyncio.sleep(0.1)
    assert [r.execution_id for r in planner.results] == [keep.execution_id], "no result for the rejected attempt"


async def test_discovery_dials_every_planner(planners: Callable[..., Any], make_worker: WorkerFactory) -> None:
    a: FakePlanner = await planners(planner_id="p-a")
    b: FakePlanner = await planners(planner_id="p-b")
    c: FakePlanner = await planners(planner_id="p-c")
    a.others = [b.info]  # only A is configured; A knows B
    b.others = [a.info, c.info]  # ... and B's Welcome names C
    down = cpb.PlannerInfo(node_id="p-d", api_address="127.0.0.1:1", liveness=cpb.PLANNER_LIVENESS_DOWN)
    a.others.append(down)
    w = make_worker([a.address], concurrency=2)

    @w.task("t")
    async def handler(ctx: ExecutionContext, payload: bytes) -> None:
        return None

    await w.start()
    for p in (a, b, c):
        await p.conn()
        assert p.conns[0].hello.worker_id == "w-test"
    await asyncio.sleep(0.2)
    assert "127.0.0.1:1" not in w.streams, "a planner the cluster reports DOWN is not dialled"
    # Two credits, three planners: shared, never more than the concurrency in total.
    assert sum(p.conns[0].credits for p in (a, b, c)) == 2


async def test_same_planner_under_two_addresses_gets_one_stream(
    planner: FakePlanner, make_worker: WorkerFactory
) -> None:
    port = planner.address.rsplit(":", 1)[1]
    planner.others = [cpb.PlannerInfo(node_id=planner.planner_id, api_address=f"localhost:{port}",
                                      liveness=cpb.PLANNER_LIVENESS_ALIVE)]
    w = make_worker([planner.address])
    await w.start()
    await planner.conn()
    await asyncio.sleep(0.5)
    assert len(planner.live) == 1
    assert list(w.streams) == [planner.address]


async def test_idle_planner_credits_are_reclaimed(planners: Callable[..., Any], make_worker: WorkerFactory) -> None:
    a: FakePlanner = await planners(planner_id="p-a")
    b: FakePlanner = await planners(planner_id="p-b")
    w = make_worker([a.address, b.address], concurrency=1, credit_idle_after=0.2)

    @w.task("t")
    async def handler(ctx: ExecutionContext, payload: bytes) -> None:
        return None

    await w.start()
    await a.conn()
    await b.conn()
    await a.wait_for(lambda: a.conns[0].credits + b.conns[0].credits == 1)
    holder, starved = (a, b) if a.conns[0].credits else (b, a)
    # Only the starved planner has work. The one credit sits on the idle planner, so the worker
    # re-opens that stream to get it back, and the starved planner gets it.
    await starved.wait_for(lambda: starved.live[-1].credits, timeout=3, what="credit moved to the starved planner")
    starved.live[-1].assign(assignment(1))
    await starved.wait_for(lambda: starved.results, what="work done")
    assert len(holder.conns) >= 2, "the idle stream was re-opened"
    assert holder.conns[0].closed


async def test_redials_a_planner_that_comes_up_late(planners: Callable[..., Any], make_worker: WorkerFactory) -> None:
    first: FakePlanner = await planners(planner_id="p-late")
    port = first.port
    await first.stop()  # the address is known, nobody answers yet
    w = make_worker([f"127.0.0.1:{port}"])
    await w.start()
    await asyncio.sleep(0.3)  # several failed dials, with backoff
    late: FakePlanner = await planners(planner_id="p-late", port=port)
    conn = await late.conn(timeout=3)
    await late.wait_for(lambda: conn.credits, what="credits from the re-dialled stream")


async def test_unacknowledged_result_goes_to_another_planner(
    planners: Callable[..., Any], make_worker: WorkerFactory
) -> None:
    a: FakePlanner = await planners(planner_id="p-a")
    b: FakePlanner = await planners(planner_id="p-b")
    a.ack = lambda r, c: None  # A receives the result but dies before recording it
    w = make_worker([a.address, b.address], concurrency=2)

    @w.task("t")
    async def handler(ctx: ExecutionContext, payload: bytes) -> None:
        return None

    await w.start()
    conn_a = await _ready(a)
    await b.conn()
    job = assignment(1)
    conn_a.assign(job)
    await a.wait_for(lambda: conn_a.results, what="result sent to A")
    await a.stop()
    await b.wait_for(lambda: b.results, what="result re-sent to B")
    assert [r.execution_id for r in b.results] == [job.execution_id]
    await b.wait_for(lambda: len(w.outbox) == 0, what="B's ack")


async def test_a_planner_ignoring_the_half_close_is_cut_off(planner: FakePlanner, make_worker: WorkerFactory) -> None:
    planner.ignore_half_close = True
    w = make_worker([planner.address], welcome_timeout=0.3)
    await w.start()
    first = await _ready(planner)
    w.streams[planner.address].recycle()
    second = await planner.conn(2, timeout=3)
    await planner.wait_for(lambda: first.closed and second.credits, what="old stream cut, new one credited")
    assert w.book.unused(planner.address) == second.credits == 1, "the old stream's credit was counted once"
