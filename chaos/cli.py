"""`schedctl drill ...`: list scenarios, show a plan, run a drill (chaos/runner.py), check a recorded run.

Exit codes (docs/drills.md): `run` and `check` return the verdict's, 0 pass, 1 fail, 3 invalid; every
command returns 2 for bad input (an unknown scenario, a TOML error, an unreadable run directory, a
fault this machine cannot make), naming the field or the file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from chaos.plan import Plan, make_plan
from chaos.record import RunError
from chaos.scenario import Scenario, ScenarioError, find, list_scenarios, load

__all__ = ["check", "list_", "mark", "observe", "plan", "run"]

BAD_INPUT = 2


def _bad(err: Exception) -> int:
    print(f"schedctl drill: {err}", file=sys.stderr)
    return BAD_INPUT


def list_(args: argparse.Namespace) -> int:
    try:
        scenarios = list_scenarios(Path(args.dir)) if args.dir else list_scenarios()
    except ScenarioError as e:
        return _bad(e)
    if args.json:
        rows = [{"name": s.name, "tier": s.tier, "duration_s": s.duration_s, "description": s.description,
                 "regression": s.regression, "source": s.source} for s in scenarios]
        json.dump(rows, sys.stdout, indent=1)
        print()
        return 0
    width = max((len(s.name) for s in scenarios), default=4)
    for s in scenarios:
        print(f"{s.name:<{width}}  {s.tier:<10} {s.duration_s / 60:>5.1f} min  {s.description}")
    return 0


def plan(args: argparse.Namespace) -> int:
    try:
        scenario = load(find(args.scenario))
        p = make_plan(scenario, args.seed)
    except ScenarioError as e:
        return _bad(e)
    if args.json:
        out = {"fingerprint": p.fingerprint, **p.to_json()}
        if scenario.faults.commands is not None:
            out["commands"] = _commands_json(scenario, p)
        json.dump(out, sys.stdout, indent=1)
        print()
        return 0
    print(f"{p.scenario} seed {p.seed}: plan {p.fingerprint}, {p.duration_s:g} s, {len(p.schedules)} schedules, "
          f"{len(p.operations)} operations, {len(p.faults)} faults "
          f"({', '.join(f'{k} {n}' for k, n in p.faults_per_type().items()) or 'none'})")
    for f in p.faults[: args.limit]:
        params = " ".join(f"{k}={v}" for k, v in sorted(f.params.items()))
        print(f"  #{f.index:<3} {f.type:<4} at {f.start_s:>7.1f}s for {f.duration_s:>5.1f}s  {f.target:<10} "
              f"{f.name}{'  ' + params if params else ''}")
    if len(p.faults) > args.limit:
        print(f"  ... {len(p.faults) - args.limit} more (--limit, or --json)")
    if scenario.faults.commands is not None:
        _print_commands(scenario, p, args.limit)
    return 0


def _commands_json(scenario: Scenario, p: Plan) -> dict[str, Any]:
    from chaos.fault_commands import health_argv, render

    rows = []
    for f in p.faults:
        r = render(scenario, f)
        rows.append({"index": f.index, "inject": list(r.inject), "heal": None if r.heal is None else list(r.heal),
                     "timeout_s": r.timeout_s})
    h = health_argv(scenario)
    return {"health": None if h is None else list(h), "faults": rows}


def _print_commands(scenario: Scenario, p: Plan, limit: int | None = None) -> None:
    from chaos.fault_commands import describe

    for line in describe(scenario, p, limit):
        print(line)


def check(args: argparse.Namespace) -> int:
    # The checker and the report (matplotlib) load only when a run is judged.
    from chaos.check import check_run
    from chaos.record import load_run
    from chaos.report import write_report

    try:
        run_ = load_run(args.history)
        scenario = load(find(args.scenario)) if args.scenario else None
        verdict = check_run(run_, scenario)
    except (RunError, ScenarioError) as e:
        return _bad(e)
    out = write_report(verdict, args.report or args.history)
    first = out["md"].read_text().splitlines()[0].lstrip("# ")
    print(first)
    for name in ("md", "json", "png"):
        if name in out:
            print(f"  {out[name]}")
    return verdict.exit_code


def run(args: argparse.Namespace) -> int:
    import asyncio
    import time

    from chaos.runner import RunOptions, run_drill

    try:
        scenario = load(find(args.scenario))
        if args.duration is not None and args.duration <= 0:
            raise ScenarioError("duration", f"{args.duration:g} must be > 0 seconds")
        make_plan(scenario, args.seed)  # a scenario that cannot be planned is refused before anything starts
    except ScenarioError as e:
        return _bad(e)
    directory = Path(args.report) if args.report else Path("drill-runs") / time.strftime(
        f"{scenario.name}-%Y%m%d-%H%M%S")
    if directory.exists() and any(directory.iterdir()):
        return _bad(ScenarioError("report", f"{directory} is not empty: a run directory holds one run"))
    t0 = time.monotonic()

    def say(line: str) -> None:
        print(f"[{time.monotonic() - t0:7.1f}s] {line}", flush=True)

    from chaos.netns_cluster import choose_network

    try:
        network, why = choose_network(getattr(args, "network", "loopback"))
    except ValueError as e:
        return _bad(ScenarioError("network", str(e)))
    if why:
        say(f"network: loopback ({why})")
    opts = RunOptions(directory, seed=args.seed, duration_s=args.duration, links=args.links, network=network,
                      progress=say)
    try:
        result = asyncio.run(run_drill(scenario, opts))
    except ScenarioError as e:
        return _bad(e)
    out = result.report
    print(out["md"].read_text().splitlines()[0].lstrip("# "))
    for name in ("md", "json", "png"):
        if name in out:
            print(f"  {out[name]}")
    return result.verdict.exit_code


def observe(args: argparse.Namespace) -> int:
    import asyncio

    from chaos.observe import ObserveOptions, observed_plan
    from chaos.observe import observe as run_observe

    try:
        scenario = load(find(args.scenario))
        host, sep, port = args.sink_listen.rpartition(":")
        if not sep or not port.isdigit():
            raise ScenarioError("sink-listen", f"{args.sink_listen!r} is not host:port")
        if args.duration <= 0 or args.lease_ttl <= 0:
            raise ScenarioError("duration", "--duration and --lease-ttl must be > 0 seconds")
        p = observed_plan(scenario, args.duration, args.seed)  # refused before anything starts, as `run`
        if getattr(args, "dry_run", False):
            print(f"{p.scenario} seed {p.seed}: plan {p.fingerprint}, observed for {args.duration:g} s, "
                  f"{len(p.schedules)} schedules{'' if not args.no_load else ' (not created: --no-load)'}, "
                  f"{len(p.operations)} operations, {len(p.faults)} faults")
            if scenario.faults.commands is not None:
                _print_commands(scenario, p)
            else:
                print("no [faults.commands]: the observer makes no fault; mark the ones you make with "
                      "`schedctl drill mark DIR start TYPE TARGET` / `end`")
            return 0
        directory = Path(args.report)
        if directory.exists() and any(directory.iterdir()):
            raise ScenarioError("report", f"{directory} is not empty: a run directory holds one run")
        endpoints = tuple(x.strip() for x in args.etcd_endpoints.split(",") if x.strip())
        api = tuple(x.strip() for x in args.api.split(",") if x.strip())
        if not args.no_load and not api:
            raise ScenarioError("api", "the drill's schedules are created through the API: give --api, or --no-load")
        opts = ObserveOptions(directory, endpoints, args.etcd_prefix, api, args.duration, args.lease_ttl,
                              host, int(port), not args.no_load, args.seed,
                              progress=lambda line: print(line, flush=True))
        verdict, out = asyncio.run(run_observe(scenario, opts))
    except ScenarioError as e:
        return _bad(e)
    print(out["md"].read_text().splitlines()[0].lstrip("# "))
    for name in ("md", "json", "png"):
        if name in out:
            print(f"  {out[name]}")
    return verdict.exit_code


def mark(args: argparse.Namespace) -> int:
    from chaos import faults as catalogue
    from chaos.observe import mark as do_mark

    d = Path(args.run_dir)
    if not d.is_dir():
        return _bad(ScenarioError("run_dir", f"{d} is not a directory"))
    try:
        if args.action == "start":
            catalogue.kind(args.fault)
            if not args.target:
                raise ValueError("start needs a fault type and a target, e.g. `start F1 planner-2`")
        i = do_mark(d, args.action, args.fault, args.target, args.index)
    except (KeyError, ValueError) as e:
        return _bad(ScenarioError("fault", str(e).strip("'\"")))
    print(f"fault window #{i} {args.action}")
    return 0
