"""The staging target (chaos/observe.py): a cluster the harness did not start is observed mid-life, the
drill's schedules are created through its API, the operator kills a planner and marks the window
(`drill mark`), and the window is judged from the snapshot, the watch and the sink alone."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from chaos.infra.etcd import EtcdFactory
from chaos.infra.planners import FAST, PlannerSet
from chaos.infra.workers import WorkerProcess
from chaos.observe import ObserveOptions, mark, observe
from chaos.scenario import loads

pytestmark = [pytest.mark.etcd]

PREFIX = "/staging"
SCENARIO = """
[scenario]
name = "observed"
description = "a staging cluster observed while its operator kills a planner"
duration_s = 30
[lag]
steady_p99_s = 1.5
steady_max_s = 3.0
fault_max_s = 8.0
settle_s = 6.0
liveness_s = 15.0
judge_grace_s = 5.0
[validity]
min_executions = 150
min_planned_per_fault = 10
[[load.schedules]]
name = "sec"
count = 10
spec = "* * * * * *"
[faults]
warmup_s = 5
cooldown_s = 5
"""


async def test_an_observed_cluster_is_judged_on_its_window(etcd_factory: EtcdFactory, tmp_path: Path) -> None:
    etcd = etcd_factory()
    planners = PlannerSet(tmp_path / "planners", etcd.endpoints, PREFIX, partitions=8,
                          settings={**FAST, "lookahead_ms": "1000", "late_grace_ms": "2000"})
    worker = None
    try:
        _, a = await planners.serve("s-p1")
        _, b = await planners.serve("s-p2")
        worker = WorkerProcess("s-w1", "default", [a, b], tmp_path / "w1.log").start()
        await asyncio.sleep(3)  # the cluster has a life before the observer comes
        run_dir = tmp_path / "observed"
        opts = ObserveOptions(run_dir, tuple(etcd.endpoints), PREFIX, (a, b), 24.0, 2.0, scenario_text=SCENARIO)
        task = asyncio.create_task(observe(loads(SCENARIO, "observed"), opts))
        await asyncio.sleep(10)
        planners["s-p2"].kill()  # the operator's fault, marked as they make it
        i = mark(run_dir, "start", "F1", "s-p2")
        await asyncio.sleep(3)
        await planners.serve("s-p2", settings={"api_port": b.rpartition(":")[2]})
        assert mark(run_dir, "end") == i
        verdict, report = await asyncio.wait_for(task, 120)
    finally:
        if worker is not None:
            await worker.stop()
        planners.close()
    print("\n" + report["md"].read_text()[:3000])
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["target"] == "observed" and meta["watch_from_rev"] > 1
    assert (run_dir / "etcd-start.jsonl").read_text(), "the keys as they were when the observer came"
    safety = {k: verdict.invariants[k] for k in ("I1", "I2", "I4", "I5", "I6")}
    assert all(x.count == 0 for x in safety.values()), {k: x.examples[:5] for k, x in safety.items()}
    assert verdict.invariants["I2"].checked > 150
    row = verdict.faults[0]
    assert (row.type, row.target) == ("F1", "s-p2") and row.takeovers >= 1
