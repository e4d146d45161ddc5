"""`schedctl drill run`: a scenario made real, recorded and judged.

1. Plan (chaos/plan.py): scenario + seed -> faults, load, operations (reproducible, fingerprinted).
2. Refuse what this machine cannot make (a fault type without a nemesis here) before starting anything.
3. Start the cluster (chaos/live.py): etcd, the effect sink and the etcd watcher (outside every fault),
   planners dialling etcd through their links (chaos/links.py), workers.
4. Steady state before: healthy within `steady_state.timeout_s`, then the load's schedules are created.
5. The window: operations at their offsets (chaos/ops.py) and, one at a time, the faults
   (chaos/nemesis.py): wait until the fault's earliest start, wait for health, inject, hold for its
   duration, heal, wait for health again; each window recorded as it really happened.
6. After the window: a tail so the last runs finish, the steady state after, everything stopped.
7. run.json, then the verdict from the files alone (chaos/check.py) and the report (chaos/report.py).

A run whose cluster was never healthy before, or never again after a fault, is recorded as such and
judged *invalid* by the checker; the runner never turns a failure to heal into a pass.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from chaos import faults as catalogue
from chaos.aim import aim
from chaos.check import check_run
from chaos.clock import PlannerClockSet
from chaos.links import Links
from chaos.live import PREFIX, LiveCluster, PlannerClocks
from chaos.nemesis import Nemesis, Unsupported
from chaos.netns_cluster import ClusterNetwork, choose_network, make_network
from chaos.ops import OpRunner
from chaos.plan import FaultWindow, Plan, make_plan
from chaos.record import FaultRecord, RunMeta, RunWriter, load_run
from chaos.report import write_report
from chaos.scenario import Scenario, ScenarioError
from chaos.verdict import Verdict
from chaos.wire import writer
from scheduler import __version__
from scheduler.clock import SYSTEM_CLOCK
from scheduler.store.keyspace import Keyspace

__all__ = ["DrillResult", "RunOptions", "run_drill", "unsupported_faults"]

log = logging.getLogger("chaos.runner")

LOAD_SETTLE_S = 3.0


@dataclass(frozen=True)
class RunOptions:
    directory: Path
    seed: int | None = None
    duration_s: float | None = None
    links: str = "proxy"  # proxy | direct
    network: str = "loopback"  # loopback | netns (a namespace per node, chaos/netns_cluster.py) | auto
    unsafe_fencing_off: bool = False  # meta-tests (SCHED_TEST_MODE=1): planners write without the fence
    unsafe_dedupe_off: bool = False  # meta-tests (SCHED_TEST_MODE=1): workers run a repeated assignment again
    progress: Callable[[str], None] | None = None  # a line per step (the CLI prints them)
    scenario_text: str = ""  # the TOML, when the scenario was not read from a file (scenario.toml in the run)


@dataclass
class DrillResult:
    verdict: Verdict
    report: dict[str, Path]
    plan: Plan
    directory: Path


def _links(kind: str, rec: RunWriter, network: ClusterNetwork) -> Links:
    """Proxy links unless asked otherwise: every link fault needs them, and their wire witness
    records the stale writes etcd refused (I4c)."""
    return network.links(kind, writer(rec.wire), Keyspace(PREFIX).owners)


def _network(choice: str, source: str) -> ClusterNetwork:
    try:
        kind, _ = choose_network(choice)
    except ValueError as e:
        raise ScenarioError("network", str(e), source) from None
    return make_network(kind)


def _clocks(directory: Path, s: Scenario, plan: Plan) -> tuple[PlannerClocks | None, int]:
    """Per-node clocks for F6 and for `cluster.wall_clock_start` (every planner and worker shifted to
    start there), and the cluster's offset in ms (run.json `clock_offset_ms`)."""
    skewed = sorted({f.target for f in plan.faults if f.type == "F6"})
    base = 0.0
    nodes = skewed
    if s.cluster.wall_clock_start is not None:
        start = datetime.fromisoformat(s.cluster.wall_clock_start.replace("Z", "+00:00"))
        base = start.timestamp() - time.time()
        nodes = [*s.cluster.planners(), *s.cluster.workers()]
    if not nodes:
        return None, 0
    return PlannerClockSet.create(directory / "clocks", nodes, base), round(base * 1000)


def unsupported_faults(plan: Plan, nemesis: Nemesis) -> list[str]:
    out = {}
    for f in plan.faults:
        why = nemesis.supported(f.type, f.params)
        if why is not None:
            out[f.type] = f"{f.type} ({f.name}): {why}"
    return [out[k] for k in sorted(out, key=lambda k: int(k[1:]))]


def scenario_with(s: Scenario, duration_s: float | None) -> Scenario:
    return s if duration_s is None else dataclasses.replace(s, duration_s=duration_s)


