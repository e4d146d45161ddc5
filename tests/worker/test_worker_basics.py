"""The worker stream against a fake planner over real gRPC: Hello, credits, context, results, heartbeats."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from scheduler._gen.scheduler.v1 import execution_pb2 as epb
from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler.worker import ExecutionContext, FencingToken, PermanentError, TaskTimeout, TransientError
from scheduler.worker.worker import SDK_VERSION
from tests.worker.conftest import WorkerFactory
from tests.worker.fake_planner import Conn, FakePlanner, assignment


async def test_hello_announces_the_worker(planner: FakePlanner, make_worker: WorkerFactory) -> None:
    w = make_worker([planner.address], concurrency=3)

    @w.task("b")
    @w.task("a")
    async def noop(ctx: ExecutionContext, payload: bytes) -> None:
        return None

    await w.start()
    conn = await planner.conn()
    h = conn.hello
    assert (h.worker_id, h.pool, h.region, h.capacity) == ("w-test", "pool-a", "r1", 3)
    assert list(h.task_types) == ["a", "b"]
    assert h.sdk_version == SDK_VERSION
    assert not h.running
    # A lone planner gets one probe credit first; more follow when it uses them.
    await planner.wait_for(lambda: conn.credits == 1, what="probe credit")


async def test_assignment_context(planner: FakePlanner, make_worker: WorkerFactory) -> None:
    w = make_worker([planner.address])
    seen: list[ExecutionContext] = []

    @w.task("t")
    async def handler(ctx: ExecutionContext, payload: bytes) -> None:
        assert payload == b"hello"
        seen.append(ctx)

    await w.start()
    conn = await planner.conn()
    await planner.wait_for(lambda: conn.credits)
    a = assignment(3, payload=b"hello", attempt=2, partition=9, revision=77, timeout=30,
                   trigger=epb.TRIGGER_MANUAL)
    conn.assign(a)
    await planner.wait_for(lambda: conn.results, what="result")
    ctx = seen[0]
    assert ctx.execution_id == ctx.idempotency_key == "sched-a@2026-09-21T14:13:22.000Z"
    assert (ctx.schedule_id, ctx.tenant, ctx.attempt, ctx.trigger) == ("sched-a", "acme", 2, "manual")
    assert ctx.fencing_token == FencingToken(9, 77) and str(ctx.fencing_token) == "9:77"
    assert ctx.planned_at == datetime(2026, 9, 21, 14, 13, 22, tzinfo=UTC)
    assert ctx.planned_at_rfc3339 == "2026-09-21T14:13:22.000Z"
    assert ctx.deadline == datetime(2026, 9, 21, 14, 13, 52, tzinfo=UTC)
    remaining = ctx.remaining()
    assert remaining is not None and 25 < remaining <= 30
    assert not ctx.cancelled
    r = conn.results[0]
    assert (r.execution_id, r.attempt, r.outcome) == (a.execution_id, 2, epb.ATTEMPT_OUTCOME_SUCCEEDED)
    assert (r.fencing_token.partition, r.fencing_token.revision) == (9, 77)
    assert r.finished_at.ToMilliseconds() >= r.started_at.ToMilliseconds() > 0


async def test_error_classes_and_batched_results(planner: FakePlanner, make_worker: WorkerFactory) -> None:
    w = make_worker([planner.address], concurrency=8)
    release = asyncio.Event()
    raises: dict[str, BaseException | None] = {
        "ok": None,
        "transient": TransientError("upstream busy", retry_after=2.5),
        "permanent": PermanentError("payload.url: required"),
        "timeout": TaskTimeout("gave up after 3 s"),
        "unknown": ValueError("boom"),
    }

    @w.task("t")
    async def handler(ctx: ExecutionContext, payload: bytes) -> None:
        await release.wait()
        exc = raises[payload.decode()]
        if exc is not None:
            raise exc

    await w.start()
    conn = await planner.conn()
    await planner.wait_for(lambda: conn.credits)
    kinds = [*raises, "no-handler"]
    sent = []
    for i, kind in enumerate(kinds, start=1):  # use credits as they come: 1, then 2, then 4 ...
        await planner.wait_for(lambda: conn.credits, what="credit")
        a = assignment(i, payload=kind.encode(), task_type="other" if kind == "no-handler" else "t")
        conn.assign(a)
        sent.append(a)
    await planner.wait_for(lambda: len(w._attempts) == len(raises), what="all running")
    release.set()  # finish together: they travel in one Results message
    await planner.wait_for(lambda: len(conn.results) == len(kinds), what="all results")
    by_id = {r.execution_id: r for r in conn.results}
    got = {kind: (by_id[a.execution_id].outcome, by_id[a.execution_id].error_class)
           for kind, a in zip(kinds, sent, strict=True)}
    assert got == {
        "ok": (epb.ATTEMPT_OUTCOME_SUCCEEDED, epb.ERROR_CLASS_UNSPECIFIED),
        "transient": (epb.ATTEMPT_OUTCOME_FAILED, epb.ERROR_CLASS_TRANSIENT),
        "permanent": (epb.ATTEMPT_OUTCOME_FAILED, epb.ERROR_CLASS_PERMANENT),
        "timeout": (epb.ATTEMPT_OUTCOME_FAILED, epb.ERROR_CLASS_TIMEOUT),
        "unknown": (epb.ATTEMPT_OUTCOME_FAILED, epb.ERROR_CLASS_UNKNOWN),
        "no-handler": (epb.ATTEMPT_OUTCOME_FAILED, epb.ERROR_CLASS_PERMANENT),
    }
    transient = by_id[sent[1].execution_id]
    assert transient.message == "upstream busy" and transient.retry_after.ToMilliseconds() == 2500
    assert not by_id[sent[0].execution_id].HasField("retry_after")
    assert by_id[sent[2].execution_id].message == "payload.url: required"
    assert by_id[sent[4].execution_id].message == "ValueError: boom"
    assert "no handler for task type 'other'" in by_id[sent[5].execution_id].message
    assert max(len(b.results) for b in conn.of_kind("results")) >= 2, "results finishing together share a message"


@pytest.mark.parametrize("n_planners", [1, 2])
async def test_credits_never_exceed_concurrency(planners: object, make_worker: WorkerFactory, n_planners: int) -> None:
    ps: list[FakePlanner] = [await planners(planner_id=f"p{i}") for i in range(n_planners)]  # type: ignore[operator]
    w = make_worker([p.address for p in ps], concurrency=3)
    running = 0
    peak = 0

    @w.task("t")
    async def handler(ctx: ExecutionContext, payload: bytes) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01 * (1 + ctx.attempt % 3))
        running -= 1

    await w.start()
    conns = [await p.conn() for p in ps]
    total = 30
    sent = 0
    worst = 0
    # Greedy planners: every credit is used the moment it arrives.
    while sent < total:
        for i, c in enumerate(conns):
            worst = max(worst, sum(x.credits for x in conns) + running)
            if c.credits and sent < total:
                sent += 1
                c.assign(assignment(sent, schedule_id=f"s{i}", attempt=sent))
        await asyncio.sleep(0.002)
    await ps[0].wait_for(lambda: sum(len(c.results) for c in conns) == total, what="all results")
    assert peak <= 3
    assert worst <= 3, "unused credits + running attempts exceeded the concurrency"
    assert all(c.granted for c in conns), "every planner got credits"


async def test_heartbeats_list_running_attempts(planner: FakePlanner, make_worker: WorkerFactory) -> None:
    w = make_worker([planner.address])
    release = asyncio.Event()

    @w.task("t")
    async def handler(ctx: ExecutionContext, payload: bytes) -> None:
        await release.wait()

    await w.start()
    conn = await planner.conn()
    await planner.wait_for(lambda: conn.credits)
    a = assignment(1, partition=5, revision=99)
    conn.assign(a)

    def listing() -> list[wpb.Heartbeat]:
        return [h for h in conn.of_kind("heartbeat") if h.running]

    beats = await planner.wait_for(lambda: len(listing()) >= 3, what="heartbeats")
    assert beats
    hb = listing()[-1]
    (ra,) = hb.running
    assert (ra.execution_id, ra.attempt, ra.fencing_token.partition, ra.fencing_token.revision) == (
        a.execution_id, 1, 5, 99)
    assert ra.started_at.ToMilliseconds() > 0 and hb.worker_time.ToMilliseconds() > 0
    release.set()
    await planner.wait_for(lambda: conn.results)
    n = len(conn.of_kind("heartbeat"))
    await planner.wait_for(lambda: len(conn.of_kind("heartbeat")) > n)
    assert not conn.of_kind("heartbeat")[-1].running, "a finished attempt is no longer listed"


async def test_results_are_resent_until_acknowledged(planner: FakePlanner, make_worker: WorkerFactory) -> None:
    w = make_worker([planner.address])
    planner.ack = lambda r, c: None  # the first stream never answers

    @w.task("t")
    async def handler(ctx: ExecutionContext, payload: bytes) -> None:
        return None

    await w.start()
    first = await planner.conn()
    await planner.wait_for(lambda: first.credits)
    a = assignment(1)
    first.assign(a)
    await planner.wait_for(lambda: first.results, what="first send")
    # The stream breaks before the planner acknowledged: the result goes out again on the next stream,
    # where the planner first asks for a retry (etcd unreachable), then records it.
    answers = iter([wpb.RESULT_DISPOSITION_RETRY, wpb.RESULT_DISPOSITION_RECORDED])
    planner.ack = lambda r, c: next(answers)
    first.abort()
    second = await planner.conn(2)
    await planner.wait_for(lambda: len(second.results) == 2, what="resend after RETRY")
    assert [r.execution_id for r in second.results] == [a.execution_id] * 2
    await asyncio.sleep(1.3)  # > result_ack_timeout: an acknowledged result is never sent again
    assert len(second.results) == 2 and len(w.outbox) == 0


async def test_unanswered_result_is_resent_after_ack_timeout(planner: FakePlanner, make_worker: WorkerFactory) -> None:
    w = make_worker([planner.address], result_ack_timeout=0.3)
    answered = False

    def ack(r: wpb.Result, c: Conn) -> wpb.ResultDisposition | None:
        nonlocal answered
        if answered:
            return wpb.RESULT_DISPOSITION_DUPLICATE
        answered = True
        return None  # swallowed once

    planner.ack = ack

    @w.task("t")
    async def handler(ctx: ExecutionContext, payload: bytes) -> None:
        return None

    await w.start()
    conn = await planner.conn()
    await planner.wait_for(lambda: conn.credits)
    conn.assign(assignment(1))
    await planner.wait_for(lambda: len(conn.results) == 2, what="resend after the ack timeout")
    await planner.wait_for(lambda: len(w.outbox) == 0, what="DUPLICATE forgets the result")


async def test_duplicate_and_over_credit_assignments(planner: FakePlanner, make_worker: WorkerFactory) -> None:
    w = make_worker([planner.address], concurrency=2)
    release = asyncio.Event()
    runs: list[str] = []

    @w.task("t")
    async def handler(ctx: ExecutionContext, payload: bytes) -> None:
        runs.append(ctx.execution_id)
        await release.wait()

    await w.start()
    conn = await planner.conn()
    await planner.wait_for(lambda: conn.credits == 1)
    a = assignment(1)
    conn.assign(a)
    await planner.wait_for(lambda: conn.credits >= 1, what="credits after use")
    conn.assign(a)  # the same attempt again (a planner retrying a send): must not run twice
    await planner.wait_for(lambda: conn.credits >= 1, what="credit back for the duplicate")
    # A broken planner sends beyond its credits: refused without running, reported TRANSIENT.
    over = [assignment(i) for i in range(2, 2 + conn.credits + 1)]
    conn.credits += 1
    conn.assign(*over)
    await planner.wait_for(lambda: conn.results, what="refusal")
    refused = conn.results[0]
    assert refused.execution_id == over[-1].execution_id
    assert refused.error_class == epb.ERROR_CLASS_TRANSIENT and "beyond the credits" in refused.message
    release.set()
    await planner.wait_for(lambda: len(conn.results) == len(over) + 1, what="the rest")
    assert runs.count(a.execution_id) == 1


async def test_a_probe_is_answered_at_once_with_a_heartbeat_echoing_it(
        planners: Any, make_worker: WorkerFactory) -> None:
    """A planner probes to learn whether the worker still holds an attempt it inherited; the retry of a dead
    worker's run waits for the echo. Answered at once, not with the next heartbeat (5 s away here)."""
    planner = await planners(heartbeat_interval=5.0)
    w = make_worker([planner.address])
    await w.start()
    conn = await planner.conn()
    await asyncio.sleep(0.2)
    before = len(conn.of_kind("heartbeat"))
    conn.send(wpb.PlannerMessage(probe=wpb.Probe(seq=7)))
    await planner.wait_for(lambda: any(h.probe_echo == 7 for h in conn.of_kind("heartbeat")), timeout=1.0,
                           what="a heartbeat echoing the probe")
    assert len(conn.of_kind("heartbeat")) == before + 1
