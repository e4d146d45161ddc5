"""`schedctl planner`: run one planner node until SIGTERM/SIGINT (then hand partitions over)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import signal
import sys
from typing import TYPE_CHECKING, Any

from scheduler import eventloop, logs
from scheduler._gen.scheduler.v1 import cluster_pb2 as cpb
from scheduler.cli.common import client_parent, enum_name, print_json, run_call
from scheduler.cli.output import Exit, fail_invalid
from scheduler.cli.settings_help import DEFAULT_TEXT, HELP
from scheduler.client import SchedulerClient
from scheduler.clock import SYSTEM_CLOCK
from scheduler.config import CoordinationSettings, EtcdSettings, TlsSettings, parse_listen_address, refuse_plaintext
from scheduler.errors import InvalidArgument
from scheduler.planner.settings import PlannerSettings, refuse_open_api

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

    from scheduler.metrics.http import MetricsServer
    from scheduler.tls import Dialer, ServerTls

# The planner itself (scheduler.node: the engine, etcd, gRPC servers, aiohttp for /metrics) is imported by
# the functions that run it, not here: every schedctl command imports this module for its flags, and
# those imports are most of a second of start-up (`schedctl --help` 1.6 s before).

log = logging.getLogger("scheduler.cli.planner")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


_GROUPS = {"EtcdSettings": "etcd", "CoordinationSettings": "coordination (sessions, partitions, timing)",
           "PlannerSettings": "planner loop, API and retention", "WorkerSettings": "worker",
           "TlsSettings": "TLS (API port, worker streams, peers; docs/operations.md, \"Security\")"}
UNSAFE_TITLE = "UNSAFE, FOR TESTS ONLY (they switch off safety checks; never set them in production)"


def _default_text(f: dataclasses.Field[Any]) -> str:
    if f.name in DEFAULT_TEXT:
        return DEFAULT_TEXT[f.name]
    d = f.default
    if d is None or d == "":
        return "unset"
    if isinstance(d, tuple):
        return ",".join(str(x) for x in d)
    if isinstance(d, bool):
        return str(d).lower()
    return f"{d:_}".replace("_", ",") if isinstance(d, int) and d >= 10_000 else str(d)


def add_settings_flags(p: argparse.ArgumentParser, *classes: type[Any]) -> None:
    """One flag per settings field, grouped by settings class, with its meaning, unit and default; values
    stay None unless given, so env and TOML can fill them. `unsafe_*` switches go in their own group,
    labelled as test-only."""
    unsafe: list[tuple[dataclasses.Field[Any], str]] = []
    for cls in classes:
        group = p.add_argument_group(_GROUPS.get(cls.__name__, cls.__name__))
        for f in dataclasses.fields(cls):
            text = f"{HELP.get(f.name, f.name.replace('_', ' '))} (default: {_default_text(f)}; " \
                   f"env SCHED_{f.name.upper()})"
            if f.name.startswith("unsafe_"):
                unsafe.append((f, text))
                continue
            # A bool setting works as a bare switch too (`--allow-shell`, `--insecure`) as well as with a value.
            extra: dict[str, Any] = {"nargs": "?", "const": "true"} if "bool" in str(f.type) else {}
            group.add_argument(_flag(f.name), dest=f.name, default=None, metavar=_metavar(f), help=text, **extra)
    if unsafe:  # last, under their own heading
        group = p.add_argument_group(UNSAFE_TITLE)
        for f, text in unsafe:
            group.add_argument(_flag(f.name), dest=f.name, default=None, metavar=_metavar(f), help=text)


def _metavar(f: dataclasses.Field[Any]) -> str:
    t = str(f.type)
    if "tuple" in t:
        return "LIST"
    if "bool" in t:
        return "BOOL"
    if "float" in t or "int" in t:
        return "N"
    return f.name.upper()


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "planner", help="run one planner node (or drain/undrain one)",
        description="Run one planner node: it serves the API, owns its share of the partitions and dispatches to "
                    "workers. Every setting comes from its flag, else its SCHED_* variable, else --config "
                    "(TOML, flat keys named like the flags with underscores), else the default shown. "
                    "`schedctl planner drain|undrain NODE_ID` steer a running planner instead.")
    p.add_argument("--config", metavar="FILE", help="TOML file with settings (flat keys, as the flag names)")
    p.add_argument("--log-level", default="info", help="debug, info, warning or error (default: info)")
    add_settings_flags(p, EtcdSettings, CoordinationSettings, PlannerSettings, TlsSettings)
    p.set_defaults(func=run)
    # `schedctl planner drain NODE` is an optional sub-action: without it, `schedctl planner [flags]`
    # runs a planner exactly as before.
    actions = p.add_subparsers(dest="action", required=False, metavar="[drain|undrain]")
    d = actions.add_parser("drain", parents=[client_parent()],
                           help="tell a running planner to hand its partitions over",
                           description="Tell planner NODE_ID (through any node's API) to hand its partitions over "
                                       "and stop claiming; it keeps serving the API. Refused (exit 4) when no "
                                       "other live planner would be left to own partitions, unless --force. "
                                       "Undo with `schedctl planner undrain NODE_ID` (a restart also ends it).")
    d.add_argument("node_id", metavar="NODE_ID")
    d.add_argument("--reason", default="")
    d.add_argument("--force", action="store_true",
                   help="drain even the last planner: every partition stops being planned until an undrain")
    d.set_defaults(func=_drain)
    u = actions.add_parser("undrain", parents=[client_parent()],
                           help="withdraw a drain: the planner claims its share of partitions again",
                           description="Withdraw the drain request of planner NODE_ID: it counts as eligible "
                                       "again and claims its share of the partitions.")
    u.add_argument("node_id", metavar="NODE_ID")
    u.set_defaults(func=_undrain)


def _undrain(args: argparse.Namespace) -> int:
    async def body(c: SchedulerClient) -> int:
        info = await c.undrain_planner(args.node_id)
        if args.json:
            print_json(info)
        else:
            liveness = enum_name(cpb.PlannerLiveness, info.liveness, "PLANNER_LIVENESS_")
            print(f"{info.node_id} ({info.region or '-'}): {liveness}")
        return Exit.OK
    return run_call(args, body)


def _drain(args: argparse.Namespace) -> int:
    async def body(c: SchedulerClient) -> int:
        info = await c.drain_planner(args.node_id, reason=args.reason, force=args.force)
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
    classes = (EtcdSettings, CoordinationSettings, PlannerSettings, TlsSettings)
    every = frozenset().union(*(_names(c) for c in classes))
    try:
        etcd, coord, planner, tls = (
            c.load({k: flags[k] for k in _names(c)}, toml_file=args.config, shared_keys=every - _names(c))
            for c in classes
        )
        assert isinstance(planner, PlannerSettings) and isinstance(tls, TlsSettings)
        # No auth off loopback first: the graver of the two (anyone may do anything), then plaintext.
        refuse_open_api(planner.api_host, planner.auth_file, insecure=tls.insecure)
        check_transport(etcd, planner, tls)  # type: ignore[arg-type]
    except InvalidArgument as e:
        return fail_invalid(e)
    logs.setup(args.log_level)
    from scheduler.loop_lag import tune_collector
    from scheduler.planner.ownership import ClusterMismatch

    tune_collector(planner.gc_threshold)

    try:
        return eventloop.run(_main(etcd, coord, planner, tls), planner.event_loop)  # type: ignore[arg-type]
    except InvalidArgument as e:  # found only when acting on it (an address already in use)
        return fail_invalid(e)
    except ClusterMismatch as e:
        print(f"schedctl: {e}", file=sys.stderr)
        return Exit.INVALID


def check_transport(etcd: EtcdSettings, planner: PlannerSettings, tls: TlsSettings) -> None:
    """Plaintext only on loopback unless `insecure` (docs/operations.md, "Security")."""
    refuse_plaintext("API", planner.api_host, "api_host", secure=tls.enabled, insecure=tls.insecure)
    etcd_tls = etcd.etcd_ca_file is not None or etcd.etcd_cert_file is not None
    for i, endpoint in enumerate(etcd.etcd_endpoints):
        refuse_plaintext("etcd connection", endpoint, f"etcd_endpoints[{i}]", secure=etcd_tls, insecure=tls.insecure)


def warn_plaintext(planner: PlannerSettings, tls: TlsSettings) -> None:
    if not tls.enabled:  # once, at start
        log.warning("the API serves plaintext (no tls_cert_file)%s",
                    " on a non-loopback address: insecure = true" if tls.insecure else " on loopback",
                    extra={"event": "plaintext", "api_host": planner.api_host})


def server_tls(tls: TlsSettings) -> ServerTls | None:
    from scheduler.tls import ServerTls

    if not tls.enabled:
        return None
    assert tls.tls_cert_file is not None and tls.tls_key_file is not None
    return ServerTls(tls.tls_cert_file, tls.tls_key_file, tls.tls_ca_file,
                     require_client_cert=tls.tls_require_client_cert)


def peer_dialer(tls: TlsSettings) -> Dialer:
    """Peers are dialled with this planner's own certificate (server and client usage) and CA bundle."""
    from scheduler.tls import Dialer, client_tls

    if not tls.enabled:
        return Dialer()
    return Dialer(client_tls(tls.tls_ca_file, tls.tls_cert_file, tls.tls_key_file, tls.tls_server_name))


