"""A drill recorded from real processes and judged by the harness's checker: the first end-to-end use of
chaos/ on the product's own output (the runner of issue 10 will do this from a scenario).

One etcd, two `schedctl planner` processes, one effect-worker process; the scenario's plan made into
schedules by chaos/load.py: 12 every-second ones over the http executor and 4 `@every 2s` ones over the
shell executor, all reporting to the effect sink; chaos.record.RunWriter records the run;
the harness's watcher records etcd's history; one planner is SIGKILLed (F1) and restarted. The run
directory is written as the runner will write it, `check_run` judges it, and the report is written
next to it. Safety (I1, I4, I5, I6) must hold; the whole verdict is printed.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from chaos.check import check_run
from chaos.infra.etcd import EtcdFactory
from chaos.infra.planners import FAST, PlannerSet
from chaos.infra.procs import spawn
from chaos.load import schedule_of
from chaos.plan import make_plan
from chaos.record import FaultRecord, RunMeta, RunWriter, load_run, record_watch
from chaos.report import write_report
from chaos.scenario import loads
from chaos.sink import EffectSink
from scheduler.clock import SYSTEM_CLOCK
from scheduler.store.etcd import EtcdClient, EtcdError
from scheduler.store.keyspace import Keyspace
from scheduler.store.schedules import ScheduleStore
from tests.integration.engine import WORKER, stop_process

pytestmark = [pytest.mark.etcd, pytest.mark.slow]

P = 8
PREFIX = "/drill-rec"
TTL_S = 2.0
STEADY_S, DOWN_S, AFTER_S = 12.0, 3.0, 15.0
SCENARIO = """
[scenario]
name = "recorded-f1"
description = "two planners, one SIGKILLed and restarted; http and shell effects"
duration_s = 60
[cluster]
planners_per_region = 2
workers_per_region = 1
partitions = 8
[lag]
steady_p99_s = 1.0
steady_max_s = 2.5
fault_max_s = 6.0
settle_s = 5.0
liveness_s = 10.0
judge_grace_s = 6.0
[validity]
min_executions = 100
min_planned_per_fault = 20
[[load.schedules]]
name = "sec"
count = 12
spec = "* * * * * *"
[[load.schedules]]
name = "every2"
count = 4
spec = "@every 2s"
executor = "shell"
hold_ms = 300
[faults]
warmup_s = 5
cooldown_s = 5
"""


async def owned(kv: EtcdClient, ks: Keyspace) -> bool:
    try:
        r = await kv.range(ks.owners, prefix=True, keys_only=True, timeout=2.0)
    except EtcdError:
        return False
    return len({ks.partition_of(x.key) for x in r.kvs}) == P


async def wait_owned(kv: EtcdClient, ks: Keyspace, timeout: float = 60) -> int:
    t0 = time.monotonic()
    while not await owned(kv, ks):
        assert time.monotonic() - t0 < timeout, "partitions never all owned"
        await asyncio.sleep(0.1)
    return SYSTEM_CLOCK.wall_ms()


async def test_a_recorded_run_of_real_processes_is_judged(etcd_factory: EtcdFactory, tmp_path: Path) -> None:
    etcd = etcd_factory()
    ks = Keyspace(PREFIX)
    run_dir = tmp_path / "run"
    rec = RunWriter(run_dir, SCENARIO)
    sink = EffectSink(rec.effects_path)
    url = await sink.start()
    plan = make_plan(loads(SCENARIO))
    schedules = [schedule_of(p, url, pool="pool") for p in plan.schedules]  # effect_worker serves "pool"
    planners = PlannerSet(tmp_path / "planners", etcd.endpoints, PREFIX, partitions=P,
                          settings={**FAST, "lookahead_ms": "1000", "late_grace_ms": "2000"})
    worker = None
    async with EtcdClient(etcd.config(timeout=2.0)) as kv:
        stop = asyncio.Event()
        watcher = asyncio.create_task(record_watch(kv, PREFIX, rec.watch, stop))
        try:
            _, a = await planners.serve("r1-p1")
            _, b = await planners.serve("r1-p2")
            env = {k: v for k, v in os.environ.items() if not k.startswith("SCHED_")} | {"CHAOS_WORKER": "r1-w1"}
            worker = spawn([sys.executable, WORKER, "--id", "r1-w1", "--planners", f"{a},{b}", "--effects",
                            str(tmp_path / "worker-effects.log")], run_dir / "logs" / "r1-w1.log", env=env)
            await wait_owned(kv, ks)
            store = ScheduleStore(kv, ks, P)
            for s in schedules:
                await store.create(s, SYSTEM_CLOCK.wall_ms())
            start_ms = SYSTEM_CLOCK.wall_ms()
            await asyncio.sleep(STEADY_S)
            t_kill = SYSTEM_CLOCK.wall_ms()
            planners["r1-p1"].kill()  # F1
            await asyncio.sleep(DOWN_S)
            await planners.serve("r1-p1", settings={"api_port": a.rpartition(":")[2]})
            t_back = SYSTEM_CLOCK.wall_ms()
            healthy = await wait_owned(kv, ks)
            rec.fault(FaultRecord(0, "F1", "r1-p1", t_kill, t_back, {"restart": True}, "planner",
                                  "planner crash", healthy_ms=healthy))
            await asyncio.sleep(AFTER_S)
            end_ms = SYSTEM_CLOCK.wall_ms()
            await asyncio.sleep(6.0)  # the window's last runs finish
        finally:
            stop.set()
            await asyncio.gather(watcher, return_exceptions=True)
            if worker is not None:
                stop_process(worker)
            planners.close()
            await sink.close()
    for node in ("r1-p1", "r1-p2"):
        with (run_dir / "logs" / f"{node}.log").open("w") as log:
            for part in sorted((tmp_path / "planners").glob(f"{node}.*.log")):
                log.write(part.read_text(errors="replace"))
    nodes = {"r1-p1": {"role": "planner", "region": "r1"}, "r1-p2": {"role": "planner", "region": "r1"},
             "r1-w1": {"role": "worker", "region": "r1", "address": "127.0.0.1"}}
    rec.finish(RunMeta("recorded-f1", plan.seed, PREFIX, P, TTL_S, start_ms, end_ms, plan_fingerprint=plan.fingerprint,
                       versions={"python": sys.version.split()[0]}, nodes=nodes))
    verdict = check_run(load_run(run_dir))
    paths = write_report(verdict, run_dir)
    print("\n" + paths["md"].read_text()[:6000])
    print(f"report: {paths['md']}")
    safety = {k: verdict.invariants[k] for k in ("I1", "I4", "I5", "I6")}
    assert all(i.count == 0 for i in safety.values()), {k: i.examples[:5] for k, i in safety.items()}
    assert verdict.invariants["I2"].checked > 300
    assert verdict.stats["outcomes"].get("effects_accepted", 0) > 300