async def run_drill(scenario: Scenario, opts: RunOptions) -> DrillResult:
    if scenario.faults.commands is not None:
        # Its commands are for a staging cluster (`kubectl delete pod ...`): run here they would hit
        # whatever they name, and the local nemeses instead would be a different drill.
        raise ScenarioError("faults.commands", "a scenario with fault commands is run against its staging cluster "
                            "with `schedctl drill observe`, not started here", scenario.source)
    s = scenario_with(scenario, opts.duration_s)
    plan = make_plan(s, opts.seed)
    say = opts.progress or (lambda _m: None)
    toml = opts.scenario_text or _source_text(s)
    if not toml:
        raise ScenarioError("scenario", "its TOML is needed in the run directory (scenario.toml): read it from a "
                                        "file or pass RunOptions.scenario_text", s.source)
    network = _network(opts.network, s.source)
    rec = RunWriter(opts.directory, toml)
    clocks, offset_ms = _clocks(opts.directory, s, plan)
    if s.cluster.wall_clock_start is not None and clocks is None:
        raise ScenarioError("cluster.wall_clock_start", "needs libfaketime (scripts/setup.sh installs it)", s.source)
    # F9's switch (a test-only planner setting) is given to the planners only when the plan holds an F9.
    duplicates = opts.directory / "duplicate" if any(f.type == "F9" for f in plan.faults) else None
    live = LiveCluster(s, opts.directory, rec, _links(opts.links, rec, network),
                       unsafe_fencing_off=opts.unsafe_fencing_off, clock=clocks, network=network,
                       duplicate_dir=duplicates, unsafe_dedupe_off=opts.unsafe_dedupe_off)
    nemesis = Nemesis(live)
    missing = unsupported_faults(plan, nemesis)
    if missing:
        raise ScenarioError("faults", "this machine cannot make: " + "; ".join(missing), s.source)
    say(f"plan {plan.fingerprint}: {len(plan.faults)} faults {plan.faults_per_type()}, "
        f"{len(plan.schedules)} schedules, {len(plan.operations)} operations, links: {live.links.kind}, "
        f"network: {network.kind}")
    start_ms = end_ms = SYSTEM_CLOCK.wall_ms()
    steady_before = steady_after = False
    errors: list[str] = []
    history_complete = True
    try:
        await live.start()
        say(f"cluster up: {len(live.live_planners())} planners, {len(live.workers)} workers, "
            f"sink {live.sink_url}")
        healthy, h = await live.wait_healthy(s.steady_state.timeout_s)
        steady_before = healthy is not None
        if not steady_before:
            say(f"never healthy before the first fault: {h}")
        ops = OpRunner(live, rec, plan.schedules, plan.seed)
        await ops.create_all(plan.schedules)
        # The window opens once the new schedules' first runs are under way: a schedule's first run after
        # its create is planned from the watch event, and lags by that much (I2 judges it; I3 should not).
        await asyncio.sleep(LOAD_SETTLE_S)
        start_ms = SYSTEM_CLOCK.wall_ms()
        say(f"window open for {s.duration_s:g} s")
        op_task = asyncio.create_task(ops.run(plan.operations, start_ms), name="operations")
        fault_task = asyncio.create_task(_faults(plan, s, start_ms, live, nemesis, rec, say), name="faults")
        await asyncio.sleep(max(0.0, (start_ms + s.duration_s * 1000 - SYSTEM_CLOCK.wall_ms()) / 1000))
        end_ms = SYSTEM_CLOCK.wall_ms()
        for t in (fault_task, op_task):  # a fault still under way is healed by its task's cancellation
            if not t.done():
                t.cancel()
            try:
                await t
            except asyncio.CancelledError:
                pass
            except Exception as e:  # a harness bug: said loudly, and the run is judged on what was recorded
                log.exception("drill task failed")
                errors.append(f"{t.get_name()}: {e!r}")
                say(f"harness error in {t.get_name()}: {e!r} (the run will be invalid)")
        say("window closed; waiting for the last runs")
        await asyncio.sleep(_tail_s(s))
        healthy, h = await live.wait_healthy(s.steady_state.timeout_s)
        steady_after = healthy is not None
        if not steady_after:
            say(f"never healthy again after the window: {h}")
        if (why := await live.watch_complete()) is not None:
            errors.append(why)
            history_complete = False
            say(f"harness error: {why} (the run will be invalid)")
    finally:
        await live.close()
    meta = RunMeta(
        scenario=s.name, seed=plan.seed, prefix=PREFIX, partitions=s.cluster.partitions,
        lease_ttl_s=s.cluster.lease_ttl_s, start_ms=start_ms, end_ms=end_ms, plan_fingerprint=plan.fingerprint,
        versions=_versions(), late_grace_ms=int(s.cluster.planner.get("late_grace_ms", 2000)),
        lookahead_ms=int(s.cluster.planner.get("lookahead_ms", 1000)), nodes=live.nodes(),
        steady_before=steady_before, steady_after=steady_after, target="local", harness_errors=errors,
        clock_offset_ms=offset_ms, history_complete=history_complete,
    )
    rec.finish(meta)
    verdict = check_run(load_run(opts.directory))
    report = write_report(verdict, opts.directory)
    return DrillResult(verdict, report, plan, opts.directory)


