"""Fixtures: fake planners on loopback ports and workers with fast timings, all stopped after the test."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from scheduler.clock import SYSTEM_CLOCK
from scheduler.worker import ExecutionContext, FencingToken, Worker, WorkerSettings
from tests.worker.fake_planner import FakePlanner

FAST = WorkerSettings(
    worker_id="w-test",
    pool="pool-a",
    region="r1",
    concurrency=4,
    heartbeat_interval=0.05,
    cancel_grace=0.2,
    result_ack_timeout=1.0,
    credit_idle_after=0.3,
    reconnect_backoff_min=0.02,
    reconnect_backoff_max=0.1,
    welcome_timeout=2.0,
    discovery_interval=0.2,
    flush_timeout=1.0,
    drain_grace=1.0,
)

WorkerFactory = Callable[..., Worker]


@pytest.fixture
async def planners() -> AsyncIterator[Callable[..., Any]]:
    """`await planners(planner_id=...)` starts a fake planner; all are stopped at the end."""
    started: list[FakePlanner] = []

    async def make(**kw: Any) -> FakePlanner:
        p = await FakePlanner(**kw).start()
        started.append(p)
        return p

    yield make
    for p in started:
        await p.stop()


@pytest.fixture
async def planner(planners: Callable[..., Any]) -> FakePlanner:
    p: FakePlanner = await planners()
    return p


@pytest.fixture
async def make_worker() -> AsyncIterator[WorkerFactory]:
    """`make_worker(planners=[...], **settings)`: a Worker with fast timings; closed at the end."""
    made: list[Worker] = []

    def make(planners: list[str], **kw: Any) -> Worker:
        w = Worker(planners=planners, settings=dataclasses.replace(FAST, **kw))
        made.append(w)
        return w

    yield make
    for w in made:
        await w.close()


def make_ctx(timeout: float | None = None, **kw: Any) -> ExecutionContext:
    """A context as the worker builds it, for calling an executor directly."""
    fields: dict[str, Any] = {
        "execution_id": "nightly@2026-03-08T07:00:00.000Z", "schedule_id": "nightly", "tenant": "acme",
        "task_type": "shell", "attempt": 3, "fencing_token": FencingToken(12, 9001),
        "planned_at": datetime(2026, 3, 8, 7, 0, tzinfo=UTC), "deadline": None, "trigger": "scheduled",
        "worker_id": "w-test", "clock": SYSTEM_CLOCK,
        "local_deadline": None if timeout is None else SYSTEM_CLOCK.monotonic() + timeout,
    }
    fields.update(kw)
    return ExecutionContext(**fields)
