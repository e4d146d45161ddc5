"""`Worker.status()`: the worker's state as one snapshot, and the metrics gauges that read it."""

from __future__ import annotations

import asyncio

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from scheduler.status import WorkerProcessStatus
from scheduler.worker import ExecutionContext, Worker
from tests.worker.conftest import WorkerFactory
from tests.worker.fake_planner import FakePlanner, assignment


def gauges(w: Worker) -> dict[str, float]:
    text = generate_latest(w.metrics.registry).decode()
    return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name.startswith("scheduler_worker_")}


async def test_status_snapshot_and_the_gauges_that_read_it(planner: FakePlanner, make_worker: WorkerFactory) -> None:
    w = make_worker([planner.address], concurrency=3)
    release = asyncio.Event()

    @w.task("t")
    async def handler(ctx: ExecutionContext, payload: bytes) -> None:
        await release.wait()

    assert w.status() == WorkerProcessStatus(
        worker_id="w-test", pool="pool-a", region="r1", concurrency=3, task_types=("t",), held=0, running=0,
        planners=(), unacked_results=0, draining=False)
    await w.start()
    conn = await planner.conn()
    await planner.wait_for(lambda: conn.credits, what="credit")
    planner.ack = lambda r, c: None  # hold the acknowledgement: the result stays unacknowledged
    conn.assign(assignment(1))
    await planner.wait_for(lambda: w.status().running == 1, what="handler running")
    st = w.status()
    assert (st.held, st.running, st.planners, st.unacked_results) == (1, 1, (planner.address,), 0)
    assert gauges(w) == {"scheduler_worker_assignments_received_total": 1, "scheduler_worker_running_attempts": 1,
                         "scheduler_worker_duplicate_assignments_ignored_total": 0,
                         "scheduler_worker_concurrency": 3, "scheduler_worker_connected_planners": 1,
                         "scheduler_worker_unacked_results": 0}

    release.set()
    await planner.wait_for(lambda: conn.results, what="result")
    st = w.status()
    assert (st.held, st.running, st.unacked_results) == (0, 0, 1)
    g = gauges(w)
    assert (g["scheduler_worker_running_attempts"], g["scheduler_worker_unacked_results"]) == (0, 1)
