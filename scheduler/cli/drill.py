"""`schedctl drill`: the chaos harness's commands (list, plan, check, run). The work is in chaos/cli.py,
imported only when a drill command runs, so every other command starts without loading the harness
(matplotlib included)."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("drill", help="chaos drills: list scenarios, show a plan, run a drill, check a recorded run",
                       description="Failover drills (docs/drills.md). `check` exits 0 pass, 1 fail, 3 invalid; "
                       "every command exits 2 on bad input.")
    dsub = p.add_subparsers(dest="drill_command", required=True, metavar="ACTION")

    ls = dsub.add_parser("list", help="scenarios in chaos/scenarios with one-line descriptions")
    ls.add_argument("--dir", help="another directory of scenario files")
    ls.add_argument("--json", action="store_true", help="print JSON")
    ls.set_defaults(func=_call("list_"))

    pl = dsub.add_parser("plan", help="the fault windows and load a scenario's seed determines")
    pl.add_argument("scenario", help="a scenario name (`smoke`) or a .toml path")
    pl.add_argument("--seed", type=int, help="default: the scenario's own")
    pl.add_argument("--limit", type=int, default=50, help="fault windows to print (default 50)")
    pl.add_argument("--json", action="store_true", help="the whole plan as JSON")
    pl.set_defaults(func=_call("plan"))

    ck = dsub.add_parser("check", help="judge a recorded run directory and write its report",
                         description="Check invariants I1-I9 and validity from a run directory's files (run.json, "
                         "effects.jsonl, etcd-watch.jsonl, ops.jsonl, faults.jsonl, logs/) and write report.md, "
                         "report.json and timeline.png. Exit 0 pass, 1 fail, 3 invalid, 2 bad input.")
    ck.add_argument("--history", required=True, metavar="DIR", help="the recorded run directory")
    ck.add_argument("--report", metavar="DIR", help="where to write the report (default: the run directory)")
    ck.add_argument("--scenario", help="judge with this scenario's bounds instead of the run's scenario.toml")
    ck.set_defaults(func=_call("check"))

    rn = dsub.add_parser("run", help="run a drill on real processes, then judge it and write its report",
                         description="Start etcd, planners, workers and the effect sink, put the scenario's load "
                         "on them, inject its faults one at a time, record everything in the run directory, then "
                         "judge it (as `drill check`). Exit 0 pass, 1 fail, 3 invalid, 2 bad input (also: a fault "
                         "this machine cannot make).")
    rn.add_argument("scenario", help="a scenario name (`smoke`) or a .toml path")
    rn.add_argument("--seed", type=int, help="default: the scenario's own")
    rn.add_argument("--duration", type=float, metavar="SECONDS", help="override the scenario's duration")
    rn.add_argument("--report", metavar="DIR", help="where the run and its report go (default: a new directory "
                    "under ./drill-runs/)")
    rn.add_argument("--links", choices=("proxy", "direct"), default="proxy",
                    help="planner<->etcd links: through a fault proxy per planner (default; needed by every "
                    "link fault) or direct")
    rn.add_argument("--network", choices=("auto", "loopback", "netns"), default="auto",
                    help="where nodes run: a Linux network namespace per node (netns: root, iproute2, iptables), "
                    "or everything on 127.0.0.1 (loopback); auto (default): netns where it can be made, else "
                    "loopback")
    rn.set_defaults(func=_call("run"))

    ob = dsub.add_parser("observe", help="judge a drill on a cluster the harness did not start (staging)",
                         description="Record a running cluster's keys and its etcd history for the window, run an "
                         "effect sink for the scenario's schedules (created through --api, unless --no-load), make "
                         "the scenario's operations, make its faults with its [faults.commands] (or record the faults "
                         "the operator marks with `drill mark`); then judge the window. Exit 0 pass, 1 fail, "
                         "3 invalid, 2 bad input.")
    ob.add_argument("scenario", help="the scenario whose load, operations and bounds to use")
    ob.add_argument("--etcd-endpoints", required=True, metavar="LIST", help="the cluster's etcd, comma-separated")
    ob.add_argument("--etcd-prefix", required=True, help="the cluster's key prefix")
    ob.add_argument("--api", default="", metavar="LIST", help="planner API addresses, comma-separated")
    ob.add_argument("--duration", type=float, required=True, metavar="SECONDS", help="the window to observe")
    ob.add_argument("--lease-ttl", type=float, required=True, metavar="SECONDS", help="the planners' lease TTL")
    ob.add_argument("--sink-listen", default="127.0.0.1:0", metavar="HOST:PORT",
                    help="where the effect sink listens (the cluster's workers must reach it)")
    ob.add_argument("--no-load", action="store_true", help="create no schedules; judge the cluster's own")
    ob.add_argument("--seed", type=int, help="default: the scenario's own")
    ob.add_argument("--report", required=True, metavar="DIR", help="the run directory (must be empty)")
    ob.add_argument("--dry-run", action="store_true",
                    help="print the plan and the fault commands that would run, then exit (nothing is contacted)")
    ob.set_defaults(func=_call("observe"))

    mk = dsub.add_parser("mark", help="record a fault window in an observed run (start ... end)")
    mk.add_argument("run_dir", metavar="DIR", help="the observed run's directory")
    mk.add_argument("action", choices=("start", "end"))
    mk.add_argument("fault", nargs="?", default="", help="start: the fault type (F1..F12)")
    mk.add_argument("target", nargs="?", default="", help="start: what it hit (a node, a region)")
    mk.add_argument("--index", type=int, help="end: which window (default: the last one open)")
    mk.set_defaults(func=_call("mark"))


def _call(name: str) -> Callable[[argparse.Namespace], int]:
    def go(args: argparse.Namespace) -> int:
        from chaos import cli  # lazy: see the module docstring

        return int(getattr(cli, name)(args))

    return go
