"""`schedctl drill observe`: a drill against a cluster the harness did not start (a staging deployment).

The harness only observes: it records the cluster's keys as they are (etcd-start.jsonl) and every
event from the next revision (etcd-watch.jsonl), runs an effect sink for the drill's own schedules
(created through the cluster's API, pointing at the sink, unless `--no-load`), makes the scenario's
API operations, and makes the scenario's faults with its fault commands (`[faults.commands]`,
chaos/fault_commands.py: inject, hold, heal, wait for the health command), or, for a scenario without
commands, records the faults the operator (or their tooling) makes, as they mark them:
`schedctl drill mark DIR start F1 planner-2` ... `schedctl drill mark DIR end 0`. At the end it judges
the window exactly as a local run (`target = "observed"`, `watch_from_rev`): claims and checkpoints
written before the snapshot are the starting state, not judged.

What the observer cannot know, it does not invent: health after a fault is the health command's exit
(or the operator's mark: the `end` mark is taken as healed), a failed fault command makes the run
invalid, and a cluster whose workers cannot reach the sink's address runs the drill's schedules into
the sink's absence (their effects fail, and the checker says so). It never makes a fault with a local
nemesis: on a cluster it did not start, only the scenario's commands know how.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from chaos.check import check_run
from chaos.fault_commands import CommandFaults
from chaos.ops import OpRunner
from chaos.plan import Plan, make_plan
from chaos.record import FaultRecord, RunMeta, RunWriter, load_run, record_snapshot, record_watch
from chaos.report import write_report
from chaos.scenario import Scenario, ScenarioError
from chaos.sink import EffectSink
from chaos.verdict import Verdict
from scheduler import __version__
from scheduler.clock import SYSTEM_CLOCK
from scheduler.store.etcd import EtcdClient, EtcdConfig
from scheduler.store.keyspace import Keyspace

__all__ = ["ObserveOptions", "mark", "observe", "observed_plan"]


@dataclass(frozen=True)
class ObserveOptions:
    directory: Path
    etcd_endpoints: tuple[str, ...]
    prefix: str
    api: tuple[str, ...]  # planner API addresses to create the load and make the operations through
    duration_s: float
    lease_ttl_s: float
    sink_host: str = "127.0.0.1"
    sink_port: int = 0
    load: bool = True
    seed: int | None = None
    scenario_text: str = ""
    progress: Callable[[str], None] | None = None


class _Api:
    """What chaos/ops.py needs of a cluster: an API address and the sink's URL."""

    def __init__(self, addresses: tuple[str, ...], sink_url: str) -> None:
        self.addresses, self.sink_url = addresses, sink_url

    def api_address(self, rng: random.Random | None = None) -> str:
        if not self.addresses:
            raise RuntimeError("no API address given (--api)")
        return (rng or random).choice(self.addresses)


def _source_text(s: Scenario) -> str:
    p = Path(s.source) if s.source else None
    return p.read_text() if p is not None and p.exists() else ""


def observed_plan(scenario: Scenario, duration_s: float, seed: int | None) -> Plan:
    """The plan of an observed window: the scenario planned for the window's length (as `drill run
    --duration`), so its random faults and operations fit the window that is observed."""
    return make_plan(dataclasses.replace(scenario, duration_s=duration_s), seed)