async def _main(etcd: EtcdSettings, coord: CoordinationSettings, planner: PlannerSettings, tls: TlsSettings) -> int:
    from scheduler.node import PlannerNode, etcd_client
    from scheduler.server import start_server
    from scheduler.store.keyspace import Keyspace
    from scheduler.tasks import cancel_and_wait

    warn_plaintext(planner, tls)
    kv = etcd_client(etcd, coord.rpc_timeout)
    # Bind first: the address workers should dial is registered with the node's membership.
    node = PlannerNode(kv, Keyspace(etcd.etcd_prefix), coord, SYSTEM_CLOCK, planner=planner,
                       peers=peer_dialer(tls))
    from scheduler.cli.worker import serve_health

    metrics = await serve_metrics(node.metrics.registry, planner.metrics_address)  # first: fails fast
    health = await serve_health(planner.health_address)  # plaintext, health only: for probes
    dispatcher = node.make_dispatcher()  # heartbeat timing from the planner settings
    schedules, admin = node.make_api()
    server, port = await start_server(dispatcher, planner.api_host, planner.api_port, schedules=schedules,
                                      admin=admin, tls=server_tls(tls), interceptors=[node.security.interceptor])
    if not coord.api_address:
        node.advertise(f"{planner.api_host}:{port}")
    log.info("serving", extra={"event": "serving", "address": f"{planner.api_host}:{port}",
                               "tls": "mutual" if tls.enabled and tls.tls_require_client_cert else
                               "server" if tls.enabled else "off"})
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
    await cancel_and_wait(task)
    await server.stop(grace=1.0)
    if health is not None:
        await health.stop()
    if metrics is not None:
        await metrics.stop()
    await kv.close()
    return Exit.OK


async def serve_metrics(registry: CollectorRegistry, address: str) -> MetricsServer | None:
    """Serve `/metrics` when `metrics_address` is set (it was validated with the settings)."""
    where = parse_listen_address("metrics_address", address)
    if where is None:
        return None
    from prometheus_client import ProcessCollector

    from scheduler.metrics.http import MetricsServer

    # Process metrics (CPU, memory, open files) too, on this process's registry only.
    ProcessCollector(registry=registry)
    server = MetricsServer(registry)
    try:
        port = await server.start(*where)
    except OSError as e:
        raise InvalidArgument("metrics_address", f"cannot listen on {address}: {e.strerror or e}") from None
    log.info("metrics serving", extra={"event": "metrics_serving", "address": f"{where[0]}:{port}"})
    return server
