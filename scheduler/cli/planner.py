"""`schedctl planner`: run one planner node until SIGTERM/SIGINT (then hand partitions over)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import signal
import sys
from typing import Any

from prometheus_client import ProcessCollector
from prometheus_client.registry import CollectorRegistry

from scheduler import logs
from scheduler._gen.scheduler.v1 import cluster_pb2 as cpb
from scheduler.cli.common import client_parent, enum_name, print_json, run_call
from scheduler.cli.output import Exit, fail_invalid
from scheduler.client import SchedulerClient
from scheduler.clock import SYSTEM_CLOCK
from scheduler.config import CoordinationSettings, EtcdSettings, parse_listen_address
from scheduler.errors import InvalidArgument
from scheduler.metrics.http import MetricsServer
from scheduler.node import PlannerNode, etcd_client
from scheduler.planner.ownership import ClusterMismatch
from scheduler.planner.settings import PlannerSettings
from scheduler.server import start_server
from scheduler.store.keyspace import Keyspace

log = logging.getLogger("scheduler.cli.planner")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_settings_flags(p: argparse.ArgumentParser, *classes: type[Any]) -> None:
    """One flag per settings field; values stay None unless given, so env and TOML can fill them."""
    for cls in classes:
        for f in dataclasses.fields(cls):
            kind = "comma-separated list" if "tuple" in str(f.type) else "value"
            p.add_argument(_flag(f.name), dest=f.name, default=None, metavar=f.name.upper(),
                           help=f"{kind}; env SCHED_{f.name.upper()}")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("planner", help="run one planner node",
                       description="Run one planner node. Settings: flags, then SCHED_* variables, then --config.")
    p.add_argument("--config", metavar="FILE", help="TOML file with settings (flat keys, as the flag names)")
    p.add_argument("--log-level", default="info")
    add_settings_flags(p, EtcdSettings, CoordinationSettings, PlannerSettings)
    p.set_defaults(func=run)
    # `schedctl planner drain NODE` is an optional sub-action: without it, `schedctl planner [flags]`
    # runs a planner exactly as before.
    actions = p.add_subparsers(dest="action", required=False, metavar="[drain]")
    d = actions.add_parser("drain", parents=[client_parent()],
                           help="tell a running planner to hand its partitions over",
                           description="Tell planner NODE_ID (through any node's API) to hand its partitions over "
                                       "and stop claiming; it keeps serving the API.")
    d.add_argument("node_id", metavar="NODE_ID")
    d.add_argument("--reason", default="")
    d.set_defaults(func=_drain)


def _drain(args: argparse.Namespace) -> int:
    async def body(c: SchedulerClient) -> int:
        info = await c.drain_planner(args.node_id, reason=args.reason)
        if args.json:
            print_json(info)
        else:
            liveness = enum_name(cpb.PlannerLiveness, info.liveness, "PLANNER_LIVENESS_")
            print(f"{info.node_id} ({info.region}): {liveness}")
        return Exit.OK
    return run_call(args, body)


def _names(cls: type[Any]) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


def run(args: argparse.Namespace) -> int:
    flags = vars(args)
    classes = (EtcdSettings, CoordinationSettings, PlannerSettings)
    every = frozenset().union(*(_names(c) for c in classes))
    try:
        etcd, coord, planner = (
            c.load({k: flags[k] for k in _names(c)}, toml_file=args.config, shared_keys=every - _names(c))
            for c in classes
        )
    except InvalidArgument as e:
        return fail_invalid(e)
    logs.setup(args.log_level)
    try:
        return asyncio.run(_main(etcd, coord, planner))  # type: ignore[arg-type]
    except InvalidArgument as e:  # found only when acting on it (an address already in use)
        return fail_invalid(e)
    except ClusterMismatch as e:
        print(f"schedctl: {e}", file=sys.stderr)
        return Exit.INVALID


async def _main(etcd: EtcdSettings, coord: CoordinationSettings, planner: PlannerSettings) -> int:
    kv = etcd_client(etcd, coord.rpc_timeout)
    # Bind first: the address workers should dial is registered with the node's membership.
    node = PlannerNode(kv, Keyspace(etcd.etcd_prefix), coord, SYSTEM_CLOCK, planner=planner)
    metrics = await serve_metrics(node.metrics.registry, planner.metrics_address)  # first: fails fast
    dispatcher = node.make_dispatcher()  # heartbeat timing from the planner settings
    schedules, admin = node.make_api()
    server, port = await start_server(dispatcher, planner.api_host, planner.api_port, schedules=schedules,
                                      admin=admin)
    if not coord.api_address:
        node.advertise(f"{planner.api_host}:{port}")
    log.info("serving", extra={"event": "serving", "address": f"{planner.api_host}:{port}"})
    task = asyncio.create_task(node.run())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait([task, stopper], return_when=asyncio.FIRST_COMPLETED)
    if stop.is_set():
        with contextlib.suppress(Exception):
            await asyncio.wait_for(node.ownership.drain(), timeout=coord.lease_ttl)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await server.stop(grace=1.0)
    if metrics is not None:
        await metrics.stop()
    await kv.close()
    return Exit.OK


async def serve_metrics(registry: CollectorRegistry, address: str) -> MetricsServer | None:
    """Serve `/metrics` when `metrics_address` is set (it was validated with the settings)."""
    where = parse_listen_address("metrics_address", address)
    if where is None:
        return None
    # Process metrics (CPU, memory, open files) too, on this process's registry only.
    ProcessCollector(registry=registry)
    server = MetricsServer(registry)
    try:
        port = await server.start(*where)
    except OSError as e:
        raise InvalidArgument("metrics_address", f"cannot listen on {address}: {e.strerror or e}") from None
    log.info("metrics serving", extra={"event": "metrics_serving", "address": f"{where[0]}:{port}"})
    return server