async def observe(scenario: Scenario, opts: ObserveOptions) -> tuple[Verdict, dict[str, Path]]:
    say = opts.progress or (lambda _m: None)
    plan = observed_plan(scenario, opts.duration_s, opts.seed)
    text = opts.scenario_text or _source_text(scenario)
    if not text:
        raise ScenarioError("scenario", "its TOML is needed in the run directory", scenario.source)
    rec = RunWriter(opts.directory, text)
    commands = CommandFaults(scenario, plan, rec, say) if scenario.faults.commands is not None else None
    harness_errors: list[str] = []
    ks = Keyspace(opts.prefix)
    sink = EffectSink(rec.effects_path)
    url = await sink.start(opts.sink_host, opts.sink_port)
    stop = asyncio.Event()
    async with EtcdClient(EtcdConfig(endpoints=opts.etcd_endpoints, timeout=5.0)) as kv:
        cfg = await kv.get(ks.cluster_config)
        if cfg is None:
            raise ScenarioError("etcd_prefix", f"no cluster under {opts.prefix!r} (no {ks.cluster_config.decode()})")
        partitions = int(json.loads(cfg.value)["partitions"])
        with (opts.directory / "etcd-start.jsonl").open("w") as snap:
            rev = await record_snapshot(kv, opts.prefix, snap)
        watcher = asyncio.create_task(record_watch(kv, opts.prefix, rec.watch, stop, start_revision=rev + 1))
        say(f"observing {opts.prefix} on {','.join(opts.etcd_endpoints)} from revision {rev + 1}; "
            f"{partitions} partitions; sink {url}")
        ops = OpRunner(_Api(opts.api, url), rec, plan.schedules, plan.seed)
        if opts.load:
            await ops.create_all(plan.schedules)
            say(f"created {len(plan.schedules)} drill schedules")
        start_ms = SYSTEM_CLOCK.wall_ms()
        op_task = asyncio.create_task(ops.run(plan.operations if opts.load else (), start_ms))
        fault_task = asyncio.create_task(commands.run(start_ms)) if commands is not None else None
        if commands is not None:
            say(f"window open for {opts.duration_s:g} s: {len(plan.faults)} faults made by the scenario's commands")
        else:
            say(f"window open for {opts.duration_s:g} s: mark faults with `schedctl drill mark {opts.directory} ...`"
                + (f" (the scenario's {len(plan.faults)} planned faults have no [faults.commands]: they are yours "
                   "to make)" if plan.faults else ""))
        await asyncio.sleep(opts.duration_s)
        end_ms = SYSTEM_CLOCK.wall_ms()
        for t in (op_task, fault_task):
            if t is None:
                continue
            t.cancel()  # a fault still under way is healed by its task's cancellation
            try:
                await t
            except asyncio.CancelledError:
                pass
            except Exception as e:  # a harness bug: the run is judged on what was recorded, and invalid
                harness_errors.append(f"{'faults' if t is fault_task else 'operations'}: {e!r}")
                say(f"harness error: {e!r} (the run will be invalid)")
        await asyncio.sleep(max(scenario.lag.judge_grace_s, 2.0))
        stop.set()
        history_complete = True
        try:
            await watcher
        except Exception as e:  # the history stops short: judged up to where it ends, and invalid
            history_complete = False
            harness_errors.append(f"the etcd watch ended early: {e!r}")
            say(f"harness error: the etcd watch ended early: {e!r} (the run will be invalid)")
    await sink.close()
    if commands is not None:
        commands.close()
    meta = RunMeta(scenario=scenario.name, seed=plan.seed, prefix=opts.prefix, partitions=partitions,
                   lease_ttl_s=opts.lease_ttl_s, start_ms=start_ms, end_ms=end_ms, plan_fingerprint=plan.fingerprint,
                   versions={"sched": __version__, "python": sys.version.split()[0]}, target="observed",
                   watch_from_rev=rev + 1, harness_errors=harness_errors, history_complete=history_complete,
                   command_errors=list(commands.errors) if commands is not None else [])
    rec.finish(meta)
    verdict = check_run(load_run(opts.directory))
    return verdict, write_report(verdict, opts.directory)


def mark(directory: Path, action: str, fault_type: str = "", target: str = "", index: int | None = None) -> int:
    """Record the operator's fault in an observed run's faults.jsonl: `start` appends a window (its index is
    returned), `end` closes the window `index` (default: the last one still open). The end is taken as
    the time the cluster was healthy again: the observer does not second-guess the operator."""
    path = directory / "faults.jsonl"
    rows = [FaultRecord.from_json(json.loads(x)) for x in path.read_text().splitlines() if x.strip()] \
        if path.exists() else []
    latest = {r.index: r for r in rows}
    now = int(time.time() * 1000)
    if action == "start":
        from chaos import faults as catalogue

        kind = catalogue.kind(fault_type)
        i = max(latest, default=-1) + 1
        rec = FaultRecord(i, fault_type, target, now, None, {}, kind.role, kind.name, None, "marked by the operator")
    else:
        open_ = [r for r in latest.values() if r.end_ms is None]
        if index is None:
            if not open_:
                raise ValueError("no fault window is open: mark one with `start` first")
            index = max(r.index for r in open_)
        if index not in latest:
            raise ValueError(f"no fault window #{index}")
        r = latest[index]
        rec = FaultRecord(r.index, r.type, r.target, r.start_ms, now, r.params, r.role, r.name, now, r.note)
        i = index
    with path.open("a") as f:
        f.write(json.dumps(asdict(rec), separators=(",", ":")) + "\n")
    return i