def _source_text(s: Scenario) -> str:
    """The scenario file as run (scenario.toml in the run directory: bounds and thresholds to judge by)."""
    p = Path(s.source) if s.source else None
    return p.read_text() if p is not None and p.exists() else ""


def _tail_s(s: Scenario) -> float:
    hold = max((g.hold_ms for g in s.load), default=0) / 1000
    return max(s.lag.judge_grace_s, hold + 1.0)


async def _faults(plan: Plan, s: Scenario, start_ms: int, live: LiveCluster, nemesis: Nemesis, rec: RunWriter,
                  say: Callable[[str], None]) -> None:
    # Faults end before the cooldown, whose healed tail I7 judges. The runner falls behind the plan when faults
    # take longer than planned (a health wait, 5 s to aim one at a target that owns something): a game day ran
    # 120 s late at its end, and its last faults, inside the tail, made the run invalid.
    cooldown_ms = start_ms + (s.duration_s - s.faults.cooldown_s) * 1000
    for i, w in enumerate(plan.faults):
        delay = (start_ms + w.start_s * 1000 - SYSTEM_CLOCK.wall_ms()) / 1000
        if delay > 0:
            await asyncio.sleep(delay)
        ok, h = await live.wait_healthy(s.faults.health_timeout_s)
        if ok is None:
            # The cluster did not recover from the previous fault: no more faults (the run is invalid: the
            # previous window's healthy_ms is None), and nothing is injected into a sick cluster.
            say(f"fault #{w.index} {w.type} not injected: the cluster is not healthy ({h})")
            return
        aimed = await aim(w, live, say)
        now = SYSTEM_CLOCK.wall_ms()
        if now + aimed.duration_s * 1000 > cooldown_ms:
            say(f"fault #{w.index} {w.type} and the {len(plan.faults) - i - 1} after it not injected: the run is "
                f"{(now - start_ms) / 1000 - w.start_s:.1f} s behind its plan and they would reach the cooldown")
            return
        await _one(aimed, live, nemesis, rec, s, say)


async def _one(w: FaultWindow, live: LiveCluster, nemesis: Nemesis, rec: RunWriter, s: Scenario,
               say: Callable[[str], None]) -> None:
    kind = catalogue.kind(w.type)
    try:
        active = await nemesis.inject(w)
    except Unsupported as e:
        say(f"fault #{w.index} {w.type} on {w.target} could not be made: {e}")
        return
    t_start = SYSTEM_CLOCK.wall_ms() if active.started_ms is None else active.started_ms
    if w.aimed_from:
        active.detail["aimed_from"] = w.aimed_from
    say(f"fault #{w.index} {w.type} ({kind.name}) on {w.target} for {w.duration_s:g} s"
        + (f": {active.note}" if active.note else ""))
    end: int | None = None
    healthy: int | None = None
    notes = [active.note]
    try:
        await asyncio.sleep(w.duration_s)
    finally:
        # Healed even when the run is cut short (cancelled at the window's end): the window's end is
        # when the heal took effect, and it is recorded either way.
        try:
            notes.append(await active.heal())
            end = SYSTEM_CLOCK.wall_ms()
        except Exception as e:  # recorded as never healed: the run is invalid, not passed
            notes.append(f"heal failed: {e!r}")
        rec.fault(FaultRecord(w.index, w.type, w.target, t_start, end, dict(w.params), w.role, kind.name,
                              None, "; ".join(n for n in notes if n), dict(active.counts), dict(active.detail)))
    ok, h = await live.wait_healthy(s.faults.health_timeout_s)
    healthy = ok
    # The window's record is written again with its health time: the reader keeps the last line per index.
    rec.fault(FaultRecord(w.index, w.type, w.target, t_start, end, dict(w.params), w.role, kind.name, healthy,
                          "; ".join(n for n in notes if n), dict(active.counts), dict(active.detail)))
    say(f"  healed; healthy again after {((healthy or 0) - (end or 0)) / 1000:.1f} s" if healthy
        else f"  never healthy again: {h}")


def _versions() -> dict[str, str]:
    return {"sched": __version__, "python": sys.version.split()[0], "platform": platform.platform()}
