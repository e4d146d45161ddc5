"""The staging target (chaos/observe.py): a cluster the harness did not start is observed mid-life, the
drill's schedules are created through its API, a planner is killed, and the window is judged from the
snapshot, the watch and the sink alone. Either the operator kills it and marks the window (`drill
mark`), or the scenario's fault command does (chaos/fault_commands.py) while a supervisor outside the
observer restarts it, as Kubernetes restarts a deleted pod."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path

import pytest

from chaos.infra.etcd import EtcdFactory
from chaos.infra.planners import FAST, PlannerSet
from chaos.infra.workers import WorkerProcess
from chaos.observe import ObserveOptions, mark, observe
from chaos.scenario import loads
from scheduler.store.keyspace import Keyspace
from tests.integration.drill_scenarios import LAG, every_second, faults, header, scenario, validity

pytestmark = [pytest.mark.etcd]

PREFIX = "/staging"
SCENARIO = scenario(
    header("observed", "a staging cluster observed while its operator kills a planner", 30),
    LAG, validity(150, 10), every_second("sec", 10), faults(5, 5),
)


# Full mode only: the fault-command test below observes the same way in every CI run; this one adds the
# operator's `drill mark` (its CLI is in tests/chaos/test_cli_drill.py).
@pytest.mark.slow
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


# The health command of the staging scenario below: the restarted planner serves again, and etcd shows
# every partition owned. Standard library and etcdctl only, as an operator's script would be.
HEALTH = """
import json, socket, subprocess, sys
etcdctl, endpoints, owners, partitions, api = sys.argv[1:]
host, port = api.rsplit(":", 1)
try:
    socket.create_connection((host, int(port)), timeout=1).close()
except OSError as e:
    sys.exit(f"{api} not serving: {e}")
r = subprocess.run([etcdctl, "--endpoints", endpoints, "get", "--prefix", owners, "--keys-only", "-w", "json"],
                   capture_output=True, text=True, timeout=5, check=False)
if r.returncode:
    sys.exit(f"etcdctl: {r.stderr.strip()}")
n = int(json.loads(r.stdout).get("count", 0))
sys.exit(0 if n >= int(partitions) else f"{n} of {partitions} partitions owned")
"""


def _q(s: str) -> str:
    return json.dumps(s)  # a TOML basic string


async def test_an_observed_cluster_gets_its_fault_from_the_scenario_command(etcd_factory: EtcdFactory,
                                                                           tmp_path: Path) -> None:
    etcd = etcd_factory()
    planners = PlannerSet(tmp_path / "planners", etcd.endpoints, PREFIX, partitions=8,
                          settings={**FAST, "lookahead_ms": "1000", "late_grace_ms": "2000"})
    worker = None
    supervisor = None
    try:
        _, a = await planners.serve("s-p1")
        _, b = await planners.serve("s-p2")
        worker = WorkerProcess("s-w1", "default", [a, b], tmp_path / "w1.log").start()
        victim = planners["s-p2"]
        pid = victim.pid

        async def supervise() -> None:
            """Outside the observer, as a pod's controller: a planner that died is started again."""
            while victim.running:
                await asyncio.sleep(0.1)
            victim.kill()  # reaps it (killed by the fault command, not by us)
            await planners.serve("s-p2", settings={"api_port": b.rpartition(":")[2]})

        supervisor = asyncio.create_task(supervise())
        health = tmp_path / "health.py"
        health.write_text(HEALTH)
        etcdctl = shutil.which("etcdctl") or str(Path(sys.executable).parent / "etcdctl")
        health_line = " ".join([sys.executable, str(health), etcdctl, ",".join(etcd.endpoints),
                                Keyspace(PREFIX).owners.decode(), "8", b])
        kill = shutil.which("kill") or "kill"
        scenario = SCENARIO + f"""
health_timeout_s = 30
[[faults.fixed]]
type = "F1"
at_s = 8
duration_s = 3
target = "s-p2"
[faults.commands]
health = {_q(health_line)}
health_interval_s = 0.5
timeout_s = 10
[faults.commands.targets.s-p1]
pid = {planners["s-p1"].pid}
[faults.commands.targets.s-p2]
pid = {pid}
[faults.commands.F1]
inject = {_q(kill + " -9 {pid}")}
"""
        await asyncio.sleep(3)  # the cluster has a life before the observer comes
        run_dir = tmp_path / "observed"
        opts = ObserveOptions(run_dir, tuple(etcd.endpoints), PREFIX, (a, b), 24.0, 2.0, scenario_text=scenario,
                              progress=print)
        verdict, report = await asyncio.wait_for(observe(loads(scenario, "observed"), opts), 120)
        assert supervisor.done() and supervisor.exception() is None, "the fault command killed the planner"
    finally:
        if supervisor is not None:
            supervisor.cancel()
            await asyncio.gather(supervisor, return_exceptions=True)
        if worker is not None:
            await worker.stop()
        planners.close()
    print("\n" + report["md"].read_text()[:3000])
    cmds = [json.loads(x) for x in (run_dir / "commands.jsonl").read_text().splitlines()]
    assert [c["phase"] for c in cmds] == ["health before", "inject", "health after"], cmds
    assert cmds[1]["argv"] == [kill, "-9", str(pid)] and cmds[1]["rc"] == 0
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["target"] == "observed" and meta["command_errors"] == []
    (f,) = [json.loads(x) for x in (run_dir / "faults.jsonl").read_text().splitlines()][-1:]
    assert f["start_ms"] >= cmds[1]["t_end_ms"] and f["healthy_ms"] >= f["end_ms"] >= f["start_ms"] + 3000
    row = verdict.faults[0]
    assert (row.type, row.target) == ("F1", "s-p2") and row.takeovers >= 1
    assert verdict.result == "pass", (verdict.invalid, {k: v.examples[:3] for k, v in verdict.invariants.items()})
